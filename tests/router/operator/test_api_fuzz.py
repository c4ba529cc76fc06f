"""The operator API fuzzed with an operator's token, over dead letters holding hostile records.

test_api.py fuzzes every endpoint with the read token, where every change is refused. Here the
token may act: schemathesis generates requests for every operation of the OpenAPI document,
valid and invalid (retries and dismissals of any id, bulk filters of any shape, reasons of any
text); each answer must match the document (status, content type, body schema) and none may be
a server error. The letters it acts on are the ones a hostile stream leaves: a poison record with
no value, headers with no value or bytes that are not UTF-8, a key that is not UTF-8, JSON nested
deeper than a JSON writer goes; an event batch; a command; and a failed outbox row.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from pydantic import SecretStr
from schemathesis.core.result import Ok

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, batch_letter_id
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import dead_letters, redis_client
from streams.envelopes import format_time
from streams.outbox.store import RowState, RowUpdate
from streams.workload import slotted_events, workload
from tests.support.environment import cleanup_environment, make_settings
from tests.support.operator import running_server, write_command_letter
from tests.support.outbox import append_all, drafts, outbox_for
from tests.support.runtime_processes import runtime_settings

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30")) // 2
TOKEN = "op-" + secrets.token_hex(16)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEEP = b'{"d":' + b"[" * 400 + b"]" * 400 + b"}"


@dataclass
class World:
    s: Settings
    url: str
    poison: DeadLetter
    deep: DeadLetter


def _letter(s: Settings, offset: int, value: bytes | None, headers: list[Any]) -> DeadLetter:
    topic, partition = s.topology.stream_names()[0], 0
    return DeadLetter(
        id=batch_letter_id("ledger", topic, partition, offset, "poison"),
        kind=LetterKind.POISON,
        source_topic=topic,
        source_partition=partition,
        error="invalid Event: field '<envelope>': not valid JSON",
        error_type="streams.errors.EnvelopeError",
        attempts=1,
        created_at=format_time(datetime.now(UTC)),
        entries=[Entry(offset, value, b"\xff\xfekey", headers)],
        subscription="ledger",
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder: Path = tmp_path_factory.mktemp("operator-fuzz")
    outbox = folder / "outbox.sqlite"
    s = runtime_settings(make_settings())
    operator = s.model_copy(
        update={"operator_token": SecretStr(TOKEN), "operator_outboxes": [str(outbox)]}
    )
    try:
        provision_environment(s)
        client = redis_client(s)
        poison = _letter(s, 7, None, [("note", None), ("x", b"\xff\xfe"), ("x", b"again")])
        deep = _letter(s, 8, DEEP, [("traceparent", b"\x00" * 600)])
        event = slotted_events(workload("fuzz", 1, 3), tenant_id="t")[0]
        batch = DeadLetter(
            id=batch_letter_id("ledger", s.topology.stream_for(event.project_id), 0, 3, "b"),
            kind=LetterKind.EVENT_BATCH,
            source_topic=s.topology.stream_for(event.project_id),
            source_partition=0,
            error="LedgerDrillFailure: drill",
            error_type="streams.errors.LedgerDrillFailure",
            attempts=5,
            created_at=format_time(datetime.now(UTC)),
            entries=[_entry(event)],
            subscription="ledger",
        )
        dead_letters(s, client).write([poison, deep, batch])
        write_command_letter(s, client, task="task-fuzz")
        store = outbox_for(s, outbox)
        append_all(store, drafts("held-project", 2))
        head = next(r for r in store.sendable(2, 100, None) if r.slot == 1)
        store.apply([RowUpdate(head.event_id, RowState.FAILED, 10, 0, None, "REJECTED", None)])
        store.close()
        service = OperatorService(operator)
        with running_server(service) as url:
            yield World(s, url, poison, deep)
        service.close()
    finally:
        cleanup_environment(s)


def _entry(event: Any) -> Entry:
    from streams.envelopes import encode

    return Entry(
        3,
        encode(event, max_bytes=1 << 20),
        event.project_id.encode(),
        [],
        event.event_id,
        event.event_type,
        event.project_id,
    )


def test_hostile_letters_are_shown_as_they_came(world: World) -> None:
    http = httpx.Client(base_url=world.url, timeout=30, headers=AUTH)
    shown = http.get(f"/api/dead-letters/{world.poison.id}")
    assert shown.status_code == 200, shown.text
    (entry,) = shown.json()["entries"]
    assert entry["value_b64"] is None and entry["key"] is None
    assert [(h["name"], h["text"], h["b64"]) for h in entry["headers"]] == [
        ("note", None, None),
        ("x", None, "//4="),
        ("x", "again", "YWdhaW4="),
    ]
    deep = http.get(f"/api/dead-letters/{world.deep.id}")
    assert deep.status_code == 200, deep.text
    (entry,) = deep.json()["entries"]
    assert entry["value_b64"] is not None
    listed = http.get("/api/dead-letters", params={"kind": "poison"})
    assert listed.status_code == 200 and listed.json()["matched"] == 2
    refused = http.post(f"/api/dead-letters/{world.poison.id}/retry", json={"reason": "x"})
    assert refused.status_code == 409 and "can only be dismissed" in refused.text


FUZZ = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    database=None,
)


def test_every_endpoint_answers_as_its_document_says_to_an_operator(world: World) -> None:
    schema = schemathesis.openapi.from_url(world.url + "openapi.json")
    base = world.url.rstrip("/")
    operations = [r.ok() for r in schema.get_all_operations() if isinstance(r, Ok)]
    assert operations
    for operation in operations:

        @FUZZ
        @hypothesis.given(case=operation.as_strategy())
        def check(case: Any) -> None:
            case.call_and_validate(base_url=base, headers=AUTH)

        check()
