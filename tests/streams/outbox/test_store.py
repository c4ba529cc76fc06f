"""The outbox as a store, one contract over both backends (SQLite and PostgreSQL): one
transaction for the writer's change and its events, bad input refused (never dropped), the
single-publisher lease, purge leaving the counters alone, the stats shape, the in-process
wake-up and the capped pass. The SQLite file's own refusals and its lock file are tested here
too; PostgreSQL's own (its URL, schema, advisory lock, LISTEN/NOTIFY) in test_postgres.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streams.clock import ManualClock
from streams.errors import EnvelopeError, EnvelopeTooLarge, OutboxError, PublisherLocked
from streams.outbox import ops
from streams.outbox.store import OutboxStore, RowState, RowUpdate
from tests.support.environment import ROOT
from tests.support.outbox import OutboxBackend, drafts, sqlite_outbox
from tests.support.waiting import wait_until


def test_the_writers_change_and_its_events_commit_together(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    with store.transaction() as unit:
        unit.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, state TEXT)")
        unit.execute("INSERT INTO tasks VALUES ('t1', 'ready')")
    with store.transaction() as unit:
        unit.execute("UPDATE tasks SET state = 'done' WHERE id = 't1'")
        result = unit.append("proj-a", drafts("proj-a", 2), tenant_id="tenant-a")
    assert result.slots == [1, 2]
    assert [e.tenant_id for e in result.events] == ["tenant-a", "tenant-a"]

    class Crash(Exception):
        pass

    with pytest.raises(Crash), store.transaction() as unit:
        unit.execute("UPDATE tasks SET state = 'failed' WHERE id = 't1'")
        unit.append("proj-a", drafts("proj-a", 3), tenant_id="tenant-a")
        raise Crash
    assert outbox_backend.query("SELECT state FROM tasks") == [("done",)]
    assert outbox_backend.query("SELECT COUNT(*) FROM outbox") == [(2,)]
    assert store.last_slot("proj-a") == 2
    with store.transaction() as unit:
        assert unit.append("proj-a", drafts("proj-a", 1), tenant_id="t").slots == [3]


def test_invalid_events_are_refused_and_nothing_is_written(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    bad_type = dataclasses.replace(drafts("proj-a", 1)[0], event_type="Not A Type")
    with pytest.raises(EnvelopeError, match="eventType"), store.transaction() as unit:
        unit.append("proj-a", [*drafts("proj-a", 1), bad_type], tenant_id="t")
    huge = dataclasses.replace(
        drafts("proj-a", 1)[0], payload={"agentId": "a", "blob": "x" * 300_000}
    )
    with (
        pytest.raises(EnvelopeTooLarge, match="over the 262144-byte limit"),
        store.transaction() as unit,
    ):
        unit.append("proj-a", [huge], tenant_id="t")
    assert store.counts()[RowState.PENDING] == 0 and store.last_slot("proj-a") == 0


def test_an_outbox_transaction_cannot_nest(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    with (
        pytest.raises(OutboxError, match="inside an open outbox transaction"),
        store.transaction(),
        store.transaction(),
    ):
        pass


def test_missing_and_foreign_files_are_refused(tmp_path: Path) -> None:
    from streams.outbox.sqlite import SqliteOutbox

    options = sqlite_outbox(tmp_path / "x.db").options
    with pytest.raises(OutboxError, match=r"no outbox at .*missing\.db"):
        SqliteOutbox(tmp_path / "missing.db", options=options, create=False)
    (tmp_path / "notes.txt").write_text("not a database at all, but long enough to be read\n" * 50)
    with pytest.raises(OutboxError, match="is not a SQLite database"):
        SqliteOutbox(tmp_path / "notes.txt", options=options, create=False)
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    other.close()
    with pytest.raises(OutboxError, match="holds no outbox tables"):
        SqliteOutbox(tmp_path / "other.db", options=options, create=False)
    newer = sqlite3.connect(tmp_path / "x.db")
    newer.execute("PRAGMA user_version = 99")
    newer.close()
    with pytest.raises(OutboxError, match="schema version 99, newer than"):
        SqliteOutbox(tmp_path / "x.db", options=options, create=False)


def test_a_sqlite_writer_waits_for_the_write_lock_and_names_it_when_it_gives_up(
    tmp_path: Path,
) -> None:
    from streams.outbox.sqlite import SqliteOutbox

    store = sqlite_outbox(tmp_path / "o.db")  # waits up to 30 s
    impatient = SqliteOutbox(
        tmp_path / "o.db",
        options=dataclasses.replace(store.options, busy_timeout_s=0.2),
        create=False,
    )
    holder = sqlite3.connect(tmp_path / "o.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, mid-transaction
    with (
        pytest.raises(OutboxError, match=r"write waited 0\.2s for the database lock"),
        impatient.transaction() as unit,
    ):
        unit.append("proj-a", drafts("proj-a", 1), tenant_id="t")
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    with store.transaction() as unit:  # waits for the holder, then writes
        unit.append("proj-a", drafts("proj-a", 2), tenant_id="t")
    release.join()
    assert store.counts()[RowState.PENDING] == 2
    # Reads and commits still wait through SQLite's own handler, for the same time.
    assert store._conn().execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    for outbox in (store, impatient):
        outbox.close()
    holder.close()


def test_a_second_publisher_is_refused_with_the_holder_named(
    outbox_backend: OutboxBackend,
) -> None:
    store = outbox_backend.store()
    other = outbox_backend.store()
    with store.publisher_lease():
        with pytest.raises(PublisherLocked) as refused, other.publisher_lease():
            pass
        message = str(refused.value)
        assert f"pid {os.getpid()}" in message or f"process {os.getpid()}" in message
        assert store.location in message and "only one publisher may run per outbox" in message
    with other.publisher_lease():  # released: the next one may start
        pass


def test_a_second_sqlite_publisher_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    store = sqlite_outbox(tmp_path / "o.db")
    other = sqlite_outbox(tmp_path / "o.db")
    with store.publisher_lease():
        with pytest.raises(PublisherLocked) as refused, other.publisher_lease():
            pass
        message = str(refused.value)
        assert f"process {os.getpid()}" in message and str(tmp_path / "o.db") in message
        assert "only one publisher may run per outbox" in message
    with other.publisher_lease():  # released: the next one may start
        pass
    store.close()
    other.close()


def test_the_lease_dies_with_its_holder(outbox_backend: OutboxBackend) -> None:
    """Another process (another machine, for PostgreSQL) holds the lease: refused, naming that
    process; killed with SIGKILL, its lease goes with it (the file lock with the process, the
    advisory lock with its connection)."""
    outbox_backend.store().close()  # the outbox exists before the holder opens it
    address = outbox_backend.address
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; "
            "from tests.support.outbox import open_test_store; "
            f"lease = open_test_store({address!r}).publisher_lease(); lease.__enter__(); "
            "print('held', flush=True); time.sleep(600)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        store = outbox_backend.store()
        with (
            pytest.raises(PublisherLocked, match=f"(process|pid) {holder.pid} "),
            store.publisher_lease(),
        ):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        wait_until(lambda: _lease_free(store), 30, "the dead holder's lease was released")
    finally:
        holder.kill()
        holder.wait(30)


def _lease_free(store: OutboxStore) -> bool:
    try:
        with store.publisher_lease():
            return True
    except PublisherLocked:
        return False


def test_purge_removes_old_published_rows_and_never_resets_counters(
    outbox_backend: OutboxBackend,
) -> None:
    clock = ManualClock()
    store = outbox_backend.store(clock=clock)
    with store.transaction() as unit:
        old = unit.append("proj-a", drafts("proj-a", 3), tenant_id="t")
    now = clock.now().timestamp()
    store.apply(
        [RowUpdate(e.event_id, RowState.PUBLISHED, 0, 0, None, None, now) for e in old.events[:2]]
    )
    clock.advance(8 * 86400)
    with store.transaction() as unit:
        recent = unit.append("proj-a", drafts("proj-a", 1), tenant_id="t")
    store.apply(
        [
            RowUpdate(
                recent.events[0].event_id,
                RowState.PUBLISHED,
                0,
                0,
                None,
                None,
                clock.now().timestamp(),
            )
        ]
    )
    removed = ops.purge(store, older_than_s=7 * 86_400, now=clock.now().timestamp())
    assert removed == 2
    assert store.get(old.events[0].event_id) is None
    assert store.get(old.events[2].event_id) is not None  # unpublished: kept
    assert store.get(recent.events[0].event_id) is not None  # too recent: kept
    with store.transaction() as unit:
        assert unit.append("proj-a", drafts("proj-a", 1), tenant_id="t").slots == [5]
    with pytest.raises(OutboxError, match="needs a positive age"):
        ops.purge(store, older_than_s=0, now=0)
    assert outbox_backend.counters() == {"proj-a": 5}


def test_stats_shape(outbox_backend: OutboxBackend) -> None:
    clock = ManualClock()
    store = outbox_backend.store(clock=clock)
    with store.transaction() as unit:
        a = unit.append("proj-a", drafts("proj-a", 3), tenant_id="t")
        b = unit.append("proj-b", drafts("proj-b", 1), tenant_id="t")
    created = clock.now().timestamp()
    clock.advance(42)
    store.apply(
        [
            RowUpdate(
                a.events[0].event_id, RowState.FAILED, 10, 0, None, "MSG_SIZE_TOO_LARGE", None
            ),
            RowUpdate(b.events[0].event_id, RowState.PUBLISHED, 0, 0, None, None, created + 1),
        ]
    )
    shown = ops.stats(store, now=clock.now().timestamp(), row_limit=10).as_dict()
    for state in ("pending", "published", "retry_wait", "failed"):
        assert type(shown[state]) is int
    assert (shown["pending"], shown["published"], shown["retry_wait"], shown["failed"]) == (
        2,
        1,
        0,
        1,
    )
    assert shown["oldest_pending_age_s"] == 42.0
    assert shown["failed_rows"] == [
        {
            "event_id": a.events[0].event_id,
            "project_id": "proj-a",
            "slot": 1,
            "event_type": "task.completed",
            "attempts": 10,
            "last_error": "MSG_SIZE_TOO_LARGE",
        }
    ]
    assert shown["held_projects"] == [
        {
            "project_id": "proj-a",
            "failed_event_id": a.events[0].event_id,
            "failed_slot": 1,
            "rows_waiting": 2,
        }
    ]
    assert shown["outbox"] == store.location


def test_a_commit_wakes_a_waiting_publisher(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    generation = store.commits.generation
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(store.commits.wait(generation, 60)))
    waiter.start()
    time.sleep(0.05)
    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 1), tenant_id="t")
    waiter.join(10)
    assert woke == [True]
    # A transaction that appends nothing does not wake anyone.
    generation = store.commits.generation
    with store.transaction() as unit:
        unit.execute("SELECT 1")
    assert store.commits.generation == generation
    assert store.commits.wait(generation, 0.01) is False


def test_a_capped_pass_shares_rows_evenly_and_rotates(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    for n in range(5):
        with store.transaction() as unit:
            unit.append(f"proj-{n:02d}", drafts(f"proj-{n:02d}", 10), tenant_id="t")
    rows = store.sendable(10, 20, None)
    by_project: dict[str, list[int]] = {}
    for row in rows:
        by_project.setdefault(row.project_id, []).append(row.slot)
    assert by_project == {f"proj-{n:02d}": [1, 2, 3, 4] for n in range(5)}
    assert len(store.sendable(10, 1000, None)) == 50

    for n in range(5, 30):
        with store.transaction() as unit:
            unit.append(f"proj-{n:02d}", drafts(f"proj-{n:02d}", 2), tenant_id="t")
    first = store.sendable(10, 20, None)
    assert [(r.project_id, r.slot) for r in first] == [(f"proj-{n:02d}", 1) for n in range(20)]
    after = store.sendable(10, 20, "proj-19")
    expected = [f"proj-{n:02d}" for n in [*range(20, 30), *range(10)]]
    assert [r.project_id for r in after] == expected


def test_sqlite_writers_commit_durably_and_the_publishers_marks_without_waiting_for_the_disk(
    tmp_path: Path,
) -> None:
    """A writer's events survive a power cut (``synchronous`` as set, FULL by default); the
    publisher's marks are its own bookkeeping, committed without an fsync: lost, a row is sent
    again and the consumers' claims absorb the copy. Each transaction's level, as SQLite ran it."""
    from streams.outbox.sqlite import SqliteOutbox

    base = sqlite_outbox(tmp_path / "o.db")
    store = SqliteOutbox(
        tmp_path / "o.db",
        options=dataclasses.replace(base.options, synchronous="FULL"),
        create=False,
    )
    ran: list[str] = []
    conn = store._conn()
    conn.set_trace_callback(ran.append)

    def level_of_commits() -> list[str]:
        level, out = "", []
        for sql in ran:
            if sql.startswith("PRAGMA synchronous"):
                level = sql.split("=")[1].strip()
            elif sql == "COMMIT":
                out.append(level)
        return out

    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 2), tenant_id="t")
    rows = store.sendable(10, 10, None)
    store.apply(
        [
            RowUpdate(r.event_id, RowState.PUBLISHED, 0, 0, None, None, published_at=1.0)
            for r in rows
        ]
    )
    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 1), tenant_id="t")
    assert level_of_commits() == ["", "NORMAL", "FULL"], ran
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again after the marks
    assert store.counts()[RowState.PUBLISHED] == 2
    for outbox in (store, base):
        outbox.close()
