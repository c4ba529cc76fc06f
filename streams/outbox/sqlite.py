"""The embedded outbox backend: stdlib sqlite3 in WAL mode.

- The outbox tables live in the writer's own database file, so its state change and its events
  commit in one SQLite transaction. Write transactions start with ``BEGIN IMMEDIATE``: the
  database write lock is taken before the slot counter is read, so concurrent writers (threads
  or processes) queue for it (``busy_timeout``) instead of allocating the same slot.
- One connection per thread; WAL lets the publisher and operators read while writers write.
- One publisher per file: an ``fcntl.flock`` on ``<path>.publisher.lock``, which the kernel
  releases when the holder dies, however it dies.
- A file created here is 0600 (streams/files.py): the database is created empty before SQLite
  opens it, and SQLite gives its ``-wal`` and ``-shm`` files the database's mode. An existing
  outbox keeps its owner's mode.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from opentelemetry import trace

from streams import tracing
from streams.clock import Clock, SystemClock
from streams.errors import OutboxError, PublisherLocked, StoredRowInvalid
from streams.files import create_private, open_private
from streams.outbox.identity import new_outbox_id
from streams.outbox.sqlite_schema import (
    COLUMNS,
    IDENTITY_INSERT,
    IDENTITY_SELECT,
    IN_CHUNK,
    OPEN_SQL,
    PREFIXED_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    SqliteOptions,
    row_from_sql,
    sendable_row,
)
from streams.outbox.sqlite_writer import SqliteUnitOfWork
from streams.outbox.store import (
    AuditEntry,
    CommitSignal,
    HeldProject,
    OutboxRow,
    RowState,
    RowUpdate,
)

# A writer waiting for the write lock tries again after LOCK_POLL_MIN_S, doubling to LOCK_POLL_MAX_S.
LOCK_POLL_MIN_S = 0.0002
LOCK_POLL_MAX_S = 0.002


def _is_locked(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may already have rolled back on its own (e.g. disk full, interrupted).
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class SqliteOutbox:
    """An outbox in a SQLite file (the writer's own database)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        options: SqliteOptions,
        clock: Clock | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.options = options
        self.clock: Clock = clock or SystemClock()
        self.commits = CommitSignal()
        self._create = create
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        try:
            present = self.path.exists()
        except OSError as exc:  # a name too long, a path through a file
            raise OutboxError(f"cannot open the outbox at {self.path}: {exc.strerror}") from exc
        if not create and not present:
            raise OutboxError(
                f"no outbox at {self.path}: check the path (writers create the outbox on first "
                "use, e.g. rhumbatron produce --outbox PATH)"
            )
        if create:
            # A path SQLite cannot open (no such directory, a directory) is left to its open,
            # which says so in the outbox's words.
            with suppress(OSError):
                create_private(self.path)
        self._init_schema()

    # -- connections -----------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            target = str(self.path) if self._create else f"{self.path.absolute().as_uri()}?mode=rw"
            try:
                conn = sqlite3.connect(
                    target,
                    timeout=self.options.busy_timeout_s,
                    isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                    check_same_thread=False,  # close() may run on another thread
                    uri=not self._create,
                )
                conn.execute(f"PRAGMA synchronous = {self._synchronous()}")
            except sqlite3.Error as exc:
                raise self._translate(exc, "open") from exc
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _synchronous(self) -> str:
        mode = self.options.synchronous.upper()
        if mode not in ("FULL", "NORMAL"):
            raise OutboxError(
                f"outbox_sqlite_synchronous must be FULL or NORMAL, got {self.options.synchronous!r}"
            )
        return mode

    def _translate(self, exc: sqlite3.Error, doing: str) -> OutboxError:
        text = str(exc)
        if _is_locked(exc):
            return OutboxError(
                f"outbox {self.path}: {doing} waited {self.options.busy_timeout_s:g}s for the "
                "database lock held by another writer (outbox_busy_timeout_s); retry, or look for "
                "a transaction that stays open"
            )
        if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
            return OutboxError(f"{self.path} is not a SQLite database, so not an outbox")
        if "unable to open database file" in text:
            return OutboxError(
                f"outbox {self.path}: {doing} failed: {text}; the path must be a file (not a "
                "directory) in a directory that exists and that this process may write"
            )
        return OutboxError(f"outbox {self.path}: {doing} failed: {text}")

    @contextmanager
    def _write(self, doing: str, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction. ``durable`` false: the publisher's own bookkeeping (rows marked
        published, retries released, failures recorded), committed without waiting for the disk
        (``synchronous = NORMAL`` for that transaction): lost with a power cut, a mark means the
        row is sent again, which the consumers' claims absorb, as after a crash between Kafka's
        acknowledgement and the mark; its fsync was a pass's longest wait (up to ~10 ms here)."""
        conn = self._conn()
        if conn.in_transaction:
            raise OutboxError(
                f"outbox {self.path}: {doing} inside an open outbox transaction on the same "
                "thread; finish that transaction first"
            )
        if not durable:
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            self._begin_immediate(conn, doing)
            try:
                yield conn
            except BaseException:
                _rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise self._translate(exc, doing) from exc
        finally:
            if not durable:
                conn.execute(f"PRAGMA synchronous = {self._synchronous()}")

    def _begin_immediate(self, conn: sqlite3.Connection, doing: str) -> None:
        """Take the write lock, waiting up to ``busy_timeout_s`` for it in steps of at most
        LOCK_POLL_MAX_S. SQLite's own busy handler sleeps 1, 2, 5, ... up to 100 ms between
        tries: beside a writer that commits every millisecond, the publisher marking its rows
        found the lock free only by chance and waited whole seconds (docs/performance.md)."""
        conn.execute("PRAGMA busy_timeout = 0")
        deadline = time.monotonic() + self.options.busy_timeout_s
        pause = LOCK_POLL_MIN_S
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if not _is_locked(exc) or time.monotonic() >= deadline:
                        raise self._translate(exc, doing) from exc
                except sqlite3.Error as exc:
                    raise self._translate(exc, doing) from exc
                time.sleep(pause)
                pause = min(pause * 2, LOCK_POLL_MAX_S)
        finally:
            # Everything else (a read meeting a checkpoint, say) waits as SQLite's handler does.
            conn.execute(f"PRAGMA busy_timeout = {round(self.options.busy_timeout_s * 1000)}")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._translate(exc, "read") from exc

    def _init_schema(self) -> None:
        conn = self._conn()
        try:
            if self._create:
                conn.execute("PRAGMA journal_mode = WAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {
                name
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name IN ('outbox', 'outbox_identity')"
                )
            }
            identified = "outbox_identity" in tables and conn.execute(IDENTITY_SELECT).fetchone()
        except sqlite3.Error as exc:
            raise self._translate(exc, "open") from exc
        if version > SCHEMA_VERSION:
            raise OutboxError(
                f"outbox {self.path} has schema version {version}, newer than this release "
                f"understands ({SCHEMA_VERSION}); upgrade rhumbatron"
            )
        if "outbox" in tables and version == SCHEMA_VERSION and identified:
            return
        if "outbox" not in tables and not self._create:
            raise OutboxError(f"{self.path} is a SQLite database but holds no outbox tables")
        # Also an outbox made before its identity table: it gets one now, once, whoever opens
        # it first (the write lock orders racing openers; the identity's key keeps the first).
        with self._write("create the outbox tables") as conn:
            # Statement by statement: executescript would commit the open transaction first.
            for statement in filter(None, (part.strip() for part in SCHEMA.split(";"))):
                conn.execute(statement)
            conn.execute(IDENTITY_INSERT, (new_outbox_id(), self.clock.now().timestamp()))
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def outbox_id(self) -> str | None:
        found = self._read(IDENTITY_SELECT)
        return str(found[0][0]) if found else None

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # -- writers ---------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[SqliteUnitOfWork]:
        with (
            tracing.tracer(__name__).start_as_current_span(
                "outbox.write", kind=trace.SpanKind.INTERNAL
            ) as span,
            self._write("write") as conn,
        ):
            unit = SqliteUnitOfWork(
                conn, options=self.options, clock=self.clock, now=self.clock.now().timestamp()
            )
            yield unit
            span.set_attribute("rhumbatron.outbox.appended", unit.appended)
        if unit.appended:
            self.commits.notify()

    # -- the publisher ---------------------------------------------------------------------------
    @contextmanager
    def publisher_lease(self) -> Iterator[None]:
        lock_path = f"{self.path}.publisher.lock"
        try:
            # held for the lease's lifetime
            handle = open(open_private(lock_path, os.O_RDWR), "r+")  # noqa: SIM115
        except OSError as exc:
            raise OutboxError(
                f"outbox {self.path}: cannot open the publisher's lock file {lock_path}: "
                f"{exc.strerror}; it must be a writable file beside the outbox"
            ) from exc
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                text = handle.read().strip()
                raise PublisherLocked(
                    str(self.path), int(text) if text.isdigit() else None, lock_path
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
        finally:
            handle.close()  # closing the file releases the lock

    def release_due(self, now: float) -> int:
        with self._write("release due retries", durable=False) as conn:
            return conn.execute(
                "UPDATE outbox SET state = 'pending' "
                "WHERE state = 'retry_wait' AND next_attempt_at <= ?",
                (now,),
            ).rowcount

    def sendable(
        self, rows_per_project: int, max_rows: int, after_project: str | None
    ) -> list[OutboxRow]:
        # Heads first (one scan of the small open-rows index; SQLite takes the bare ``state``
        # from the row holding MIN(slot)), then each pending head's next rows by index range: a
        # window function over every open row cost ~20x more with a 50,000-row backlog.
        found = self._read(
            "WITH heads AS ("
            "  SELECT project_id, MIN(slot) AS head, state FROM outbox"
            f"  WHERE state IN {OPEN_SQL} GROUP BY project_id"
            "), share AS ("
            "  SELECT MAX(1, MIN(?, ? / MAX(COUNT(*), 1))) AS k FROM heads WHERE state = 'pending'"
            f") SELECT {PREFIXED_COLUMNS} FROM heads h CROSS JOIN share JOIN outbox o"
            "  ON o.project_id = h.project_id AND o.slot >= h.head AND o.slot < h.head + share.k"
            f" WHERE h.state = 'pending' AND o.state IN {OPEN_SQL}"
            " ORDER BY h.project_id <= ?, h.project_id, o.slot LIMIT ?",
            (rows_per_project, max_rows, after_project or "", max_rows),
        )
        rows: list[OutboxRow] = []
        bad: dict[Any, str] = {}
        cut: set[Any] = set()
        for values in found:
            if values[1] in cut:
                continue
            try:
                rows.append(sendable_row(values, self.options.max_envelope_bytes))
            except StoredRowInvalid as exc:
                # Written past our writer (by hand, by another program): the row fails and holds
                # its project, as a row the broker refuses would; the other projects flow.
                cut.add(values[1])
                if values[6] == RowState.PENDING:
                    bad[values[0]] = str(exc)
        if bad:
            with self._write("fail invalid rows", durable=False) as conn:
                conn.executemany(
                    "UPDATE outbox SET state = 'failed', last_error = ? "
                    "WHERE event_id = ? AND state = 'pending'",
                    [(error, event_id) for event_id, error in bad.items()],
                )
        return rows

    def next_due_at(self) -> float | None:
        found = self._read("SELECT MIN(next_attempt_at) FROM outbox WHERE state = 'retry_wait'")
        return None if found[0][0] is None else float(found[0][0])

    def apply(self, updates: Sequence[RowUpdate]) -> int:
        if not updates:
            return 0
        # The common verdict, published, goes in chunks of IN (...): several times faster than
        # one UPDATE per row, which matters at tens of thousands of rows a second.
        published: dict[float | None, list[str]] = {}
        others: list[RowUpdate] = []
        for u in updates:
            if u.state is RowState.PUBLISHED:  # counters and last_error stay as they are
                published.setdefault(u.published_at, []).append(u.event_id)
            else:
                others.append(u)
        changed = 0
        with self._write("record publish results", durable=False) as conn:
            for at, ids in published.items():
                for start in range(0, len(ids), IN_CHUNK):
                    chunk = ids[start : start + IN_CHUNK]
                    changed += conn.execute(
                        "UPDATE outbox SET state = 'published', published_at = ?, "
                        "next_attempt_at = NULL "
                        f"WHERE state = 'pending' AND event_id IN ({','.join('?' * len(chunk))})",
                        [at, *chunk],
                    ).rowcount
            changed += conn.executemany(
                "UPDATE outbox SET state = ?, attempts = ?, deferrals = ?, next_attempt_at = ?, "
                "last_error = ?, published_at = ? WHERE event_id = ? AND state = 'pending'",
                [
                    (
                        u.state.value,
                        u.attempts,
                        u.deferrals,
                        u.next_attempt_at,
                        u.last_error,
                        u.published_at,
                        u.event_id,
                    )
                    for u in others
                ],
            ).rowcount
        return changed

    # -- operators -------------------------------------------------------------------------------
    def counts(self) -> dict[RowState, int]:
        counts = dict.fromkeys(RowState, 0)
        for state, n in self._read("SELECT state, COUNT(*) FROM outbox GROUP BY state"):
            counts[RowState(state)] = int(n)
        return counts

    def oldest_unpublished_at(self) -> float | None:
        found = self._read(
            f"SELECT MIN(created_at) FROM outbox WHERE state IN {OPEN_SQL} AND state != 'failed'"
        )
        return None if found[0][0] is None else float(found[0][0])

    def rows_in_state(self, state: RowState, limit: int) -> list[OutboxRow]:
        found = self._read(
            f"SELECT {COLUMNS} FROM outbox WHERE state = ? ORDER BY project_id, slot LIMIT ?",
            (state.value, limit),
        )
        return [row_from_sql(r) for r in found]

    def held_projects(self, limit: int) -> list[HeldProject]:
        found = self._read(
            "SELECT project_id, event_id, slot, waiting FROM ("
            "  SELECT project_id, event_id, slot, state, "
            "   ROW_NUMBER() OVER (PARTITION BY project_id ORDER BY slot) AS rn, "
            "   COUNT(*) OVER (PARTITION BY project_id) - 1 AS waiting "
            f"  FROM outbox WHERE state IN {OPEN_SQL}"
            ") WHERE rn = 1 AND state = 'failed' ORDER BY project_id LIMIT ?",
            (limit,),
        )
        return [HeldProject(r[0], r[1], int(r[2]), int(r[3])) for r in found]

    def get(self, event_id: str) -> OutboxRow | None:
        found = self._read(f"SELECT {COLUMNS} FROM outbox WHERE event_id = ?", (event_id,))
        return row_from_sql(found[0]) if found else None

    def operator_transition(
        self,
        event_id: str,
        *,
        allowed: frozenset[RowState],
        to: RowState,
        who: str,
        action: str,
        reason: str | None,
        at: float,
    ) -> tuple[OutboxRow | None, bool]:
        with self._write(action) as conn:
            found = conn.execute(
                f"SELECT {COLUMNS} FROM outbox WHERE event_id = ?", (event_id,)
            ).fetchone()
            if found is None:
                return None, False
            row = row_from_sql(found)
            if row.state not in allowed:
                return row, False
            conn.execute(
                "UPDATE outbox SET state = ?, attempts = 0, deferrals = 0, next_attempt_at = NULL "
                "WHERE event_id = ?",
                (to.value, event_id),
            )
            conn.execute(
                "INSERT INTO outbox_audit (at, who, action, event_id, project_id, slot, "
                "from_state, reason, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    at,
                    who,
                    action,
                    event_id,
                    row.project_id,
                    row.slot,
                    row.state.value,
                    reason,
                    row.last_error,
                ),
            )
        self.commits.notify()
        return row, True

    def audit_log(self, event_id: str | None, limit: int) -> list[AuditEntry]:
        where, params = ("WHERE event_id = ?", [event_id]) if event_id else ("", [])
        found = self._read(
            f"SELECT {AuditEntry.COLUMNS} FROM outbox_audit {where} ORDER BY id LIMIT ?",
            [*params, limit],
        )
        return [AuditEntry.from_row(r) for r in found]

    def purge_published(self, before: float) -> int:
        with self._write("purge") as conn:
            return conn.execute(
                "DELETE FROM outbox WHERE state = 'published' AND published_at < ?", (before,)
            ).rowcount

    def last_slot(self, project_id: str) -> int:
        found = self._read("SELECT last_slot FROM outbox_slots WHERE project_id = ?", (project_id,))
        return int(found[0][0]) if found else 0
