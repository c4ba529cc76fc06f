"""The operator HTTP API on a real server (uvicorn in a thread) over the real broker and Redis.

One environment for the module: drill events dead-lettered for real by the ``flaky-ledger``
subscription (one letter per project, each project on its own partition), the
project-view-projector run by the real CLI, a command dead letter written through the real
dead-letter store (as the dead-letter consumer writes one), and an outbox with a failed row.
"""

from __future__ import annotations

import secrets
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
import hypothesis
import orjson
import pytest
import schemathesis
from pydantic import SecretStr
from schemathesis.core.result import Ok

from consumers.redis_conn import connect
from consumers.runtime.dead_letters import DeadLetter
from router.operator.service import OperatorService
from router.settings import Settings
from streams.envelopes import Event
from streams.headers import OPERATOR_RETRY, is_ours
from streams.outbox.store import RowState, RowUpdate
from streams.topology import queue_name
from streams.workload import slotted_events, workload
from tests.support.environment import cleanup_environment, make_settings
from tests.support.kafka import read_all
from tests.support.operator import running_server, write_command_letter
from tests.support.outbox import append_all, drafts, outbox_for
from tests.support.runtime_processes import (
    cli,
    publish,
    run,
    runtime_settings,
    start_consume_cli,
)

pytestmark = pytest.mark.integration

TOKEN = "op-" + secrets.token_hex(16)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_TOKEN = "read-" + secrets.token_hex(16)
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
# Two more operators, each with a token of their own: the audit names whoever's token acted.
ANN = {"Authorization": "Bearer ann-" + secrets.token_hex(16)}
BOB = {"Authorization": "Bearer bob-" + secrets.token_hex(16)}


@dataclass
class World:
    s: Settings
    url: str
    published: list[Event]
    bad: list[Event]  # one drill event per project, each project on its own partition
    letters: dict[str, str]  # drill event id -> its dead letter's id
    command: DeadLetter
    command_raw: bytes
    outbox: Path
    failed_row: str
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.http.get(path, params=params, headers=READ)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(path, json=body, headers=AUTH if headers is None else headers)


def _drilled(s: Settings) -> tuple[list[Event], list[Event]]:
    events = slotted_events(workload("op", 6, 36), tenant_id="t")
    bad: list[Event] = []
    seen: set[tuple[str, int]] = set()
    for project in sorted({e.project_id for e in events}):
        where = s.topology.partition_of(project)
        if where in seen or len(bad) == 3:
            continue
        seen.add(where)
        index = max(i for i, e in enumerate(events) if e.project_id == project)
        events[index] = events[index].model_copy(
            update={"payload": {**events[index].payload, "drill": "fail"}}
        )
        bad.append(events[index])
    assert len(bad) == 3, "the workload needs three projects on distinct partitions"
    return events, bad


def _consume_with_cli(s: Settings, slug: str) -> subprocess.Popen[str]:
    return start_consume_cli(s, slug, until_idle=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("operator")
    outbox = folder / "router-outbox.sqlite"
    s = runtime_settings(make_settings())
    # The operator's own settings stay out of the subprocesses' environment.
    operator = s.model_copy(
        update={
            "operator_token": SecretStr(TOKEN),
            "operator_token_name": "oncall",
            "operator_tokens": {
                "ann": SecretStr(ANN["Authorization"].removeprefix("Bearer ")),
                "bob": SecretStr(BOB["Authorization"].removeprefix("Bearer ")),
            },
            "operator_read_token": SecretStr(READ_TOKEN),
            "operator_outboxes": [str(outbox), str(folder / "not-yet.sqlite")],
        }
    )
    try:
        cli(s, "provision")
        events, bad = _drilled(s)
        publish(s, events)
        projector = _consume_with_cli(s, "project-view-projector")
        stats = run(s, "flaky-ledger", RHUMBATRON_TEST_DRILL_FAILS="1")
        assert stats["dead_lettered"] == 3, stats
        _, err = projector.communicate(timeout=180)
        assert projector.returncode == 0, err[-3000:]
        client = connect(s.redis_url, timeout=5)
        command, raw = write_command_letter(s, client, task="task-9")
        store = outbox_for(s, outbox)
        append_all(store, drafts("held-project", 3))
        head = next(r for r in store.sendable(3, 100, None) if r.slot == 1)
        store.apply([RowUpdate(head.event_id, RowState.FAILED, 10, 0, None, "REJECTED", None)])
        store.close()
        service = OperatorService(operator)
        with running_server(service) as url:
            listed = httpx.get(
                url + "api/dead-letters", params={"kind": "event-batch"}, headers=READ
            ).json()
            letters = {item["events"][0]: item["id"] for item in listed["items"]}
            yield World(s, url, events, bad, letters, command, raw, outbox, head.event_id)
        service.close()
    finally:
        cleanup_environment(s)


# -- reads -----------------------------------------------------------------------------------------
def test_info_and_health(world: World) -> None:
    info = world.get("/api/info").json()
    assert info == {
        "env": world.s.env,
        "refresh_s": world.s.operator_refresh_s,
        "mutations_enabled": True,
        "page_size": world.s.operator_page_size,
    }
    health = world.get("/api/health")
    assert health.status_code == 200
    body = health.json()
    assert body["ok"] and body["kafka"]["ok"] and body["redis"]["ok"]
    assert body["kafka"]["address"] == world.s.kafka_bootstrap


def test_dead_letters_of_every_kind_are_listed_and_shown(world: World) -> None:
    everything = world.get("/api/dead-letters").json()
    assert everything["matched"] == 4 and not everything["truncated"]
    assert everything["items"][0]["id"] == world.command.id  # newest first
    assert sorted(world.letters) == sorted(e.event_id for e in world.bad)
    commands = world.get("/api/dead-letters", kind="command", queue="integration").json()
    assert [d["command_id"] for d in commands["items"]] == [world.command.command_id]
    ledger = world.get("/api/dead-letters", subscription="flaky-ledger", status="open").json()
    assert ledger["matched"] == 3
    assert all(
        d["attempts"] == 5 and d["error_type"].endswith("DrillFailure") for d in ledger["items"]
    )
    assert world.get("/api/dead-letters", subscription="ledger").json()["matched"] == 0

    bad = world.bad[0]
    shown = world.get(f"/api/dead-letters/{world.letters[bad.event_id]}").json()
    (entry,) = shown["entries"]
    assert entry["value_is_json"] and entry["value_json"]["eventId"] == bad.event_id
    assert entry["value_json"]["payload"]["drill"] == "fail"
    assert shown["subscription"] == "flaky-ledger" and shown["audit"] == []
    command = world.get(f"/api/dead-letters/{world.command.id}").json()
    assert command["entries"][0]["value_json"]["commandId"] == world.command.command_id
    assert command["origin_queue"] == "integration"


def test_outboxes_held_projects_and_recent_failures(world: World) -> None:
    present, absent = world.get("/api/outboxes").json()
    assert present["present"] and present["outbox"] == str(world.outbox)
    assert (present["counts"]["failed"], present["counts"]["pending"]) == (1, 2)
    assert [r["event_id"] for r in present["failed_rows"]] == [world.failed_row]
    assert absent["present"] is False and absent["error"] is None
    held = world.get("/api/held-projects").json()
    assert [(h["project_id"], h["rows_waiting"]) for h in held] == [("held-project", 2)]
    recent = world.get("/api/failures").json()
    assert {d["id"] for d in recent["dead_letters"]} == {world.command.id, *world.letters.values()}
    assert [r["last_error"] for r in recent["outbox_failed_rows"]] == ["REJECTED"]


def test_project_view_and_feed(world: World) -> None:
    project = world.bad[1].project_id
    mine = [e for e in world.published if e.project_id == project]
    view = world.get(f"/api/projects/{project}/view").json()
    assert view["projectId"] == project and view["events"] == len(mine)
    stream, partition = world.s.topology.partition_of(project)
    assert (view["stream"], view["partition"]) == (stream, partition)
    feed = world.get(f"/api/projects/{project}/feed").json()
    assert feed and {f["eventId"] for f in feed} <= {e.event_id for e in mine}
    missing = world.get("/api/projects/no-such-project/view")
    assert missing.status_code == 404 and "no-such-project" in missing.json()["reason"]
    assert world.get("/api/projects/no-such-project/feed").status_code == 404


def test_lag_per_subscription_and_partition(world: World) -> None:
    before = {s["subscription"]: s for s in world.get("/api/lag").json()["subscriptions"]}
    assert {"flaky-ledger", "project-view-projector"} <= set(before)
    assert before["project-view-projector"]["kind"] == before["flaky-ledger"]["kind"]
    assert before["flaky-ledger"]["kind"] == "subscription"
    streams = set(world.s.topology.stream_names())
    for sub in ("flaky-ledger", "project-view-projector"):
        parts = before[sub]["partitions"]
        assert {p["topic"] for p in parts} == streams
        assert len(parts) == len(streams) * world.s.partitions
        assert sum(p["end"] for p in parts) == len(world.published)
    # Three more events nobody consumes: every group is exactly three behind on that partition.
    extra = slotted_events(workload("lag", 1, 3), tenant_id="t")
    publish(world.s, extra)
    world.published.extend(extra)
    stream, partition = world.s.topology.partition_of(extra[0].project_id)
    after = {s["subscription"]: s for s in world.get("/api/lag").json()["subscriptions"]}
    for sub in ("flaky-ledger", "project-view-projector"):
        assert after[sub]["total_lag"] - before[sub]["total_lag"] == 3

        def at(report: dict[str, Any], sub: str = sub) -> int:
            return next(
                int(p["lag"])
                for p in report[sub]["partitions"]
                if (p["topic"], p["partition"]) == (stream, partition)
            )

        assert at(after) - at(before) == 3


# -- auth and bad input ----------------------------------------------------------------------------
def test_changes_are_refused_without_the_token_or_with_a_wrong_one(world: World) -> None:
    letter = world.letters[world.bad[2].event_id]
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        for action, body in (
            ("retry", {}),
            ("dismiss", {"reason": "x"}),
            ("retry", {"filter": {}}),
        ):
            path = (
                "/api/dead-letters/retry"
                if "filter" in body
                else f"/api/dead-letters/{letter}/{action}"
            )
            refused = world.post(path, body, headers)
            assert refused.status_code == 401 and refused.json()["reason"]
    assert world.get(f"/api/dead-letters/{letter}").json()["status"] == "open"
    # A server with no token configured refuses every change, whatever is sent.
    bare = OperatorService(world.s.model_copy(update={"operator_token": None}))
    with running_server(bare) as url:
        refused = httpx.post(f"{url}api/dead-letters/{letter}/retry", json={}, headers=AUTH)
        assert refused.status_code == 403
        assert "RHUMBATRON_OPERATOR_TOKEN" in refused.json()["reason"]
    assert world.get(f"/api/dead-letters/{letter}").json()["status"] == "open"


def test_bad_input_is_refused_with_a_reason(world: World) -> None:
    letter = world.letters[world.bad[2].event_id]
    cases = [
        (world.get("/api/dead-letters", status="gone"), 422, "status"),
        (world.get("/api/dead-letters", limit=10_000), 422, "limit"),
        (world.post(f"/api/dead-letters/{letter}/dismiss", {}), 422, "reason"),
        (world.post(f"/api/dead-letters/{letter}/retry", {"who": "eve"}), 422, "who"),
        (world.post("/api/dead-letters/retry", {"filter": {"since": "soon"}}), 422, "since"),
        (world.post("/api/dead-letters/dl_000/retry", {}), 404, None),
        (world.get("/api/dead-letters/dl_000"), 404, None),
    ]
    for response, status, name in cases:
        assert response.status_code == status, response.text
        assert response.json()["field"] == name and response.json()["reason"]
    assert "dl_000" in cases[-1][0].json()["reason"]
    assert world.get(f"/api/dead-letters/{letter}").json()["status"] == "open"


# -- actions ---------------------------------------------------------------------------------------
def _queue_records(s: Settings, queue: str) -> int:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": s.kafka_bootstrap, "group.id": "wm-" + secrets.token_hex(4)}
    )
    try:
        metadata = consumer.list_topics(queue, timeout=10).topics[queue]
        total = 0
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(queue, p), timeout=10
            )
            total += int(high) - int(low)
        return total
    finally:
        consumer.close()


def test_command_retry_lands_on_its_origin_queue_once(world: World) -> None:
    queue = queue_name("integration", world.s.env)
    assert _queue_records(world.s, queue) == 0
    url = f"/api/dead-letters/{world.command.id}/retry"
    done = world.post(url, {"reason": "agent host back"})
    assert done.status_code == 200, done.text
    assert queue in done.json()["outcome"]
    again = world.post(url, {}, BOB)  # the double click, by someone else
    assert again.status_code == 409 and "already handled" in again.json()["reason"]
    assert _queue_records(world.s, queue) == 1
    (record,) = read_all(world.s.kafka_bootstrap, [queue], expect=1, timeout=30)
    assert record.value() == world.command_raw
    headers = dict(record.headers() or [])
    assert headers[OPERATOR_RETRY] == world.command.id.encode()
    assert [k for k in headers if is_ours(k)] == [OPERATOR_RETRY]
    shown = world.get(f"/api/dead-letters/{world.command.id}").json()
    assert shown["status"] == "retried"
    assert shown["last_action"]["who"] == "oncall"
    assert shown["last_action"]["why"] == "agent host back"
    retried = world.get("/api/dead-letters", status="retried", kind="command").json()
    assert [d["id"] for d in retried["items"]] == [world.command.id]
    # The queue's worker runs it; its group shows as a command worker, caught up on the queue.
    cli(world.s, "worker", "--queue", "integration", "--handler", "drill", "--until-idle", "3")
    groups = {g["subscription"]: g for g in world.get("/api/lag").json()["subscriptions"]}
    worker = groups["worker-integration"]
    assert worker["kind"] == "command-worker"
    on_queue = [p for p in worker["partitions"] if p["topic"] == queue]
    assert len(on_queue) == world.s.queue_partitions
    assert sum(p["end"] for p in on_queue) == 1 and sum(p["lag"] for p in on_queue) == 0


def test_dismiss_is_recorded_and_visible_afterwards(world: World) -> None:
    letter = world.letters[world.bad[1].event_id]
    done = world.post(f"/api/dead-letters/{letter}/dismiss", {"reason": "test data, not real"}, ANN)
    assert done.status_code == 200, done.text
    assert done.json()["dead_letter"]["status"] == "dismissed"
    again = world.post(f"/api/dead-letters/{letter}/dismiss", {"reason": "twice"}, BOB)
    assert again.status_code == 409 and "dismissed by ann" in again.json()["reason"]
    shown = world.get(f"/api/dead-letters/{letter}").json()
    assert [(a["action"], a["who"], a["why"]) for a in shown["audit"]] == [
        ("dismissed", "ann", "test data, not real")
    ]
    open_ids = {d["id"] for d in world.get("/api/dead-letters", status="open").json()["items"]}
    assert letter not in open_ids
    dismissed = world.get("/api/dead-letters", status="dismissed").json()["items"]
    assert [d["id"] for d in dismissed] == [letter]
    # The CLI reads the same store through the same service.
    cli_shown = orjson.loads(cli(world.s, "dead-letters", "show", letter).stdout)
    assert cli_shown["status"] == "dismissed" and cli_shown["audit"][0]["who"] == "ann"
    listed = orjson.loads(
        cli(world.s, "dead-letters", "list", "--json", "--kind", "command").stdout
    )
    assert [d["id"] for d in listed] == [world.command.id]


def test_event_retry_redelivers_and_the_ledger_applies_it_once(world: World) -> None:
    bad = world.bad[0]
    letter = world.letters[bad.event_id]
    done = world.post(f"/api/dead-letters/{letter}/retry", {}, ANN)
    assert done.status_code == 200, done.text
    assert "redelivered to subscription flaky-ledger" in done.json()["outcome"]
    assert world.post(f"/api/dead-letters/{letter}/retry", {}).status_code == 409
    assert world.get(f"/api/dead-letters/{letter}").json()["last_action"]["who"] == "ann"
    stats = run(world.s, "flaky-ledger")  # the cause is gone: drill events apply now
    assert stats["redelivered"] == 1
    counts = _ledger_counts(world.s, "flaky-ledger")
    never = {world.bad[1].event_id, world.bad[2].event_id}  # dismissed, and still open
    assert counts == {e.event_id: 1 for e in world.published if e.event_id not in never}


def _ledger_counts(s: Settings, slug: str) -> dict[str, int]:
    client = connect(s.redis_url, timeout=5)
    counts: Counter[str] = Counter()
    for key in client.scan_iter(match=f"rh:{s.env}:{{{slug}|*:x:ledger:counts"):
        for event_id, n in client.hgetall(key).items():
            counts[event_id.decode()] += int(n)
    return dict(counts)


# -- the whole document, fuzzed (the read token: changes are only ever refused here) --------------
# Each operation gets generated requests, valid and invalid; every response must match the
# document (status code, content type, body schema) and none may be a server error.
FUZZ = hypothesis.settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    database=None,
)


def test_every_endpoint_answers_as_its_openapi_document_says(world: World) -> None:
    schema = schemathesis.openapi.from_url(world.url + "openapi.json")
    base = world.url.rstrip("/")
    operations = [r.ok() for r in schema.get_all_operations() if isinstance(r, Ok)]
    assert len(operations) == 16
    for operation in operations:

        @FUZZ
        @hypothesis.given(case=operation.as_strategy())
        def check(case: Any) -> None:
            case.call_and_validate(base_url=base, headers=READ)

        check()


def test_the_prometheus_scrape_agrees_with_the_api(world: World) -> None:
    text = world.get("/metrics").text
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    letters = world.get("/api/dead-letters", limit=100).json()["items"]
    open_batches = sum(1 for d in letters if d["kind"] == "event-batch" and d["status"] == "open")
    assert (
        samples.get('rhumbatron_dead_letters{kind="event-batch",status="open"}', 0) == open_batches
    )
    outbox = str(world.outbox)
    assert samples[f'rhumbatron_outbox_rows{{outbox="{outbox}",state="failed"}}'] == 1
    assert samples[f'rhumbatron_outbox_held_projects{{outbox="{outbox}"}}'] == 1
    lag = world.get("/api/lag").json()["subscriptions"]
    ledger = next(s for s in lag if s["subscription"] == "flaky-ledger")
    scraped = sum(
        v
        for k, v in samples.items()
        if k.startswith("rhumbatron_consumer_lag{") and 'subscription="flaky-ledger"' in k
    )
    assert scraped == ledger["total_lag"]
    assert {k: v for k, v in samples.items() if k.startswith("rhumbatron_scrape_error")} == {
        f'rhumbatron_scrape_error{{source="{s}"}}': 0
        for s in ("kafka-lag", "outboxes", "dead-letters", "workers")
    }
