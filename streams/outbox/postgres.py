"""The PostgreSQL outbox backend (psycopg 3 and psycopg_pool), behind the same
:class:`~streams.outbox.store.OutboxStore` contract as the SQLite one.

- The schema is versioned SQL files shipped beside this module (``postgres_schema_v1.sql``,
  ``postgres_schema_v2.sql`` which moves version 1 to 2: the INSERT's checks, and
  ``postgres_schema_v3.sql`` which moves 2 to 3: the outbox's identity), applied by
  :func:`init_outbox` (``rhumbatron outbox init``) into the first schema of the URL's
  search_path, moved on by :func:`migrate_outbox` (``rhumbatron outbox migrate``, online) and
  checked when a store opens: no schema says to run ``outbox init``; a version this release
  does not know refuses, naming both.
- Slots come from the schema's trigger, under the project's counter row lock held until the
  writer commits, so they are dense under concurrent writers on any number of machines. Writers
  here go through ``rhumbatron_append`` (:mod:`streams.outbox.postgres_writer`).
- One publisher per outbox: a session advisory lock on a connection of its own (not the pool's).
  The lock lives with that connection; the store checks it before every selection, so after a
  lost connection nothing is sent until the lock is taken again (or the publisher stops, naming
  the new holder).
- Wake-up: the schema's trigger NOTIFYs at commit; a listening thread (started with the lease)
  wakes the publisher through :class:`~streams.outbox.store.CommitSignal`. The poll interval
  stays the backstop.
- The URL is a secret: every message shows it masked (:func:`streams.urls.masked`), and a
  connection failure names host, port and database only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from opentelemetry import trace
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from streams import tracing
from streams.clock import Clock, SystemClock
from streams.errors import (
    EnvelopeError,
    OutboxError,
    OutboxSchemaError,
    PublisherLeaseHeld,
    ServerRefused,
    Unreachable,
)
from streams.outbox import postgres_checks, stored
from streams.outbox.postgres_writer import PostgresUnitOfWork
from streams.outbox.store import (
    AuditEntry,
    CommitSignal,
    HeldProject,
    OutboxRow,
    RowState,
    RowUpdate,
)
from streams.urls import masked

log = logging.getLogger("rhumbatron.outbox.postgres")

# The schema's versions, each a file that moves the one before to it (version 1 makes the
# outbox). `outbox init` applies them all; `outbox migrate` those above the installed one.
SCHEMA_FILES = {
    1: "postgres_schema_v1.sql",
    2: "postgres_schema_v2.sql",
    3: "postgres_schema_v3.sql",
}
# The version that made the outbox's identity (streams.outbox.identity).
IDENTITY_VERSION = 3
SCHEMA_VERSION = max(SCHEMA_FILES)
# The setting's default, for callers without settings (init_outbox's tests).
DEFAULT_MAX_ENVELOPE_BYTES = 256 * 1024
NOTIFY_CHANNEL = "rhumbatron_outbox"
# The publisher lease: pg_try_advisory_lock(LEASE_CLASS, hashtext(schema)), the two-key form,
# which never meets the one-key locks the slot trigger takes on event ids.
LEASE_CLASS = 0x5248  # "RH"

_OPEN = "('pending', 'retry_wait', 'failed')"
_COLUMNS = (
    "o.event_id, o.project_id, o.slot, o.event_type, outbox_envelope(o)::text, o.trace_context, "
    "o.state, o.attempts, o.deferrals, o.next_attempt_at, o.last_error, "
    "extract(epoch FROM o.created_at)::float8, o.published_at"
)


def schema_sql(version: int = SCHEMA_VERSION) -> str:
    """The shipped file that moves the schema from ``version - 1`` to ``version``."""
    return (
        resources.files("streams.outbox")
        .joinpath(SCHEMA_FILES[version])
        .read_text(encoding="utf-8")
    )


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """The backend's knobs; the commands take them from settings (the outbox_postgres_* ones,
    router/wiring/outbox.py), the defaults here are those settings' defaults."""

    max_envelope_bytes: int
    missed_report_limit: int  # most missed events an append reports back
    pool_size: int = 8  # writer and publisher connections of one process
    connect_timeout_s: float = 10.0  # connecting, and waiting for a pooled connection
    listen_tick_s: float = 0.25  # how often the listening thread looks up from its wait
    # TCP keepalives: a silent peer (a network partition) is noticed within about three times
    # this, so the publisher's lease connection cannot hang on unnoticed.
    keepalive_s: float = 10.0


def tcp_options(keepalive_s: float) -> dict[str, Any]:
    """libpq's keepalive parameters for every connection the outbox opens."""
    idle = max(1, round(keepalive_s))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": idle,
        "keepalives_count": 3,
        "tcp_user_timeout": idle * 3 * 1000,
    }


def where(url: str) -> str:
    """Host, port and database of ``url``: what a message names (never the password)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return masked(url)
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return f"host {host} port {parts.get('port') or 5432} database {parts.get('dbname') or '?'}"


def _scrub(text: str, url: str) -> str:
    with suppress(psycopg.ProgrammingError):
        password = conninfo_to_dict(url).get("password")
        if password:
            text = text.replace(str(password), "****")
    return text


def _reason(exc: Exception, url: str) -> str:
    """What libpq said went wrong, on one line: its last line that is not an indented hint (a
    refused connection ends with "Is the server running on that host …", which names no
    reason), the password masked."""
    lines = [line for line in str(exc).strip().splitlines() if line and not line[0].isspace()]
    return _scrub(lines[-1] if lines else repr(exc), url)


def connect(
    url: str,
    *,
    timeout_s: float,
    autocommit: bool,
    application_name: str,
    keepalive_s: float = 10.0,
) -> psycopg.Connection[Any]:
    """One connection, or an error that names host, port and database (never the password)."""
    try:
        return psycopg.connect(
            url,
            autocommit=autocommit,
            connect_timeout=max(2, round(timeout_s)),
            application_name=application_name,
            **tcp_options(keepalive_s),
        )
    except psycopg.OperationalError as exc:
        detail = _reason(exc, url)
        if "authentication failed" in detail or "does not exist" in detail:
            raise ServerRefused("PostgreSQL", where(url), detail) from None
        raise Unreachable("PostgreSQL", where(url), detail) from None
    except psycopg.ProgrammingError as exc:
        raise OutboxError(f"not a usable PostgreSQL outbox URL ({masked(url)}): {exc}") from None


def _current_schema(conn: psycopg.Connection[Any], url: str) -> str:
    found = conn.execute("SELECT current_schema()").fetchone()
    if found is None or found[0] is None:
        raise OutboxSchemaError(
            f"PostgreSQL at {where(url)}: no schema of the search_path exists; create it, or "
            "point the URL's search_path (options=-csearch_path=NAME) at one"
        )
    return str(found[0])


def _installed_version(conn: psycopg.Connection[Any]) -> int | None:
    found = conn.execute("SELECT to_regclass('outbox_schema_version') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return None
    row = conn.execute("SELECT max(version) FROM outbox_schema_version").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _unknown(url: str, schema: str, version: int) -> OutboxSchemaError:
    return OutboxSchemaError(
        f"PostgreSQL at {where(url)} holds outbox schema version {version} in schema {schema}, "
        f"but this release knows versions 1 to {SCHEMA_VERSION}: a newer release made it; run "
        f"that release (or a later one), never an older one, against it"
    )


def check_schema(conn: psycopg.Connection[Any], url: str) -> str:
    """The outbox's schema name, after checking it holds a version this release reads: this
    one, or an older one being migrated (its writers and publishers keep working)."""
    schema = _current_schema(conn, url)
    version = _installed_version(conn)
    conn.rollback()
    if version is None:
        raise OutboxSchemaError(
            f"PostgreSQL at {where(url)} holds no outbox in schema {schema}: run "
            "`rhumbatron outbox init --outbox URL` first"
        )
    if version not in SCHEMA_FILES:
        raise _unknown(url, schema, version)
    if version < SCHEMA_VERSION:
        log.warning(
            "outbox in schema %s at %s is at schema version %s; this release's is %s: run "
            "`rhumbatron outbox migrate --outbox URL` (online; writers and publishers keep going)",
            schema,
            where(url),
            version,
            SCHEMA_VERSION,
        )
    return schema


@contextmanager
def _schema_change(
    url: str, *, doing: str, connect_timeout_s: float, keepalive_s: float
) -> Iterator[tuple[psycopg.Connection[Any], str, int | None]]:
    """One transaction for init or migrate: the outbox's schema, its installed version (None:
    no outbox), under a lock that makes a second init or migrate wait for this one. Functions
    pin the search_path they are made under: exactly the outbox's schema. Commits at the end."""
    with connect(
        url,
        timeout_s=connect_timeout_s,
        autocommit=False,
        application_name=f"rhumbatron {doing}",
        keepalive_s=keepalive_s,
    ) as conn:
        schema = _current_schema(conn, url)
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (LEASE_CLASS + 1, schema))
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
        yield conn, schema, _installed_version(conn)
        conn.commit()


def _apply(
    conn: psycopg.Connection[Any], url: str, schema: str, versions: range, max_envelope_bytes: int
) -> None:
    try:
        for version in versions:
            conn.execute(schema_sql(version).encode())
        postgres_checks.write(conn, max_envelope_bytes=max_envelope_bytes)
    except psycopg.Error as exc:
        raise OutboxError(
            f"applying the outbox schema to {where(url)} (schema {schema}) failed: "
            f"{exc.diag.message_primary or exc}"
        ) from exc


def init_outbox(
    url: str,
    *,
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
    connect_timeout_s: float = 10.0,
    keepalive_s: float = 10.0,
) -> str:
    """Apply the shipped schema, every version in order, in one transaction; on an outbox of
    this version, write its limits (from the settings) and the catalog's payload rules again.
    An older version is refused (``outbox migrate`` moves it), as is an unknown one. Returns a
    line saying what was done."""
    with _schema_change(
        url, doing="init", connect_timeout_s=connect_timeout_s, keepalive_s=keepalive_s
    ) as (conn, schema, version):
        if version == SCHEMA_VERSION:
            _apply(conn, url, schema, range(0), max_envelope_bytes)
            return (
                f"outbox schema version {version} already in schema {schema} at {where(url)} "
                f"(limits and payload rules written again); {_identity_line(conn)}"
            )
        if version is not None and version in SCHEMA_FILES:
            raise OutboxSchemaError(
                f"PostgreSQL at {where(url)} holds outbox schema version {version} in schema "
                f"{schema}; this release's is {SCHEMA_VERSION}: run `rhumbatron outbox migrate "
                f"--outbox URL` to move it (online), not init"
            )
        if version is not None:
            raise _unknown(url, schema, version)
        _apply(conn, url, schema, range(1, SCHEMA_VERSION + 1), max_envelope_bytes)
        return (
            f"outbox schema version {SCHEMA_VERSION} created in schema {schema} at {where(url)}; "
            f"{_identity_line(conn)}"
        )


def migrate_outbox(
    url: str,
    *,
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
    connect_timeout_s: float = 10.0,
    keepalive_s: float = 10.0,
) -> str:
    """Move an outbox of an older version to this release's, online, in one transaction (the
    steps add tables and functions; no row is touched). On this version it only writes the
    limits and payload rules again, so it is safe to repeat. Returns a line saying what was
    done."""
    with _schema_change(
        url, doing="migrate", connect_timeout_s=connect_timeout_s, keepalive_s=keepalive_s
    ) as (conn, schema, version):
        if version is None:
            raise OutboxSchemaError(
                f"PostgreSQL at {where(url)} holds no outbox in schema {schema} to migrate: run "
                "`rhumbatron outbox init --outbox URL` to make one"
            )
        if version not in SCHEMA_FILES:
            raise _unknown(url, schema, version)
        _apply(conn, url, schema, range(version + 1, SCHEMA_VERSION + 1), max_envelope_bytes)
        if version == SCHEMA_VERSION:
            return (
                f"outbox in schema {schema} at {where(url)} is already at schema version "
                f"{version} (limits and payload rules written again); {_identity_line(conn)}"
            )
        return (
            f"outbox in schema {schema} at {where(url)} migrated from schema version {version} "
            f"to {SCHEMA_VERSION}; {_identity_line(conn)}"
        )


def read_outbox_id(conn: psycopg.Connection[Any]) -> str | None:
    """The outbox's identity; None below schema version 3 (no identity table yet)."""
    found = conn.execute("SELECT to_regclass('outbox_identity') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return None
    row = conn.execute("SELECT outbox_id FROM outbox_identity").fetchone()
    return None if row is None else str(row[0])


def _identity_line(conn: psycopg.Connection[Any]) -> str:
    return f"identity {read_outbox_id(conn)}"


def _canonical(text: str, max_bytes: int) -> bytes:
    return stored.stored_event_bytes(text, max_bytes=max_bytes)


def _row(values: Sequence[Any], envelope: bytes) -> OutboxRow:
    return OutboxRow(
        event_id=values[0],
        project_id=values[1],
        slot=int(values[2]),
        event_type=values[3],
        envelope=envelope,
        # jsonb of any shape: a writer's INSERT may put a string or an array there.
        trace_context=stored.trace_context(values[5]),
        state=RowState(values[6]),
        attempts=int(values[7]),
        deferrals=int(values[8]),
        next_attempt_at=values[9],
        last_error=values[10],
        created_at=float(values[11]),
        published_at=values[12],
    )


class PostgresOutbox:
    """An outbox in a PostgreSQL database (the writers' own)."""

    def __init__(self, url: str, *, options: PostgresOptions, clock: Clock | None = None) -> None:
        self.url = url
        self.location = masked(url)
        self.options = options
        self.clock: Clock = clock or SystemClock()
        self.commits = CommitSignal()
        self._where = where(url)
        self._local = threading.local()
        self._app = f"rhumbatron pid {os.getpid()} on {socket.gethostname()}"
        with connect(
            url,
            timeout_s=options.connect_timeout_s,
            autocommit=False,
            application_name=self._app,
            keepalive_s=options.keepalive_s,
        ) as conn:
            self.schema = check_schema(conn, url)
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(options.pool_size, 1),
            kwargs={
                "autocommit": False,
                "application_name": self._app,
                **tcp_options(options.keepalive_s),
            },
            timeout=options.connect_timeout_s,
            # A connection is checked as it is handed out, so one that died with a server restart
            # is replaced instead of failing the next write or pass.
            check=ConnectionPool.check_connection,
            open=False,
            name="rhumbatron-outbox",
        )
        self._pool.open(wait=False)
        self._lease: psycopg.Connection[Any] | None = None
        self._leasing = False  # inside publisher_lease(): selections need the lock
        self._lease_lock = threading.Lock()
        self._listener: threading.Thread | None = None
        self._listening = threading.Event()
        self._stop_listening = threading.Event()

    # -- connections -----------------------------------------------------------------------------
    def _translate(self, exc: Exception, doing: str) -> OutboxError | Unreachable:
        if isinstance(exc, PoolTimeout):
            return Unreachable(
                "PostgreSQL",
                self._where,
                f"{doing}: no connection within {self.options.connect_timeout_s:g}s "
                "(server down, or every pooled connection busy)",
            )
        if isinstance(exc, psycopg.OperationalError):
            return Unreachable("PostgreSQL", self._where, f"{doing}: {_reason(exc, self.url)}")
        detail = exc.diag.message_primary if isinstance(exc, psycopg.Error) else None
        return OutboxError(f"outbox {self.location}: {doing} failed: {detail or exc}")

    @contextmanager
    def _conn(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection whose work commits at the end (rolls back on an exception)."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._translate(exc, doing) from exc

    @contextmanager
    def _bookkeeping(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """:meth:`_conn` for the publisher's own bookkeeping (rows marked published, retries
        released, failures recorded): committed without waiting for the WAL's flush
        (``synchronous_commit`` off for that transaction). Lost with a crash of the server, a
        mark means the row is sent again, which the consumers' claims absorb, as after a crash
        between Kafka's acknowledgement and the mark; the writers' commits stay durable."""
        with self._conn(doing) as conn:
            conn.execute("SET LOCAL synchronous_commit = off")
            yield conn

    def _read(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._conn("read") as conn:
            return conn.execute(query.encode(), params or None).fetchall()

    def close(self) -> None:
        self._end_lease()
        self._pool.close()

    # -- writers ---------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[PostgresUnitOfWork]:
        if getattr(self._local, "open", False):
            raise OutboxError(
                f"outbox {self.location}: write inside an open outbox transaction on the same "
                "thread; finish that transaction first"
            )
        self._local.open = True
        try:
            with tracing.tracer(__name__).start_as_current_span(
                "outbox.write", kind=trace.SpanKind.INTERNAL
            ) as span:
                try:
                    conn = self._pool.getconn()
                except PoolTimeout as exc:
                    raise self._translate(exc, "write") from exc
                unit = PostgresUnitOfWork(
                    conn,
                    max_envelope_bytes=self.options.max_envelope_bytes,
                    missed_report_limit=self.options.missed_report_limit,
                    clock=self.clock,
                )
                try:
                    yield unit
                except BaseException:
                    with suppress(psycopg.Error):
                        conn.rollback()
                    self._pool.putconn(conn)
                    raise
                try:
                    conn.commit()
                except psycopg.Error as exc:
                    with suppress(psycopg.Error):
                        conn.rollback()
                    raise self._translate(exc, "commit") from exc
                finally:
                    self._pool.putconn(conn)
                span.set_attribute("rhumbatron.outbox.appended", unit.appended)
        finally:
            self._local.open = False
        if unit.appended:
            self.commits.notify()

    # -- the publisher's lease and wake-up -------------------------------------------------------
    def _lock_name(self) -> str:
        return f"the PostgreSQL advisory lock ({LEASE_CLASS}, hashtext('{self.schema}'))"

    def _take_lease(self) -> psycopg.Connection[Any]:
        conn = connect(
            self.url,
            timeout_s=self.options.connect_timeout_s,
            autocommit=True,
            application_name=f"rhumbatron publisher pid {os.getpid()} on {socket.gethostname()}",
            keepalive_s=self.options.keepalive_s,
        )
        try:
            found = conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LEASE_CLASS, self.schema)
            ).fetchone()
            if found and found[0]:
                return conn
            holder = conn.execute(
                "SELECT a.application_name, a.pid, host(a.client_addr) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                "AND l.granted AND l.objsubid = 2 AND l.classid = %s::oid "
                "AND l.objid = hashtext(%s)::oid AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (LEASE_CLASS, self.schema),
            ).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise self._translate(exc, "take the publisher lease") from exc
        conn.close()
        if holder is None:
            name = "another session (it has just let go: try again)"
        else:
            app, pid, client = holder
            name = f"{app or 'a session'} (PostgreSQL backend {pid}, from {client or 'a local socket'})"
        raise PublisherLeaseHeld(self.location, name, self._lock_name())

    @contextmanager
    def publisher_lease(self) -> Iterator[None]:
        with self._lease_lock:
            self._lease = self._take_lease()
            self._leasing = True
        self._stop_listening.clear()
        self._listener = threading.Thread(target=self._listen, name="outbox-listen", daemon=True)
        self._listener.start()
        try:
            yield
        finally:
            self._end_lease()

    def _end_lease(self) -> None:
        self._stop_listening.set()
        with self._lease_lock:
            if self._lease is not None and self._listening.is_set():
                # Wakes the listener from its wait, so it sees the stop at once.
                with suppress(psycopg.Error):
                    self._lease.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.join(self.options.listen_tick_s * 4 + self.options.connect_timeout_s)
        with self._lease_lock:
            lease, self._lease = self._lease, None
            self._leasing = False
        if lease is not None:
            lease.close()  # closing the session releases the lock

    def _check_lease(self) -> None:
        """Before anything is selected for sending: the lease is still ours, or is taken again,
        or this raises (PublisherLeaseHeld naming the new holder, or Unreachable)."""
        with self._lease_lock:
            if not self._leasing:
                return  # not a publisher (operators, tests reading the store)
            if self._lease is not None:
                try:
                    self._lease.execute("SELECT 1")
                    return
                except psycopg.Error:
                    log.warning(
                        "outbox %s: the publisher lease's connection was lost", self.location
                    )
                    with suppress(psycopg.Error):
                        self._lease.close()
                    self._lease = None
            # Until this succeeds, every selection raises: nothing is sent without the lock.
            self._lease = self._take_lease()
            log.warning("outbox %s: publisher lease taken again", self.location)

    def _listen(self) -> None:
        while not self._stop_listening.is_set():
            try:
                with connect(
                    self.url,
                    timeout_s=self.options.connect_timeout_s,
                    autocommit=True,
                    application_name=f"{self._app} (listening)",
                    keepalive_s=self.options.keepalive_s,
                ) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
                    self._listening.set()
                    self.commits.notify()  # what was committed before we listened
                    while not self._stop_listening.is_set():
                        for note in conn.notifies(timeout=self.options.listen_tick_s, stop_after=1):
                            if note.payload == self.schema:
                                self.commits.notify()
            except (psycopg.Error, OutboxError, Unreachable, ServerRefused) as exc:
                self._listening.clear()
                log.warning("outbox %s: not listening for commits (%s)", self.location, exc)
                self._stop_listening.wait(self.options.connect_timeout_s)
        self._listening.clear()

    def listening(self, timeout: float) -> bool:
        """Whether the commit listener is up (waits up to ``timeout`` seconds)."""
        return self._listening.wait(timeout)

    # -- the publisher ---------------------------------------------------------------------------
    def release_due(self, now: float) -> int:
        with self._bookkeeping("release due retries") as conn:
            return conn.execute(
                "UPDATE outbox SET state = 'pending' "
                "WHERE state = 'retry_wait' AND next_attempt_at <= %s",
                (now,),
            ).rowcount

    def sendable(
        self, rows_per_project: int, max_rows: int, after_project: str | None
    ) -> list[OutboxRow]:
        self._check_lease()
        found = self._read(
            "WITH heads AS ("
            "  SELECT DISTINCT ON (project_id) project_id, slot AS head, state FROM outbox"
            f"  WHERE state IN {_OPEN} ORDER BY project_id, slot"
            "), share AS ("
            "  SELECT GREATEST(1, LEAST(%s, %s / GREATEST(COUNT(*), 1))) AS k FROM heads"
            "  WHERE state = 'pending'"
            f") SELECT {_COLUMNS} FROM heads h CROSS JOIN share JOIN outbox o"
            "  ON o.project_id = h.project_id AND o.slot >= h.head AND o.slot < h.head + share.k"
            f" WHERE h.state = 'pending' AND o.state IN {_OPEN}"
            ' ORDER BY h.project_id COLLATE "C" <= %s, h.project_id COLLATE "C", o.slot LIMIT %s',
            (rows_per_project, max_rows, after_project or "", max_rows),
        )
        rows: list[OutboxRow] = []
        bad: dict[str, str] = {}
        cut: set[str] = set()
        for values in found:
            if values[1] in cut:
                continue
            try:
                envelope = _canonical(values[4], self.options.max_envelope_bytes)
            except EnvelopeError as exc:
                # Written by SQL that slipped past the schema's checks: the row fails and holds
                # its project, as a row the broker refuses would.
                cut.add(values[1])
                if values[6] == RowState.PENDING:
                    bad[values[0]] = f"the stored event is not a valid envelope: {exc}"
                continue
            rows.append(_row(values, envelope))
        if bad:
            with self._bookkeeping("fail invalid rows") as conn, conn.cursor() as cur:
                cur.executemany(
                    "UPDATE outbox SET state = 'failed', last_error = %s "
                    "WHERE event_id = %s AND state = 'pending'",
                    [(error, event_id) for event_id, error in bad.items()],
                )
        return rows

    def next_due_at(self) -> float | None:
        found = self._read("SELECT MIN(next_attempt_at) FROM outbox WHERE state = 'retry_wait'")
        return None if found[0][0] is None else float(found[0][0])

    def apply(self, updates: Sequence[RowUpdate]) -> int:
        if not updates:
            return 0
        published: dict[float | None, list[str]] = {}
        others: list[RowUpdate] = []
        for u in updates:
            if u.state is RowState.PUBLISHED:  # counters and last_error stay as they are
                published.setdefault(u.published_at, []).append(u.event_id)
            else:
                others.append(u)
        changed = 0
        with self._bookkeeping("record publish results") as conn:
            for at, ids in published.items():
                changed += conn.execute(
                    "UPDATE outbox SET state = 'published', published_at = %s, "
                    "next_attempt_at = NULL WHERE state = 'pending' AND event_id = ANY(%s)",
                    (at, ids),
                ).rowcount
            if others:
                with conn.cursor() as cur:
                    for u in others:
                        cur.execute(
                            "UPDATE outbox SET state = %s, attempts = %s, deferrals = %s, "
                            "next_attempt_at = %s, last_error = %s, published_at = %s "
                            "WHERE event_id = %s AND state = 'pending'",
                            (
                                u.state.value,
                                u.attempts,
                                u.deferrals,
                                u.next_attempt_at,
                                u.last_error,
                                u.published_at,
                                u.event_id,
                            ),
                        )
                        changed += cur.rowcount
        return changed

    # -- operators -------------------------------------------------------------------------------
    def counts(self) -> dict[RowState, int]:
        counts = dict.fromkeys(RowState, 0)
        for state, n in self._read("SELECT state, COUNT(*) FROM outbox GROUP BY state"):
            counts[RowState(state)] = int(n)
        return counts

    def oldest_unpublished_at(self) -> float | None:
        found = self._read(
            "SELECT extract(epoch FROM MIN(created_at))::float8 FROM outbox "
            "WHERE state IN ('pending', 'retry_wait')"
        )
        return None if found[0][0] is None else float(found[0][0])

    def _rows(self, found: list[Any]) -> list[OutboxRow]:
        out = []
        for values in found:
            try:
                envelope = _canonical(values[4], self.options.max_envelope_bytes)
            except EnvelopeError:
                envelope = str(values[4]).encode()  # shown as stored
            out.append(_row(values, envelope))
        return out

    def rows_in_state(self, state: RowState, limit: int) -> list[OutboxRow]:
        return self._rows(
            self._read(
                f"SELECT {_COLUMNS} FROM outbox o WHERE o.state = %s "
                'ORDER BY o.project_id COLLATE "C", o.slot LIMIT %s',
                (state.value, limit),
            )
        )

    def held_projects(self, limit: int) -> list[HeldProject]:
        found = self._read(
            "SELECT project_id, event_id, slot, waiting FROM ("
            "  SELECT project_id, event_id, slot, state, "
            "   ROW_NUMBER() OVER (PARTITION BY project_id ORDER BY slot) AS rn, "
            "   COUNT(*) OVER (PARTITION BY project_id) - 1 AS waiting "
            f"  FROM outbox WHERE state IN {_OPEN}"
            ") h WHERE rn = 1 AND state = 'failed' ORDER BY project_id COLLATE \"C\" LIMIT %s",
            (limit,),
        )
        return [HeldProject(r[0], r[1], int(r[2]), int(r[3])) for r in found]

    def get(self, event_id: str) -> OutboxRow | None:
        found = self._rows(
            self._read(f"SELECT {_COLUMNS} FROM outbox o WHERE o.event_id = %s", (event_id,))
        )
        return found[0] if found else None

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
        with self._conn(action) as conn:
            found = self._rows(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM outbox o WHERE o.event_id = %s FOR UPDATE".encode(),
                    (event_id,),
                ).fetchall()
            )
            if not found:
                return None, False
            row = found[0]
            if row.state not in allowed:
                return row, False
            conn.execute(
                "UPDATE outbox SET state = %s, attempts = 0, deferrals = 0, "
                "next_attempt_at = NULL WHERE event_id = %s",
                (to.value, event_id),
            )
            conn.execute(
                "INSERT INTO outbox_audit (at, who, action, event_id, project_id, slot, "
                "from_state, reason, last_error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
            # A publisher elsewhere wakes at commit, as for a writer's insert.
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, self.schema))
        self.commits.notify()
        return row, True

    def audit_log(self, event_id: str | None, limit: int) -> list[AuditEntry]:
        where_sql, params = ("WHERE event_id = %s", [event_id]) if event_id else ("", [])
        found = self._read(
            f"SELECT {AuditEntry.COLUMNS} FROM outbox_audit {where_sql} ORDER BY id LIMIT %s",
            [*params, limit],
        )
        return [AuditEntry.from_row(r) for r in found]

    def purge_published(self, before: float) -> int:
        with self._conn("purge") as conn:
            return conn.execute(
                "DELETE FROM outbox WHERE state = 'published' AND published_at < %s", (before,)
            ).rowcount

    def last_slot(self, project_id: str) -> int:
        found = self._read(
            "SELECT last_slot FROM outbox_slots WHERE project_id = %s", (project_id,)
        )
        return int(found[0][0]) if found else 0

    def outbox_id(self) -> str | None:
        with self._conn("read the outbox's identity") as conn:
            return read_outbox_id(conn)
