"""What only the PostgreSQL outbox has: the schema as a contract for writers in any language (one
plain INSERT; rhumbatron_append for bump-and-report and strict), the duplicate trap (a duplicate
under ON CONFLICT DO NOTHING must not use a slot), writers on connections of their own, the
advisory-lock lease and its loss, the wake-up by LISTEN/NOTIFY, and the refusals of bad input
(an unreachable URL, no schema, another schema version)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from streams.errors import (
    OutboxSchemaError,
    PublisherLeaseHeld,
    ServerRefused,
    SlotConflict,
    Unreachable,
)
from streams.outbox.postgres import LEASE_CLASS, PostgresOptions, PostgresOutbox, init_outbox
from streams.outbox.postgres_writer import append
from streams.outbox.publisher import Publisher
from streams.outbox.store import CommitSignal, RowState
from tests.support.outbox import OutboxBackend, SimulatedKafka, drafts, policy
from tests.support.postgres import FreshSchema, server_url
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

INSERT = (
    "INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, payload) "
    "VALUES (%s, 'task.completed', %s, 'tenant-t', 'service:other', '{\"agentId\": \"a\", \"n\": 1}')"
)


def _id() -> str:
    return "evt_" + secrets.token_hex(16)


@pytest.fixture
def pg() -> Iterator[OutboxBackend]:
    import tempfile
    from pathlib import Path

    backend = OutboxBackend("postgres", Path(tempfile.mkdtemp(prefix="outbox-pg-")))
    yield backend
    backend.close()


def _conn(backend: OutboxBackend, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    assert backend.schema is not None
    return backend.schema.connect(autocommit=autocommit)


# -- the schema as a writer's contract -------------------------------------------------------------
def test_a_plain_insert_gets_the_next_slot_and_is_published_as_an_envelope(
    pg: OutboxBackend,
) -> None:
    first, second = _id(), _id()
    with _conn(pg) as conn:
        assert conn.execute(INSERT + " RETURNING slot", (first, "proj-a")).fetchone() == (1,)
        assert conn.execute(INSERT + " RETURNING slot", (second, "proj-a")).fetchone() == (2,)
    store = pg.store()
    password = psycopg.conninfo.conninfo_to_dict(pg.address)["password"]
    assert password and str(password) not in store.location and "****" in store.location
    rows = store.sendable(10, 10, None)
    assert [(r.event_id, r.slot) for r in rows] == [(first, 1), (second, 2)]
    from streams.envelopes import decode_event

    event = decode_event(rows[0].envelope, max_bytes=1 << 20)
    assert (event.slot, event.project_id, event.tenant_id, event.payload) == (
        1,
        "proj-a",
        "tenant-t",
        {"agentId": "a", "n": 1},
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="only the outbox assigns slots"):
        _conn(pg).execute(
            "INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, slot) "
            "VALUES (%s, 'task.completed', 'proj-a', 't', 'a', 7)",
            (_id(),),
        )


def test_a_duplicate_under_on_conflict_do_nothing_uses_no_slot(pg: OutboxBackend) -> None:
    """The classic trap: a trigger that bumped the counter before ON CONFLICT dropped the row
    would leave slot 2 empty for ever."""
    taken = _id()
    with _conn(pg) as conn:
        conn.execute(INSERT, (taken, "proj-a"))
    with _conn(pg) as conn:
        again = conn.execute(
            INSERT + " ON CONFLICT (event_id) DO NOTHING RETURNING slot", (taken, "proj-a")
        ).fetchall()
        assert again == []
        plain = conn.execute(INSERT + " RETURNING slot", (taken, "proj-a")).fetchall()
        assert plain == []  # without ON CONFLICT too: ignored, no error, no slot
        assert conn.execute(INSERT + " RETURNING slot", (_id(), "proj-a")).fetchone() == (2,)
    assert pg.slots() == {"proj-a": [1, 2]}
    assert pg.counters() == {"proj-a": 2}


def test_the_same_event_id_from_two_open_transactions_leaves_no_hole(pg: OutboxBackend) -> None:
    """The second writer (another project, even) waits for the first; when the first commits, the
    second's row is a duplicate and takes no slot; when it rolls back, the second gets slot 1."""
    for first_commits in (True, False):
        shared = _id()
        a, b = f"proj-a-{first_commits}", f"proj-b-{first_commits}"
        holder = _conn(pg)
        holder.execute(INSERT, (shared, a))
        got: list[Any] = []

        waiter = f"second writer {secrets.token_hex(4)}"

        def second(
            project: str = b, event_id: str = shared, got: list[Any] = got, name: str = waiter
        ) -> None:
            assert pg.schema is not None
            with pg.schema.connect(application_name=name) as conn:
                got.append(
                    conn.execute(
                        INSERT + " ON CONFLICT (event_id) DO NOTHING RETURNING slot",
                        (event_id, project),
                    ).fetchall()
                )
                got.append(conn.execute(INSERT + " RETURNING slot", (_id(), project)).fetchone())

        writer = threading.Thread(target=second)
        writer.start()
        waiting = (
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            f"AND application_name = '{waiter}'"
        )

        def second_waits(query: str = waiting) -> bool:
            return bool(pg.query(query)[0][0] == 1)

        wait_until(
            second_waits,
            60,
            "the second writer waits for the first",
        )
        if first_commits:
            holder.commit()
        else:
            holder.rollback()
        holder.close()
        writer.join(60)
        if first_commits:
            assert got == [[], (1,)]
            assert pg.counters()[a] == 1 and pg.counters()[b] == 1
        else:
            assert got == [[(1,)], (2,)]
            assert a not in pg.counters() and pg.counters()[b] == 2


def test_rhumbatron_append_reports_what_the_writer_missed_or_refuses(pg: OutboxBackend) -> None:
    with _conn(pg) as conn:
        for _ in range(3):
            conn.execute(INSERT, (_id(), "proj-a"))
    new, dup = _id(), _id()
    events = psycopg.types.json.Jsonb(
        [
            {"eventId": new, "eventType": "task.done", "actor": "svc", "payload": {"k": 1}},
            {"eventId": dup, "eventType": "task.done", "actor": "svc"},
            {"eventId": dup, "eventType": "task.done", "actor": "svc"},
        ]
    )
    with _conn(pg) as conn:
        found = conn.execute(
            "SELECT rhumbatron_append('proj-a', 'tenant-t', %s, 1)", (events,)
        ).fetchone()
    assert found is not None
    result: dict[str, Any] = found[0]
    assert result["slots"] == [4, 5] and result["eventIds"] == [new, dup]
    assert result["duplicates"] == [dup] and result["head"] == 5
    assert [m["slot"] for m in result["missed"]] == [2, 3] and result["missedComplete"] is True
    with _conn(pg) as conn:
        conn.execute("CREATE TABLE decisions (n integer)")
    with _conn(pg) as conn:
        conn.execute("INSERT INTO decisions VALUES (1)")
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(
                "SELECT rhumbatron_append('proj-a', 'tenant-t', %s, 4, true)",
                (psycopg.types.json.Jsonb([{"eventId": _id(), "eventType": "a.b", "actor": "x"}]),),
            )
        assert refused.value.sqlstate == "RH409"
        assert '"seenSlot": 4' in (refused.value.diag.message_detail or "")
    assert pg.query("SELECT COUNT(*) FROM decisions") == [(0,)]
    assert pg.counters() == {"proj-a": 5}


def test_the_python_helper_writes_in_the_callers_transaction_and_never_commits(
    pg: OutboxBackend,
) -> None:
    limits: dict[str, Any] = {"max_envelope_bytes": 256 * 1024, "missed_report_limit": 100}
    with _conn(pg) as conn:
        conn.execute("CREATE TABLE tasks (id text PRIMARY KEY, state text)")
    conn = _conn(pg)
    conn.execute("INSERT INTO tasks VALUES ('t1', 'done')")
    result = append(conn, drafts("proj-a", 2), tenant_id="tenant-t", **limits)
    assert result.slots == [1, 2]
    other = _conn(pg)
    assert other.execute("SELECT COUNT(*) FROM outbox").fetchone() == (0,)  # not committed
    conn.rollback()
    assert pg.counters() == {} and pg.query("SELECT COUNT(*) FROM tasks") == [(0,)]
    one = drafts("proj-a", 1)[0]
    assert append(conn, one, tenant_id="tenant-t", **limits).slots == [1]
    conn.commit()
    with pytest.raises(SlotConflict, match="saw up to slot 0 but the project is at slot 1"):
        append(conn, drafts("proj-a", 1), tenant_id="t", seen_slot=0, strict=True, **limits)
    conn.rollback()
    assert pg.slots() == {"proj-a": [1]}
    conn.close()
    other.close()


def test_eight_writers_on_their_own_connections_get_dense_slots(pg: OutboxBackend) -> None:
    """Services in other languages: plain INSERTs, each in its own transaction, with repeats."""
    errors: list[BaseException] = []
    written: list[str] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        import random

        rng = random.Random(n)
        try:
            with _conn(pg) as conn:
                for _ in range(40):
                    project = rng.choice(["proj-a", "proj-b", "proj-c"])
                    ids = [_id() for _ in range(rng.randint(1, 3))]
                    with conn.transaction():
                        for event_id in ids:
                            conn.execute(
                                INSERT + " ON CONFLICT (event_id) DO NOTHING", (event_id, project)
                            )
                        conn.execute(
                            INSERT + " ON CONFLICT (event_id) DO NOTHING", (ids[0], project)
                        )
                    with lock:
                        written.extend(ids)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    slots = pg.slots()
    assert sum(len(s) for s in slots.values()) == len(written)
    for project, found in slots.items():
        assert found == list(range(1, len(found) + 1)), project
    assert pg.counters() == {p: len(s) for p, s in slots.items()}


# -- the publisher's lease and wake-up -------------------------------------------------------------
def test_a_lost_lease_connection_is_taken_again_or_refused(pg: OutboxBackend) -> None:
    store = pg.store()
    other = pg.store()

    def kill_lease() -> None:
        # The session holding this outbox's advisory lock, and no other test's.
        assert pg.schema is not None
        killed = pg.query(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' "
            f"AND l.granted AND l.objsubid = 2 AND l.classid = {LEASE_CLASS} "
            f"AND l.objid = hashtext('{pg.schema.name}')::oid"
        )
        assert killed == [(True,)]

    with store.publisher_lease():
        kill_lease()
        store.sendable(1, 1, None)  # no one else holds it: taken again
        with pytest.raises(PublisherLeaseHeld):
            other.publisher_lease().__enter__()
        kill_lease()
        # The lock died with its connection: the other takes it, and the first stops before it
        # selects anything to send.
        with other.publisher_lease():
            for _ in range(2):  # and keeps refusing while the other holds it
                with pytest.raises(PublisherLeaseHeld, match="rhumbatron publisher pid"):
                    store.sendable(1, 1, None)
        store.sendable(1, 1, None)  # the other let go: taken again


def test_a_commit_on_another_connection_wakes_the_publisher(pg: OutboxBackend) -> None:
    """With an hour-long poll interval, only the NOTIFY of another writer's commit can make the
    publisher look: the row is written by a plain INSERT, not through this store."""

    class WatchedSignal(CommitSignal):
        def __init__(self) -> None:
            super().__init__()
            self.waiting = threading.Event()

        def wait(self, seen: int, timeout: float) -> bool:
            self.waiting.set()
            return super().wait(seen, timeout)

    store = pg.store()
    signal = store.commits = WatchedSignal()
    kafka = SimulatedKafka()
    stop = threading.Event()
    with Publisher(
        store, lambda: kafka, stream_for=lambda p: "s", policy=policy(poll_interval_s=3600)
    ) as publisher:
        runner = threading.Thread(target=publisher.run, kwargs={"stop": stop}, daemon=True)
        runner.start()
        try:
            assert store.listening(60), "the listener never started"
            assert signal.waiting.wait(60), "the publisher never finished its first pass"
            wait_until(lambda: store.counts()[RowState.PUBLISHED] == 0, 5, "nothing yet")
            with _conn(pg) as conn:
                conn.execute(INSERT, (_id(), "proj-a"))
            wait_until(
                lambda: store.counts()[RowState.PUBLISHED] == 1,
                60,
                "the commit's NOTIFY woke the publisher and it published the row",
            )
        finally:
            stop.set()
            store.commits.notify()
            runner.join(30)
    assert not runner.is_alive()


# -- bad input -------------------------------------------------------------------------------------
def _open(url: str) -> PostgresOutbox:
    return PostgresOutbox(
        url, options=PostgresOptions(max_envelope_bytes=1024, missed_report_limit=10)
    )


def test_an_unreachable_url_names_host_port_and_database_never_the_password() -> None:
    with pytest.raises(Unreachable) as refused:
        _open("postgresql://rhumbatron:s3cret-pw@127.0.0.1:1/some_db")
    message = str(refused.value)
    assert "host 127.0.0.1 port 1 database some_db" in message
    assert "s3cret-pw" not in message
    good = server_url()
    wrong = good.replace("rhumbatron:", "rhumbatron:not-", 1)
    with pytest.raises(ServerRefused) as login:
        _open(wrong)
    assert "host 127.0.0.1 port 5432 database rhumbatron" in str(login.value)
    assert "password authentication failed" in str(login.value)
    assert "not-" not in str(login.value)


def test_a_database_without_the_schema_or_with_another_version_is_refused() -> None:
    bare = FreshSchema(init=False)
    try:
        with pytest.raises(OutboxSchemaError, match=r"holds no outbox in schema t_.*outbox init"):
            _open(bare.url)
        assert "created" in init_outbox(bare.url)
        assert "already" in init_outbox(bare.url)
        _open(bare.url).close()
        with bare.connect() as conn:
            conn.execute("UPDATE outbox_schema_version SET version = 7")
        with pytest.raises(OutboxSchemaError, match="schema version 7 .* knows versions 1 to 3"):
            _open(bare.url)
        with pytest.raises(OutboxSchemaError, match="version 7 .* knows versions 1 to 3"):
            init_outbox(bare.url)
    finally:
        bare.drop()


def test_a_stored_row_that_is_no_envelope_fails_and_holds_only_its_project(
    pg_v1: OutboxBackend,
) -> None:
    """SQL could write into a version 1 outbox what its checks let through but the envelope
    refuses (a control character in a name; version 2 refuses it at INSERT): the publisher fails
    that row with the reason, and its project waits."""
    pg = pg_v1
    bad, after, other = _id(), _id(), _id()
    with _conn(pg) as conn:
        conn.execute(
            "INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, change_id) "
            "VALUES (%s, 'task.completed', 'proj-a', 't', 'a', E'chg\\x01')",
            (bad,),
        )
        conn.execute(INSERT, (after, "proj-a"))
        conn.execute(INSERT, (other, "proj-b"))
    store = pg.store()
    kafka = SimulatedKafka()
    with Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        publisher.run_pass()
        publisher.run_pass()
    failed = store.get(bad)
    assert failed is not None and failed.state is RowState.FAILED
    assert "not a valid envelope" in (failed.last_error or "")
    assert "changeId" in (failed.last_error or "")
    assert [h.project_id for h in store.held_projects(10)] == ["proj-a"]
    assert store.get(after).state is RowState.PENDING
    assert store.get(other).state is RowState.PUBLISHED


def test_the_publishers_marks_do_not_wait_for_the_wal_and_writers_commits_do(
    pg: OutboxBackend,
) -> None:
    """Lost with a crash of the server, a mark only sends its row again (the consumers' claims
    absorb the copy); a writer's events must survive it."""
    store = pg.store()
    assert isinstance(store, PostgresOutbox)
    with store._bookkeeping("record publish results") as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    with store._conn("read") as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
