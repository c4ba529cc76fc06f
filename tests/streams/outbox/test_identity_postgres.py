"""The PostgreSQL outbox's identity (schema version 3): made once by ``outbox init`` however many
run at once, the same under another address of the same database; ``outbox migrate`` adds it to a
version 2 outbox online while a writer and a publisher of the release before keep working; a
version 2 outbox publishes without the header and says, once, what to run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from streams.envelopes import decode_event
from streams.headers import OUTBOX
from streams.outbox import ops
from streams.outbox.identity import is_outbox_id
from streams.outbox.postgres import PostgresOptions, PostgresOutbox, init_outbox, migrate_outbox
from streams.outbox.publisher import Publisher
from streams.outbox.store import RowState
from tests.streams.outbox.test_identity import RecordingKafka
from tests.streams.outbox.test_schema_versions import GOOD, INSERT, LIMIT, _id
from tests.support.outbox import OutboxBackend, append_all, drafts, policy
from tests.support.postgres import FreshSchema

pytestmark = pytest.mark.integration


def _identities(pg: OutboxBackend) -> list[str]:
    return [row[0] for row in pg.query("SELECT outbox_id FROM outbox_identity")]


def _said(line: str) -> str:
    """The identity a line of init or migrate names at its end."""
    head, _, identity = line.rpartition("; identity ")
    assert head and is_outbox_id(identity), line
    return identity


def _at_once(work: Callable[[], str], count: int) -> list[str]:
    """Run ``work`` ``count`` times at once on threads; what each returned."""
    start = threading.Barrier(count)
    said: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            start.wait()
            said.append(work())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return said


def test_inits_racing_on_a_new_schema_make_one_identity() -> None:
    bare = FreshSchema(init=False)
    try:
        said = _at_once(lambda: init_outbox(bare.url), 4)
        assert sum("created" in line for line in said) == 1
        assert sum("already in schema" in line for line in said) == 3
        [identity] = {_said(line) for line in said}
        with bare.connect() as conn:
            found = conn.execute("SELECT one, outbox_id FROM outbox_identity").fetchall()
        assert found == [(True, identity)]
    finally:
        bare.drop()


def test_the_same_database_under_another_host_name_has_the_same_identity(
    pg: OutboxBackend,
) -> None:
    assert pg.schema is not None
    [stored] = _identities(pg)
    other = pg.schema.url.replace("@127.0.0.1:", "@localhost:", 1)
    assert other != pg.schema.url
    store = PostgresOutbox(
        other, options=PostgresOptions(max_envelope_bytes=LIMIT, missed_report_limit=1)
    )
    try:
        assert store.outbox_id() == stored == pg.store().outbox_id()
    finally:
        store.close()


def test_a_v2_outbox_publishes_without_the_header_and_warns_once(
    pg_v2: OutboxBackend, caplog: pytest.LogCaptureFixture
) -> None:
    assert _identities_table_absent(pg_v2)
    store = pg_v2.store()
    assert store.outbox_id() is None
    assert ops.stats(store, now=0.0, row_limit=10).as_dict()["outbox_id"] is None
    append_all(store, drafts("proj-a", 3))
    kafka = RecordingKafka()
    with (
        caplog.at_level(logging.WARNING, logger="rhumbatron.outbox.publisher"),
        Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as pub,
    ):
        assert pub.outbox_id is None
        pub.run_pass()
        append_all(store, drafts("proj-a", 2))
        pub.run_pass()
    assert len(kafka.sent) == 5
    assert all(not any(name == OUTBOX for name, _ in headers) for _, headers in kafka.sent)
    warned = [r.getMessage() for r in caplog.records if r.name == "rhumbatron.outbox.publisher"]
    assert len(warned) == 1, warned
    assert store.location in warned[0] and "rhumbatron outbox migrate" in warned[0]
    assert "****" in store.location  # the warning names the outbox without its password


def _identities_table_absent(pg: OutboxBackend) -> bool:
    [(absent,)] = pg.query("SELECT to_regclass('outbox_identity') IS NULL")
    return bool(absent)


def test_migrate_adds_the_identity_online_while_a_v2_writer_and_publisher_keep_working(
    pg_v2: OutboxBackend,
) -> None:
    pg = pg_v2
    assert pg.schema is not None
    url = pg.schema.url
    before = [_id() for _ in range(3)]
    with pg.schema.connect() as conn:
        for event_id in before:
            conn.execute(INSERT, (event_id, "proj-a", GOOD))
    old = pg.store()
    kafka = RecordingKafka()
    # The publisher as the release before runs it: no identity; it holds the lease through the move.
    with Publisher(old, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        assert publisher.outbox_id is None
        publisher.run_pass()
        assert {e: old.get(e).state for e in before} == dict.fromkeys(before, RowState.PUBLISHED)
        stored_before = dict(pg.query("SELECT event_id, outbox_envelope(o)::text FROM outbox o"))
        # A writer's transaction open across the move: the move does not wait for it.
        writer = pg.schema.connect()
        writer.execute(INSERT, (during := _id(), "proj-a", GOOD))
        said = migrate_outbox(url)
        assert "migrated from schema version 2 to 3" in said
        writer.commit()
        writer.close()
        identity = _said(said)
        assert _identities(pg) == [identity]
        assert pg.query("SELECT max(version) FROM outbox_schema_version") == [(3,)]
        now = dict(pg.query("SELECT event_id, outbox_envelope(o)::text FROM outbox o"))
        assert now == {**stored_before, during: now[during]}
        with pg.schema.connect() as conn:
            conn.execute(INSERT, (after := _id(), "proj-a", GOOD))
        publisher.run_pass()
    assert old.get(during).state is RowState.PUBLISHED
    assert old.get(after).state is RowState.PUBLISHED
    # What the running publisher sent carries no identity: it reads it when it starts.
    assert len(kafka.sent) == 5
    assert all(not any(name == OUTBOX for name, _ in h) for _, h in kafka.sent)
    # Restarted, it names the outbox; a migrate again changes nothing.
    assert _said(migrate_outbox(url)) == identity
    new = pg.store()
    append_all(new, drafts("proj-a", 2))
    fresh = RecordingKafka()
    with Publisher(new, lambda: fresh, stream_for=lambda p: "s", policy=policy()) as publisher:
        assert publisher.outbox_id == identity
        publisher.run_pass()
    assert [[v for k, v in h if k == OUTBOX] for _, h in fresh.sent] == [[identity.encode()]] * 2
    assert [decode_event(v, max_bytes=LIMIT).slot for v, _ in fresh.sent] == [6, 7]
    assert pg.slots()["proj-a"] == [1, 2, 3, 4, 5, 6, 7]


def test_migrates_racing_on_a_v2_outbox_make_one_identity(pg_v2: OutboxBackend) -> None:
    assert pg_v2.schema is not None
    url = pg_v2.schema.url
    said = _at_once(lambda: migrate_outbox(url), 4)
    assert sum("migrated from schema version 2 to 3" in line for line in said) == 1
    [identity] = {_said(line) for line in said}
    assert _identities(pg_v2) == [identity]


def test_a_v1_outbox_migrates_to_3_and_gets_its_identity(pg_v1: OutboxBackend) -> None:
    assert pg_v1.schema is not None
    said = migrate_outbox(pg_v1.schema.url)
    assert "migrated from schema version 1 to 3" in said
    assert _identities(pg_v1) == [_said(said)]
    assert pg_v1.query("SELECT version FROM outbox_schema_version ORDER BY version") == [
        (1,),
        (2,),
        (3,),
    ]
