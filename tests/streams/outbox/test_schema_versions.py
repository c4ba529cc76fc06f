"""The PostgreSQL outbox's schema versions: ``outbox migrate`` moves a version 1 outbox to
version 3 online (writers and publishers keep going through the move and after it; rows written
before it are untouched), and repeats harmlessly; ``outbox init`` sends a version 1 outbox to
migrate and refuses a version it does not know, naming both; the limits the INSERT checks come
from the settings."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
import pytest

from router.settings import Settings
from streams.envelopes import decode_event, encode
from streams.errors import OutboxError, OutboxSchemaError
from streams.outbox import postgres
from streams.outbox.postgres import PostgresOptions, PostgresOutbox, init_outbox, migrate_outbox
from streams.outbox.postgres_checks import payload_rules
from streams.outbox.postgres_writer import append
from streams.outbox.publisher import Publisher
from streams.outbox.store import RowState
from tests.support.environment import run_cli
from tests.support.outbox import OutboxBackend, SimulatedKafka, cli_env, drafts, policy
from tests.support.postgres import FreshSchema

pytestmark = pytest.mark.integration

LIMIT = 256 * 1024
INSERT = (
    "INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, payload) "
    "VALUES (%s, 'task.completed', %s, 'tenant-t', 'agent:a', %s)"
)
GOOD = '{"agentId": "agent-1"}'


def _id() -> str:
    return "evt_" + secrets.token_hex(16)


def _version(pg: OutboxBackend) -> int:
    return int(pg.query("SELECT max(version) FROM outbox_schema_version")[0][0])


def _envelopes(pg: OutboxBackend) -> dict[str, str]:
    return dict(pg.query("SELECT event_id, outbox_envelope(o)::text FROM outbox o"))


def _v1_canonical(text: str, max_bytes: int) -> bytes:
    """The publisher's check as version 1 shipped it: the envelope, no catalog."""
    return encode(decode_event(text, max_bytes=max_bytes * 4), max_bytes=max_bytes)


def test_migrate_moves_a_v1_outbox_online_and_publishers_of_either_version_keep_publishing(
    pg_v1: OutboxBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = pg_v1
    assert pg.schema is not None
    url = pg.schema.url
    before = [_id() for _ in range(3)]
    with pg.schema.connect() as conn:
        for event_id in before:
            conn.execute(INSERT, (event_id, "proj-a", GOOD))
        # Version 1 takes what the publisher refuses: version 2 leaves such a row alone.
        conn.execute(INSERT, (loose := _id(), "proj-loose", "{}"))
    # The version 1 publisher: its SQL, its envelope check; it holds the lease through the move.
    monkeypatch.setattr(postgres, "_canonical", _v1_canonical)
    old = pg.store()
    kafka = SimulatedKafka()
    with Publisher(old, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        publisher.run_pass()
        assert {e: old.get(e).state for e in before} == dict.fromkeys(before, RowState.PUBLISHED)
        stored_before = _envelopes(pg)
        # A writer's transaction open across the move: the move does not wait for it.
        writer = pg.schema.connect()
        writer.execute(INSERT, (during := _id(), "proj-a", GOOD))
        assert "migrated from schema version 1 to 3" in migrate_outbox(url)
        writer.commit()
        writer.close()
        assert _version(pg) == 3
        assert _envelopes(pg) == {**stored_before, during: _envelopes(pg)[during]}
        assert pg.query(f"SELECT state FROM outbox WHERE event_id = '{loose}'") == [("published",)]
        # After the move the INSERT checks; the old publisher sends what it takes.
        refused = pytest.raises(psycopg.errors.CheckViolation, match="payload.agentId is missing")
        with pg.schema.connect() as conn, refused:
            conn.execute(INSERT, (_id(), "proj-a", "{}"))
        with pg.schema.connect() as conn:
            conn.execute(INSERT, (after_old := _id(), "proj-a", GOOD))
        publisher.run_pass()
    assert old.get(during).state is RowState.PUBLISHED
    assert old.get(after_old).state is RowState.PUBLISHED
    # The new publisher, and the new writer, on the migrated outbox.
    monkeypatch.undo()
    new = pg.store()
    with new.transaction() as unit:
        result = unit.append("proj-a", drafts("proj-a", 2), tenant_id="tenant-t")
    with Publisher(new, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        publisher.run_pass()
    assert all(new.get(e.event_id).state is RowState.PUBLISHED for e in result.events)
    assert pg.slots()["proj-a"] == [1, 2, 3, 4, 5, 6, 7]
    sent = [decode_event(v, max_bytes=LIMIT).slot for _, v in kafka.log[("s", 0)]]
    sent += [decode_event(v, max_bytes=LIMIT).slot for _, v in kafka.log[("s", 1)]]
    assert sorted(s for s in sent if s is not None) == sorted([1, 2, 3, 4, 5, 6, 7, 1])


def test_migrate_is_idempotent_and_writes_the_rules_and_limits_again(pg: OutboxBackend) -> None:
    assert pg.schema is not None
    assert "already at schema version 3" in migrate_outbox(pg.schema.url, max_envelope_bytes=4096)
    assert "already at schema version 3" in migrate_outbox(pg.schema.url, max_envelope_bytes=4096)
    assert pg.query("SELECT name, value FROM outbox_limits") == [("max_envelope_bytes", 4096)]
    (count,) = pg.query("SELECT count(*) FROM outbox_payload_rules")[0]
    assert count == len(payload_rules())
    assert pg.query("SELECT version FROM outbox_schema_version") == [(1,), (2,), (3,)]
    with pg.schema.connect() as conn:
        big = '{"agentId": "a", "blob": "' + "x" * 5000 + '"}'
        with pytest.raises(psycopg.errors.CheckViolation, match="over the 4096 allowed"):
            conn.execute(INSERT, (_id(), "proj-a", big))


def test_init_sends_a_v1_outbox_to_migrate(pg_v1: OutboxBackend) -> None:
    assert pg_v1.schema is not None
    with pytest.raises(OutboxSchemaError, match=r"version 1 .*this release's is 3.*outbox migrate"):
        init_outbox(pg_v1.schema.url)
    assert _version(pg_v1) == 1
    # A store of this release reads it meanwhile (writers and publishers keep going).
    pg_v1.store().close()


@pytest.mark.parametrize("command", [init_outbox, migrate_outbox])
def test_a_version_it_does_not_know_is_refused_naming_both(pg: OutboxBackend, command: Any) -> None:
    pg.query("SELECT 1")
    assert pg.schema is not None
    with pg.schema.connect() as conn:
        conn.execute("INSERT INTO outbox_schema_version (version) VALUES (4)")
    with pytest.raises(OutboxSchemaError, match=r"schema version 4 .*knows versions 1 to 3"):
        command(pg.schema.url)
    with pytest.raises(OutboxSchemaError, match=r"schema version 4 .*knows versions 1 to 3"):
        PostgresOutbox(
            pg.schema.url, options=PostgresOptions(max_envelope_bytes=LIMIT, missed_report_limit=1)
        )


def test_migrate_without_an_outbox_says_to_init() -> None:
    bare = FreshSchema(init=False)
    try:
        with pytest.raises(OutboxSchemaError, match="no outbox .* to migrate.*outbox init"):
            migrate_outbox(bare.url)
    finally:
        bare.drop()


def test_the_python_writer_sees_the_inserts_refusal_as_an_outbox_error(pg: OutboxBackend) -> None:
    """A draft the writer's own check passes (an uncataloged type) but the schema's limit does
    not: the refusal names the limit."""
    assert pg.schema is not None
    migrate_outbox(pg.schema.url, max_envelope_bytes=2048)
    draft = drafts("proj-a", 1)[0]
    import dataclasses

    big = dataclasses.replace(draft, event_type="team.own_thing", payload={"b": "x" * 3000})
    with pg.schema.connect() as conn, pytest.raises(OutboxError, match="max_envelope_bytes"):
        append(conn, [big], tenant_id="t", max_envelope_bytes=LIMIT, missed_report_limit=10)


def test_the_migrate_command(settings: Settings, pg_v1: OutboxBackend) -> None:
    assert pg_v1.schema is not None
    env = cli_env(settings)
    init = run_cli(settings, "outbox", "init", "--outbox", pg_v1.schema.url, env=env)
    assert init.returncode != 0 and "outbox migrate --outbox URL" in init.stderr
    first = run_cli(settings, "outbox", "migrate", "--outbox", pg_v1.schema.url, env=env)
    assert first.returncode == 0, first.stderr
    assert "migrated from schema version 1 to 3" in first.stdout
    again = run_cli(settings, "outbox", "migrate", "--outbox", pg_v1.schema.url, env=env)
    assert again.returncode == 0 and "already at schema version 3" in again.stdout
    assert "****" in again.stdout or "password" not in again.stdout
    (value,) = pg_v1.query("SELECT value FROM outbox_limits")[0]
    assert value == settings.max_envelope_bytes
