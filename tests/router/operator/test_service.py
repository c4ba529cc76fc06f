"""The operator service over the in-memory dead-letter store and real SQLite outboxes, and the
HTTP face's auth and error mapping on a real server over those in-memory parts. The same flows
against Kafka and Redis are in tests/router/operator/test_api.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pydantic import ValidationError

from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import (
    DeadLetter,
    Entry,
    LetterKind,
    MemoryDeadLetters,
    batch_letter_id,
    command_letter_id,
)
from consumers.runtime.types import TP
from router.operator.api import PAGE_POLICY
from router.operator.models import DeadLetterFilter
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.subscription import policy
from streams.clock import ManualClock
from streams.envelopes import Command, build, encode, format_time
from streams.errors import ActionFailed, BadInput, Conflict, NotFound, Unreachable
from streams.headers import ERROR, OPERATOR_RETRY, ORIGIN_OFFSET
from streams.outbox.store import RowState, RowUpdate
from streams.topology import queue_name, redelivery_topic
from tests.support.environment import make_settings
from tests.support.operator import running_server
from tests.support.outbox import append_all, drafts, outbox_for

TOKEN = "s3cret-operator-token-0123456789abcdef"
READ_TOKEN = "r3ad-operator-token-0123456789abcdef"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
WRITE = {"Authorization": f"Bearer {TOKEN}"}

Sent = tuple[str, int | None, bytes | None, bytes, list[tuple[str, bytes]]]


class Parts:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.clock = ManualClock()
        self.store = MemoryDeadLetters()
        self.sent: list[Sent] = []
        self.fail_sends = 0
        self.actions = DeadLetterActions(
            self.store,
            self.clock,
            self.send,
            lambda slug: redelivery_topic(slug, settings.env),
            policy(settings, "ledger").redelivery_partition,
            lambda purpose: queue_name(purpose, settings.env),
        )
        self.service = OperatorService(settings, clock=self.clock, actions=self.actions)

    def send(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        if self.fail_sends:
            self.fail_sends -= 1
            raise ConnectionError("broker unavailable (injected)")
        self.sent.append((topic, partition, key, value, headers))

    def at(self, minutes: int) -> str:
        return format_time(self.clock.now() + timedelta(minutes=minutes))


def event_letter(parts: Parts, offset: int, *, minutes: int, sub: str = "ledger") -> DeadLetter:
    stream = parts.settings.topology.stream_names()[1]
    body = {"eventId": f"evt_{offset:032x}", "eventType": "task.completed", "drill": "fail"}
    return DeadLetter(
        id=batch_letter_id(sub, stream, 1, offset, "event-batch"),
        kind=LetterKind.EVENT_BATCH,
        source_topic=stream,
        source_partition=1,
        error="drill: event is marked to fail",
        error_type="DrillFailure",
        attempts=5,
        created_at=parts.at(minutes),
        entries=[
            Entry(
                offset=offset,
                value=orjson.dumps(body),
                key=b"proj-1",
                headers=[("traceparent", b"00-abc-def-01"), ("bin", b"\xff\xfe")],
                event_id=body["eventId"],
                event_type="task.completed",
                project_id="proj-1",
            )
        ],
        subscription=sub,
    )


def poison_letter(parts: Parts, *, minutes: int) -> DeadLetter:
    stream = parts.settings.topology.stream_names()[0]
    return DeadLetter(
        id=batch_letter_id("ledger", stream, 0, 7, "poison"),
        kind=LetterKind.POISON,
        source_topic=stream,
        source_partition=0,
        error="not JSON",
        error_type="EnvelopeError",
        attempts=1,
        created_at=parts.at(minutes),
        entries=[Entry(offset=7, value=b"\x00\x01not json")],
        subscription="ledger",
    )


def command_letter(parts: Parts, n: int, *, minutes: int) -> tuple[DeadLetter, bytes]:
    command = build(
        Command,
        command_id=f"cmd_task-{n}_ready",
        command_type="agent.wake",
        project_id="proj-2",
        task_id=f"task-{n}",
        created_at=parts.clock.now(),
        payload={"agent": "a1"},
    )
    raw = encode(command, max_bytes=parts.settings.max_envelope_bytes)
    letter = DeadLetter(
        id=command_letter_id(command.command_id),
        kind=LetterKind.COMMAND,
        source_topic=queue_name("dead-letter", parts.settings.env),
        source_partition=0,
        error="worker failed 4 times",
        error_type="WorkerError",
        attempts=4,
        created_at=parts.at(minutes),
        entries=[
            Entry(
                offset=n,
                value=raw,
                key=b"proj-2",
                # A header of ours and a legacy one (the store's topic wrote dlq.* names).
                headers=[(ERROR, b"boom"), ("dlq.origin_queue", b"integration")],
            )
        ],
        origin_queue="integration",
        command_id=command.command_id,
    )
    return letter, raw


@pytest.fixture
def parts() -> Parts:
    p = Parts(
        make_settings(operator_token=TOKEN, operator_read_token=READ_TOKEN, operator_page_size=50)
    )
    p.store.write([event_letter(p, 3, minutes=1), poison_letter(p, minutes=2)])
    p.store.write([command_letter(p, 1, minutes=3)[0]])
    return p


# -- listing and showing ---------------------------------------------------------------------------
def test_listing_is_newest_first_and_filters_by_status_kind_subscription_and_queue(
    parts: Parts,
) -> None:
    s = parts.service
    listed = s.list_dead_letters()
    assert [d.kind for d in listed.items] == ["command", "poison", "event-batch"]
    assert (listed.matched, listed.truncated) == (3, False)
    assert [d.kind for d in s.list_dead_letters(kind="command").items] == ["command"]
    assert [d.kind for d in s.list_dead_letters(subscription="ledger").items] == [
        "poison",
        "event-batch",
    ]
    assert [d.origin_queue for d in s.list_dead_letters(queue="integration").items] == [
        "integration"
    ]
    assert s.list_dead_letters(queue="release").items == []
    limited = s.list_dead_letters(limit=1)
    assert len(limited.items) == 1 and limited.matched == 3
    assert s.list_dead_letters(status="dismissed").items == []


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"status": "closed"}, "status"),
        ({"kind": "batch"}, "kind"),
        ({"queue": "nowhere"}, "queue"),
        ({"subscription": "Not A Slug"}, "subscription"),
        ({"limit": 0}, "limit"),
        ({"limit": 51}, "limit"),
    ],
)
def test_bad_listing_arguments_are_refused_naming_the_field(
    parts: Parts, arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadInput) as refused:
        parts.service.list_dead_letters(**arguments)
    assert refused.value.field == field and str(next(iter(arguments.values()))) in str(
        refused.value
    )


def test_the_queue_filter_takes_the_settings_queues() -> None:
    parts = Parts(
        make_settings(operator_token=TOKEN, operator_read_token=READ_TOKEN, queues={"payments": {}})
    )
    letter, _ = command_letter(parts, 1, minutes=1)
    parts.store.write([dataclasses.replace(letter, origin_queue="payments")])
    s = parts.service
    assert [d.origin_queue for d in s.list_dead_letters(queue="payments").items] == ["payments"]
    assert s.list_dead_letters(queue="integration").items == []
    chosen = DeadLetterFilter(queue="payments")
    done = s.bulk_dismiss(chosen, dry_run=True, operator="carol", reason="test")
    assert [row.id for row in done.letters] == [letter.id]
    with pytest.raises(BadInput) as refused:
        s.list_dead_letters(queue="paymnts")
    assert refused.value.field == "queue"
    assert "unknown queue 'paymnts'; known: agent-wakeups, " in str(refused.value)
    assert "dead-letter, payments (a queue of your own" in str(refused.value)
    with _client(parts) as http:
        found = http.get("/api/dead-letters", params={"queue": "payments"}, headers=READ)
        assert found.status_code == 200 and len(found.json()["items"]) == 1
        for name in ("paymnts", "Pay_ments", "x" * 41):
            refused_http = http.get("/api/dead-letters", params={"queue": name}, headers=READ)
            assert refused_http.status_code == 422, name
        bulk = {"filter": {"queue": "payments"}, "dry_run": True, "reason": "test"}
        dry = http.post("/api/dead-letters/dismiss", json=bulk, headers=WRITE)
        assert dry.status_code == 200 and dry.json()["matched"] == 1
        # The document states the settings' queues, so a client knows the closed set.
        document = http.get("/openapi.json").json()
        (param,) = [
            p for p in document["paths"]["/api/dead-letters"]["get"]["parameters"]
            if p["name"] == "queue"
        ]  # fmt: skip
        assert "|payments)$" in orjson.dumps(param).decode()


def test_listing_since_a_time_or_a_duration_back(parts: Parts) -> None:
    s = parts.service
    # The fixture's letters were created 1, 2 and 3 minutes after the clock's now.
    assert [d.kind for d in s.list_dead_letters(since=parts.at(2)).items] == ["command", "poison"]
    parts.clock.advance(600)
    assert [d.kind for d in s.list_dead_letters(since="8m").items] == ["command", "poison"]
    assert [d.kind for d in s.list_dead_letters(since="1m").items] == []
    with pytest.raises(BadInput) as refused:
        s.list_dead_letters(since="last tuesday")
    assert refused.value.field == "since" and "last tuesday" in str(refused.value)


def test_show_decodes_json_bytes_and_keeps_binary_ones_as_base64(parts: Parts) -> None:
    s = parts.service
    event = s.list_dead_letters(kind="event-batch").items[0]
    shown = s.dead_letter(event.id)
    (entry,) = shown.entries
    assert entry.value_is_json and entry.value_json["drill"] == "fail"
    assert entry.key == "proj-1" and entry.value_text is None
    assert [(h.name, h.text) for h in entry.headers] == [
        ("traceparent", "00-abc-def-01"),
        ("bin", None),
    ]
    poison = s.dead_letter(s.list_dead_letters(kind="poison").items[0].id)
    assert not poison.entries[0].value_is_json and poison.entries[0].value_json is None
    assert poison.entries[0].value_b64 == "AAFub3QganNvbg=="
    assert poison.entries[0].value_text == "\x00\x01not json"
    with pytest.raises(NotFound, match="dl_missing"):
        s.dead_letter("dl_missing")


# -- actions ---------------------------------------------------------------------------------------
def test_retry_of_a_command_sends_it_to_its_origin_queue_once(parts: Parts) -> None:
    letter, raw = command_letter(parts, 2, minutes=4)
    parts.store.write([letter])
    done = parts.service.retry(letter.id, who="ann", reason="worker fixed")
    assert done.dead_letter.status == "retried"
    assert queue_name("integration", parts.settings.env) in done.outcome
    ((topic, partition, key, value, headers),) = parts.sent
    assert (topic, partition, key, value) == (
        queue_name("integration", parts.settings.env),
        None,
        b"proj-2",
        raw,
    )
    assert headers == [(OPERATOR_RETRY, letter.id.encode())]  # the dead-letter headers dropped
    with pytest.raises(Conflict, match="already handled"):
        parts.service.retry(letter.id, who="bob")
    assert len(parts.sent) == 1
    audit = parts.service.dead_letter(letter.id).audit
    assert [(a.action, a.who, a.why) for a in audit] == [
        ("retrying", "ann", "worker fixed"),
        ("retried", "ann", "worker fixed"),
    ]


def test_retry_of_events_goes_to_the_subscriptions_redelivery_topic(parts: Parts) -> None:
    letter = event_letter(parts, 9, minutes=5, sub="project-view-projector")
    parts.store.write([letter])
    done = parts.service.retry(letter.id, who="ann")
    ((topic, partition, key, _, headers),) = parts.sent
    assert topic == redelivery_topic("project-view-projector", parts.settings.env)
    assert partition == policy(parts.settings, "x").redelivery_partition(TP(letter.source_topic, 1))
    assert key == b"proj-1" and (ORIGIN_OFFSET, b"9") in headers
    assert "redelivered to subscription project-view-projector" in done.outcome
    assert done.dead_letter.audit[-1].why == "operator retry"


def test_a_poison_letter_can_only_be_dismissed(parts: Parts) -> None:
    poison = parts.service.list_dead_letters(kind="poison").items[0]
    with pytest.raises(Conflict, match="only be dismissed"):
        parts.service.retry(poison.id, who="ann")
    assert parts.service.dead_letter(poison.id).status == "open" and not parts.sent
    done = parts.service.dismiss(poison.id, who="ann", reason="producer bug #12 fixed")
    assert done.dead_letter.status == "dismissed"
    assert done.dead_letter.last_action is not None
    assert done.dead_letter.last_action.why == "producer bug #12 fixed"


def test_a_failed_send_leaves_the_letter_open_for_another_retry(parts: Parts) -> None:
    letter = parts.service.list_dead_letters(kind="command").items[0]
    parts.fail_sends = 1
    with pytest.raises(ActionFailed, match="open again"):
        parts.service.retry(letter.id, who="ann")
    shown = parts.service.dead_letter(letter.id)
    assert shown.status == "open" and "send failed" in shown.audit[-1].why
    assert parts.service.retry(letter.id, who="ann").dead_letter.status == "retried"
    assert len(parts.sent) == 1


def test_dismiss_needs_a_reason_and_a_name_and_happens_once(parts: Parts) -> None:
    letter = parts.service.list_dead_letters(kind="event-batch").items[0]
    with pytest.raises(BadInput) as no_reason:
        parts.service.dismiss(letter.id, who="ann", reason="   ")
    assert no_reason.value.field == "reason"
    with pytest.raises(BadInput) as no_name:
        parts.service.dismiss(letter.id, who="", reason="duplicate of an applied event")
    assert no_name.value.field == "who"
    with pytest.raises(BadInput) as too_long:
        parts.service.dismiss(letter.id, who="ann", reason="x" * 2001)
    assert too_long.value.field == "reason" and "2001" in str(too_long.value)
    parts.service.dismiss(letter.id, who="ann", reason="duplicate of an applied event")
    with pytest.raises(Conflict, match="dismissed by ann"):
        parts.service.dismiss(letter.id, who="bob", reason="again")
    with pytest.raises(Conflict, match="already handled"):
        parts.service.retry(letter.id, who="bob")
    assert [d.id for d in parts.service.list_dead_letters(status="dismissed").items] == [letter.id]
    assert not parts.sent


# -- outboxes --------------------------------------------------------------------------------------
def _outbox_with_a_failed_row(settings: Settings, path: Path) -> str:
    store = outbox_for(settings, path)
    append_all(store, drafts("proj-a", 3) + drafts("proj-b", 2))
    head = next(r for r in store.sendable(3, 100, None) if r.project_id == "proj-a" and r.slot == 1)
    store.apply(
        [RowUpdate(head.event_id, RowState.FAILED, 10, 0, None, "MSG_SIZE_TOO_LARGE", None)]
    )
    store.close()
    return head.event_id


def test_outboxes_absent_present_and_unreadable(tmp_path: Path) -> None:
    good, missing, broken = tmp_path / "o.sqlite", tmp_path / "none.sqlite", tmp_path / "bad.sqlite"
    broken.write_bytes(b"this is not a database" * 100)
    p = Parts(make_settings(operator_outboxes=[str(good), str(missing), str(broken)]))
    failed = _outbox_with_a_failed_row(p.settings, good)
    present, absent, unreadable = p.service.outboxes()
    assert present.present and present.error is None
    assert (present.counts["pending"], present.counts["failed"], present.total) == (4, 1, 5)
    assert [(r.event_id, r.last_error) for r in present.failed_rows] == [
        (failed, "MSG_SIZE_TOO_LARGE")
    ]
    assert [(h.project_id, h.failed_slot, h.rows_waiting) for h in present.held_projects] == [
        ("proj-a", 1, 2)
    ]
    assert (absent.outbox, absent.present) == (str(missing), False)
    assert unreadable.present and unreadable.error
    assert [h.project_id for h in p.service.held_projects()] == ["proj-a"]
    p.store.write([event_letter(p, 1, minutes=1)])
    recent = p.service.recent_failures()
    assert [r.event_id for r in recent.outbox_failed_rows] == [failed]
    assert [d.kind for d in recent.dead_letters] == ["event-batch"]


def test_the_default_outbox_is_the_routers(tmp_path: Path) -> None:
    path = tmp_path / "router.sqlite"
    p = Parts(make_settings(router_outbox_path=str(path)))
    assert p.service.outbox_paths() == [path]
    assert [(o.outbox, o.present) for o in p.service.outboxes()] == [(str(path), False)]


# -- the HTTP face over the in-memory parts: auth and errors ---------------------------------------
@contextmanager
def _client(parts: Parts) -> Iterator[httpx.Client]:
    """The real server on a loopback port, over the in-memory parts."""
    with running_server(parts.service) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


@pytest.fixture
def http(parts: Parts) -> Iterator[httpx.Client]:
    with _client(parts) as client:
        yield client


def test_changes_need_the_operator_token(parts: Parts, http: httpx.Client) -> None:
    letter = parts.service.list_dead_letters(kind="command").items[0].id
    url = f"/api/dead-letters/{letter}/retry"
    body: dict[str, str] = {}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ):
        refused = http.post(url, json=body, headers=headers)
        assert refused.status_code == 401, headers
        assert refused.headers["www-authenticate"] == "Bearer"
        assert (
            "Authorization: Bearer" in refused.json()["reason"]
            or "not one of this server's operator tokens" in (refused.json()["reason"])
        )
    # Refused before the body is even read: a bad body without a token is still a 401.
    assert http.post(url, content=b"{nonsense").status_code == 401
    assert parts.service.dead_letter(letter).status == "open" and not parts.sent
    done = http.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert done.status_code == 200 and done.json()["dead_letter"]["status"] == "retried"
    # The audit names the token's operator (operator_token_name, "operator" by default).
    assert done.json()["dead_letter"]["last_action"]["who"] == "operator"
    again = http.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert again.status_code == 409 and "already handled" in again.json()["reason"]
    assert len(parts.sent) == 1


def test_with_no_token_configured_every_change_is_refused() -> None:
    p = Parts(make_settings())
    p.store.write([command_letter(p, 1, minutes=1)[0]])
    letter = p.service.list_dead_letters().items[0].id
    with _client(p) as client:
        for action, body in (("retry", {}), ("dismiss", {"reason": "r"})):
            refused = client.post(
                f"/api/dead-letters/{letter}/{action}",
                json=body,
                headers={"Authorization": "Bearer any-token"},
            )
            assert refused.status_code == 403
            assert "RHUMBATRON_OPERATOR_TOKEN" in refused.json()["reason"]
        assert client.get("/api/info").json()["mutations_enabled"] is False
    assert p.service.dead_letter(letter).status == "open" and not p.sent


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "field"),
    [
        ("get", "/api/dead-letters?status=closed", None, 422, "status"),
        ("get", "/api/dead-letters?limit=0", None, 422, "limit"),
        ("get", "/api/dead-letters?limit=51", None, 422, "limit"),
        ("get", "/api/dead-letters?subscription=Bad%20Slug", None, 422, "subscription"),
        ("get", "/api/projects/bad%01id/view", None, 422, "project_id"),
        ("post", "/api/dead-letters/{id}/dismiss", {}, 422, "reason"),
        ("post", "/api/dead-letters/{id}/dismiss", {"reason": " "}, 422, "reason"),
        # The audit names the token's operator: a body naming someone is refused.
        ("post", "/api/dead-letters/{id}/retry", {"who": "ann"}, 422, "who"),
        ("post", "/api/dead-letters/{id}/dismiss", {"who": "ann", "reason": "r"}, 422, "who"),
        ("post", "/api/dead-letters/{id}/retry", {"extra": 1}, 422, "extra"),
        ("post", "/api/dead-letters/{id}/retry", "not an object", 422, "body"),
        ("post", "/api/dead-letters/retry", {"filter": {"kind": "batch"}}, 422, "kind"),
        ("post", "/api/dead-letters/retry", {"filter": {"since": "yesterday"}}, 422, "since"),
        ("post", "/api/dead-letters/retry", {"filter": {"status": "retried"}}, 422, "status"),
        ("post", "/api/dead-letters/retry", {"filter": {"colour": "red"}}, 422, "colour"),
        ("post", "/api/dead-letters/dismiss", {"filter": {}}, 422, "reason"),
        ("post", "/api/dead-letters/dismiss", {"reason": "r", "who": "ann"}, 422, "who"),
        ("post", "/api/dead-letters/dl_nope/retry", {}, 404, None),
        ("get", "/api/dead-letters/dl_nope", None, 404, None),
        ("get", "/api/nowhere", None, 404, None),
        ("delete", "/api/dead-letters/{id}", None, 405, None),
    ],
)
def test_errors_are_json_with_a_reason(
    parts: Parts,
    http: httpx.Client,
    method: str,
    url: str,
    body: Any,
    status: int,
    field: str | None,
) -> None:
    letter = parts.service.list_dead_letters(kind="event-batch").items[0].id
    response = http.request(
        method.upper(),
        url.replace("{id}", letter),
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == status
    error = response.json()
    assert set(error) == {"reason", "field"} and error["reason"]
    assert error["field"] == field
    if "dl_nope" in url:
        assert "dl_nope" in error["reason"]
    if field == "who":
        assert "token" in error["reason"]
    assert parts.service.dead_letter(letter).status == "open"


def test_the_openapi_document_and_the_page(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    paths = document["paths"]
    assert set(paths) == {
        "/api/info",
        "/api/health",
        "/api/session",
        "/api/dead-letters",
        "/api/dead-letters/retry",
        "/api/dead-letters/dismiss",
        "/api/dead-letters/{letter_id}",
        "/api/dead-letters/{letter_id}/retry",
        "/api/dead-letters/{letter_id}/dismiss",
        "/api/failures",
        "/api/outboxes",
        "/api/held-projects",
        "/api/lag",
        "/api/fleet",
        "/api/projects/{project_id}/view",
        "/api/projects/{project_id}/feed",
    }
    secured = {
        (path, method)
        for path, operations in paths.items()
        for method, operation in operations.items()
        if operation.get("security")
    }
    # Every read of a payload needs a token too; only info and health are open.
    assert secured == {
        (path, method)
        for path, operations in paths.items()
        for method in operations
        if path not in ("/api/info", "/api/health")
    }
    # No request names who acts: the audit names the operator whose token made the call.
    shapes = document["components"]["schemas"]
    assert set(shapes["RetryRequest"]["properties"]) == {"reason"}
    assert set(shapes["DismissRequest"]["properties"]) == {"reason"}
    assert set(shapes["BulkRetryRequest"]["properties"]) == {"filter", "dry_run", "reason"}
    assert set(shapes["BulkDismissRequest"]["properties"]) == {"filter", "dry_run", "reason"}
    for name, statuses in (("RetryFilter", ["open", "retrying"]), ("DismissFilter", ["open"])):
        fields = shapes[name]["properties"]
        assert set(fields) == {"subscription", "kind", "queue", "status", "since"}
        # Only the statuses the action takes: the document offers none the call refuses.
        offered = [s.get("enum", [s.get("const")]) for s in fields["status"]["anyOf"]]
        assert offered == [statuses, [None]]
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-security-policy"] == PAGE_POLICY
    html = page.text
    assert 'id="dl-rows"' in html and "sessionStorage" in html
    # One file, nothing loaded from elsewhere.
    for marker in ("http://", "https://", "<script src", "<link"):
        assert marker not in html, marker
    assert http.get("/docs").status_code == 404  # the interactive docs would load a CDN


# -- who may read, and from which Host ---------------------------------------------------------------
PAYLOAD_READS = [
    "/api/dead-letters",
    "/api/dead-letters/{id}",
    "/api/failures",
    "/api/outboxes",
    "/api/held-projects",
    "/api/lag",
    "/api/projects/proj-1/view",
    "/api/projects/proj-1/feed",
]


@pytest.mark.parametrize("path", PAYLOAD_READS)
def test_a_payload_read_needs_the_read_or_the_write_token(
    parts: Parts, http: httpx.Client, path: str
) -> None:
    url = path.replace("{id}", parts.service.list_dead_letters().items[0].id)
    for headers in ({}, {"Authorization": "Bearer " + "x" * 40}, {"Authorization": READ_TOKEN}):
        refused = http.get(url, headers=headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json() == {"reason": refused.json()["reason"], "field": None}
        assert READ_TOKEN not in refused.text and TOKEN not in refused.text
    answer = 404 if "/projects/" in path else 200  # no view of proj-1 was built here
    assert http.get(url, headers=READ).status_code == answer
    assert http.get(url, headers=WRITE).status_code == answer


def test_a_change_with_the_read_token_is_forbidden(parts: Parts, http: httpx.Client) -> None:
    letter = parts.service.list_dead_letters(kind="command").items[0].id
    for url, body in (
        (f"/api/dead-letters/{letter}/retry", {}),
        (f"/api/dead-letters/{letter}/dismiss", {"reason": "r"}),
        ("/api/dead-letters/retry", {"filter": {}}),
        ("/api/dead-letters/retry", {"filter": {}, "dry_run": True}),
        ("/api/dead-letters/dismiss", {"filter": {}, "reason": "r"}),
    ):
        refused = http.post(url, json=body, headers=READ)
        assert refused.status_code == 403, url
        assert "read token" in refused.json()["reason"] and refused.json()["field"] is None
    assert parts.service.dead_letter(letter).status == "open" and not parts.sent


def test_the_token_is_checked_before_the_body_is_parsed(parts: Parts, http: httpx.Client) -> None:
    letter = parts.service.list_dead_letters(kind="command").items[0].id
    url = f"/api/dead-letters/{letter}/retry"
    json_type = {"Content-Type": "application/json"}
    bad = http.post(url, content=b"{nonsense", headers={**json_type, "Authorization": "Bearer x"})
    assert bad.status_code == 401 and bad.json()["field"] is None
    reader = http.post(url, content=b"{nonsense", headers={**json_type, **READ})
    assert reader.status_code == 403
    # With the right token the body's own refusal comes through.
    assert http.post(url, content=b"{nonsense", headers={**json_type, **WRITE}).status_code == 422


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/dead-letters"),
        ("get", "/api/health"),
        ("get", "/metrics"),
        ("get", "/"),
        ("post", "/api/dead-letters/dl_x/retry"),
    ],
)
def test_a_host_not_allowed_is_refused_before_anything_else(
    http: httpx.Client, method: str, path: str
) -> None:
    # What a DNS-rebinding page sends: its own name, resolved to our loopback address.
    refused = http.request(
        method.upper(), path, content=b"{nonsense", headers={"Host": "evil.example:8642"}
    )
    assert refused.status_code == 421, refused.text
    body = refused.json()
    assert set(body) == {"reason", "field"} and "evil.example" in body["reason"]


def test_the_bind_address_and_localhost_are_allowed_hosts(http: httpx.Client) -> None:
    port = http.base_url.port
    for host in (
        "127.0.0.1",
        f"127.0.0.1:{port}",
        "localhost",
        f"localhost:{port}",
        f"[::1]:{port}",
    ):
        answered = http.get("/api/dead-letters", headers={"Host": host, **READ})
        assert answered.status_code == 200, (host, answered.text)


def test_health_info_and_metrics_are_open_and_carry_no_payload_or_token(
    parts: Parts, http: httpx.Client
) -> None:
    payloads = [
        entry.value
        for item in parts.service.list_dead_letters().items
        for entry in parts.store.get(item.id).entries  # type: ignore[union-attr]
        if entry.value
    ]
    assert payloads
    for path in ("/api/health", "/api/info", "/metrics"):
        answered = http.get(path)
        assert answered.status_code in (200, 503), (path, answered.text)
        for secret in (TOKEN, READ_TOKEN):
            assert secret.encode() not in answered.content, path
        for value in payloads:
            assert value not in answered.content, path


def test_with_no_read_token_reads_need_the_write_token() -> None:
    p = Parts(make_settings(operator_token=TOKEN))
    with _client(p) as client:
        refused = client.get("/api/dead-letters", headers=READ)
        assert refused.status_code == 401
        assert client.get("/api/dead-letters", headers=WRITE).status_code == 200
    bare = Parts(make_settings())
    with _client(bare) as client:
        refused = client.get("/api/dead-letters", headers=READ)
        assert refused.status_code == 403
        assert "RHUMBATRON_OPERATOR_READ_TOKEN" in refused.json()["reason"]


# -- Kafka and Redis out of reach -------------------------------------------------------------------
def test_out_of_reach_kafka_and_redis_are_named_not_hidden() -> None:
    # Port 1 on loopback: nothing listens, every connection is refused at once.
    s = make_settings(
        kafka_bootstrap="127.0.0.1:1",
        redis_url="redis://127.0.0.1:1/0",
        connect_timeout_s=1.0,
        operator_health_timeout_s=1.0,
    )
    service = OperatorService(s)
    health = service.health()
    assert not health.ok and not health.kafka.ok and not health.redis.ok
    assert health.reason is not None and health.reason.count("127.0.0.1:1") >= 2
    with pytest.raises(Unreachable, match="Kafka at 127.0.0.1:1"):
        service.lag()
    with pytest.raises(Unreachable, match="Redis at 127.0.0.1:1"):
        service.list_dead_letters()
    with pytest.raises(Unreachable, match="Redis at 127.0.0.1:1"):
        service.project_view("proj-1")


# -- named operators -------------------------------------------------------------------------------
ALICE = "alice-token-0123456789abcdef0123456789"
BOB = "bob-token-0123456789abcdef0123456789abc"


def _named(**overrides: Any) -> Parts:
    p = Parts(
        make_settings(
            operator_token=TOKEN,
            operator_token_name="oncall",
            operator_tokens={"alice": ALICE, "bob": BOB},
            operator_read_token=READ_TOKEN,
            **overrides,
        )
    )
    p.store.write([event_letter(p, n, minutes=n) for n in (1, 2, 3)])
    return p


def test_each_operator_is_named_in_the_audit_by_their_own_token() -> None:
    p = _named()
    first, second, third = (d.id for d in p.service.list_dead_letters().items[::-1])
    with _client(p) as client:
        as_alice = {"Authorization": f"Bearer {ALICE}"}
        as_bob = {"Authorization": f"Bearer {BOB}"}
        assert client.post(f"/api/dead-letters/{first}/retry", json={}, headers=as_alice).is_success
        dismissed = client.post(
            f"/api/dead-letters/{second}/dismiss", json={"reason": "test data"}, headers=as_bob
        )
        assert dismissed.is_success
        assert client.post(f"/api/dead-letters/{third}/retry", json={}, headers=WRITE).is_success
        # The read token reads, and cannot act.
        refused = client.post(
            f"/api/dead-letters/{third}/dismiss", json={"reason": "r"}, headers=READ
        )
        assert refused.status_code == 403
        sessions = {
            name: client.get("/api/session", headers=headers).json()
            for name, headers in (("alice", as_alice), ("oncall", WRITE), ("read", READ))
        }
    assert [(a.action, a.who) for a in p.service.dead_letter(first).audit] == [
        ("retrying", "alice"),
        ("retried", "alice"),
    ]
    assert [(a.action, a.who, a.why) for a in p.service.dead_letter(second).audit] == [
        ("dismissed", "bob", "test data")
    ]
    assert {a.who for a in p.service.dead_letter(third).audit} == {"oncall"}
    assert sessions["alice"] == {
        "env": p.settings.env,
        "operator": "alice",
        "can_act": True,
        "read_only": False,
    }
    assert sessions["oncall"]["operator"] == "oncall" and sessions["oncall"]["can_act"]
    assert sessions["read"]["operator"] is None and not sessions["read"]["can_act"]
    assert not sessions["read"]["read_only"]


def test_operator_tokens_alone_make_the_server_writable_and_the_read_token_only_reads() -> None:
    p = Parts(make_settings(operator_tokens={"alice": ALICE}, operator_read_token=READ_TOKEN))
    p.store.write([event_letter(p, 1, minutes=1)])
    letter = p.service.list_dead_letters().items[0].id
    with _client(p) as client:
        assert client.get("/api/info").json()["mutations_enabled"] is True
        assert client.get("/api/session", headers=READ).json()["read_only"] is False
        done = client.post(
            f"/api/dead-letters/{letter}/retry",
            json={},
            headers={"Authorization": f"Bearer {ALICE}"},
        )
        assert done.json()["dead_letter"]["last_action"]["who"] == "alice"
    read_only = Parts(make_settings(operator_read_token=READ_TOKEN))
    with _client(read_only) as client:
        session = client.get("/api/session", headers=READ).json()
        assert session == {
            "env": read_only.settings.env,
            "operator": None,
            "can_act": False,
            "read_only": True,
        }
        assert client.get("/api/session").status_code == 401


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"operator_tokens": {"alice": "too-short"}}, "alice"),
        ({"operator_tokens": {"alice": ""}}, "alice"),
        ({"operator_tokens": {"al ice": ALICE}}, "al ice"),
        ({"operator_token_name": ""}, "operator name"),
        ({"operator_token": ALICE, "operator_tokens": {"alice": ALICE}}, "same token"),
        ({"operator_read_token": BOB, "operator_tokens": {"bob": BOB}}, "read token"),
        ({"operator_token": TOKEN, "operator_tokens": {"operator": BOB}}, "named twice"),
    ],
)
def test_operator_names_and_tokens_are_checked_when_the_settings_load(
    overrides: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        make_settings(**overrides)


# -- bulk actions ----------------------------------------------------------------------------------
def _mixed(**overrides: Any) -> Parts:
    """Letters of two subscriptions, a poison record and two commands, a minute apart."""
    p = Parts(make_settings(operator_token=TOKEN, operator_read_token=READ_TOKEN, **overrides))
    p.store.write(
        [
            event_letter(p, 1, minutes=1),
            event_letter(p, 2, minutes=2, sub="project-view-projector"),
            event_letter(p, 3, minutes=3),
            poison_letter(p, minutes=4),
            command_letter(p, 5, minutes=5)[0],
            command_letter(p, 6, minutes=6)[0],
        ]
    )
    return p


def _statuses(p: Parts) -> dict[str, str]:
    return {d.id: d.status for d in p.service.list_dead_letters().items}


def test_a_dry_run_lists_exactly_what_it_would_touch_and_touches_nothing() -> None:
    p = _mixed()
    before = _statuses(p)
    chosen = DeadLetterFilter(subscription="ledger")
    found = p.service.bulk_retry(chosen, dry_run=True, operator="ann")
    ledger = sorted(
        (d for d in p.service.list_dead_letters(subscription="ledger").items),
        key=lambda d: d.created_at,
    )
    events = [d.id for d in ledger if d.kind == "event-batch"]
    assert [(d.id, d.outcome) for d in found.letters if d.outcome != "skipped"] == [
        (i, "would retry") for i in events
    ]
    (poison,) = [d for d in found.letters if d.outcome == "skipped"]
    assert poison.kind == "poison" and "only be dismissed" in poison.detail
    assert (found.matched, found.acted, found.skipped, found.failed) == (3, 2, 1, 0)
    first = found.letters[0]
    assert (first.origin, first.error) == ("ledger", "drill: event is marked to fail")
    assert _statuses(p) == before and not p.sent
    assert all(not p.service.dead_letter(i).audit for i in before)


def test_a_bulk_retry_touches_exactly_the_filtered_letters_each_audited() -> None:
    p = _mixed()
    before = _statuses(p)
    found = p.service.bulk_retry(
        DeadLetterFilter(kind="command", queue="integration"),
        dry_run=False,
        operator="ann",
        reason="agent host back",
    )
    commands = [d.id for d in found.letters]
    assert len(commands) == 2 and (found.acted, found.skipped) == (2, 0)
    assert [d.outcome for d in found.letters] == ["retried", "retried"]
    assert len(p.sent) == 2
    after = _statuses(p)
    assert {i for i in after if after[i] != before[i]} == set(commands)
    for letter_id in commands:
        assert [(a.action, a.who, a.why) for a in p.service.dead_letter(letter_id).audit] == [
            ("retrying", "ann", "agent host back"),
            ("retried", "ann", "agent host back"),
        ]
    # Run again: nothing open matches any more.
    again = p.service.bulk_retry(DeadLetterFilter(kind="command"), dry_run=False, operator="ann")
    assert (again.matched, again.acted) == (0, 0) and len(p.sent) == 2


def test_a_bulk_dismiss_by_subscription_and_since() -> None:
    p = _mixed()
    found = p.service.bulk_dismiss(
        DeadLetterFilter(subscription="ledger", since=p.at(2)),
        dry_run=False,
        operator="ann",
        reason="test data",
    )
    # Since minute 2: the ledger's event at minute 3 and its poison record at minute 4.
    assert [d.kind for d in found.letters] == ["event-batch", "poison"]
    assert found.acted == 2 and all(d.outcome == "dismissed" for d in found.letters)
    p.clock.advance(600)
    recent = p.service.bulk_retry(DeadLetterFilter(since="6m"), dry_run=True, operator="ann")
    assert [d.kind for d in recent.letters] == ["command", "command"]  # minutes 5 and 6


class _Meanwhile(MemoryDeadLetters):
    """A store where another operator handles one letter right after a listing has read it."""

    def __init__(self, parts: Parts, letter_id: str) -> None:
        super().__init__()
        self.parts, self.letter_id = parts, letter_id

    def list(self, **kwargs: Any) -> list[DeadLetter]:
        found = super().list(**kwargs)
        if self.letter_id:
            self.parts.actions.dismiss(self.letter_id, who="bob", why="handled by hand")
            self.letter_id = ""
        return found


def test_a_letter_handled_by_someone_else_meanwhile_is_skipped_not_acted_twice() -> None:
    p = _mixed()
    target = event_letter(p, 3, minutes=3).id
    meanwhile = _Meanwhile(p, target)
    meanwhile.letters = p.store.letters
    p.actions.store = meanwhile
    found = p.service.bulk_retry(
        DeadLetterFilter(kind="event-batch"), dry_run=False, operator="ann"
    )
    skipped = {d.id: d.detail for d in found.letters if d.outcome == "skipped"}
    assert list(skipped) == [target] and "dismissed by bob" in skipped[target]
    assert (found.acted, found.skipped) == (2, 1)
    assert [a.who for a in p.service.dead_letter(target).audit] == ["bob"]
    assert len(p.sent) == 2


def test_a_bulk_call_acts_on_at_most_the_limit_and_stops_at_a_failed_send() -> None:
    p = _mixed(operator_bulk_limit=2)
    found = p.service.bulk_dismiss(
        DeadLetterFilter(), dry_run=False, operator="ann", reason="clean-up"
    )
    assert (found.matched, found.acted, found.untouched, found.limit) == (6, 2, 4, 2)
    assert found.untouched_reason is not None and "operator_bulk_limit" in found.untouched_reason
    assert [d.outcome for d in found.letters] == ["dismissed", "dismissed"]
    p.fail_sends = 1
    retried = p.service.bulk_retry(DeadLetterFilter(), dry_run=False, operator="ann")
    assert [d.outcome for d in retried.letters][:2] == ["failed", "skipped"]  # the poison record
    # The two commands are left: a send that failed would most likely fail for them too.
    assert (retried.failed, retried.acted, retried.untouched) == (1, 0, 2)
    assert retried.untouched_reason is not None and "stopped" in retried.untouched_reason
    assert not p.sent
    assert p.service.dead_letter(retried.letters[0].id).status == "open"


@pytest.mark.parametrize(
    ("chosen", "field"),
    [
        ({"status": "retried"}, "status"),
        ({"status": "dismissed"}, "status"),
        ({"since": "two hours"}, "since"),
        ({"since": "0h"}, "since"),
        ({"subscription": "Not A Slug"}, "subscription"),
    ],
)
def test_a_bad_bulk_filter_is_refused_naming_the_field(chosen: dict[str, str], field: str) -> None:
    p = _mixed()
    with pytest.raises((BadInput, ValidationError)) as refused:
        p.service.bulk_retry(DeadLetterFilter(**chosen), dry_run=True, operator="ann")
    error = refused.value
    if isinstance(error, BadInput):
        assert error.field == field
    else:
        assert isinstance(error, ValidationError) and error.errors()[0]["loc"][0] == field
    assert not p.sent


def test_the_bulk_api_names_the_tokens_operator_and_dry_runs_need_an_operator() -> None:
    p = _mixed()
    with _client(p) as client:
        dry = client.post(
            "/api/dead-letters/dismiss",
            json={"filter": {"kind": "command"}, "dry_run": True, "reason": "gone"},
            headers=WRITE,
        )
        assert dry.status_code == 200, dry.text
        assert dry.json()["operator"] == "operator" and dry.json()["acted"] == 2
        assert all(d["outcome"] == "would dismiss" for d in dry.json()["letters"])
        assert not any(p.service.dead_letter(d["id"]).audit for d in dry.json()["letters"])
        done = client.post(
            "/api/dead-letters/dismiss",
            json={"filter": {"kind": "command"}, "reason": "gone"},
            headers=WRITE,
        )
        assert [d["outcome"] for d in done.json()["letters"]] == ["dismissed", "dismissed"]
    for d in done.json()["letters"]:
        assert [(a.who, a.why) for a in p.service.dead_letter(d["id"]).audit] == [
            ("operator", "gone")
        ]


@pytest.mark.integration
def test_a_postgresql_outbox_is_reported_by_its_url_without_the_password(tmp_path: Path) -> None:
    from tests.support.outbox import OutboxBackend

    pg = OutboxBackend("postgres", tmp_path)
    try:
        append_all(pg.store(), drafts("proj-a", 2))
        p = Parts(make_settings(operator_outboxes=[pg.address, str(tmp_path / "absent.sqlite")]))
        assert p.service.outbox_paths() == [pg.address, tmp_path / "absent.sqlite"]
        found, absent = p.service.outboxes()
        assert found.present and found.error is None and found.counts["pending"] == 2
        assert found.outbox == pg.store().location != pg.address
        assert not absent.present
    finally:
        pg.close()
