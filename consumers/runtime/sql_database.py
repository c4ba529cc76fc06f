"""A SQL-effect subscription's database, as its store (``sql_store``) uses it: the store's
tables (:func:`provision_sql_store`, which ``rhumbatron provision`` runs), one connection used
under a lock, and how an error there is told apart: an *outage* of the database, or an error of
what was sent.

- ``rhumbatron_partitions``: one row a (env, subscription, topic, partition): the owner epoch;
  the cursors (``acked_through`` and ``cursor_revision``, ``reduced_through`` and
  ``reducer_version``) and ``fold_generation`` as columns, for the compare-and-set and for a
  reader; every field of :class:`~consumers.runtime.types.Progress` in ``progress`` (json, as
  ``as_fields`` gives them, so a field added later needs no new column); ``pending``, a
  Kafka-effects copy, which a SQL processor never has (one effect kind a processor), kept for
  the contract.
- ``rhumbatron_claims``: an event claimed at a cursor revision (``dead``: dead-lettered or
  skipped there), until ``expires_ms``.
- ``rhumbatron_folds``: a project's fold state (json); ``rhumbatron_failures``: a batch's
  failure count; ``rhumbatron_excluded``: offsets a fold leaves out.

Every row but a partition's is keyed by its partition's row id, so one set of tables serves
every subscription and environment of a database.

SQLSTATE classes 08 (connection), 40 (serialization failure, deadlock) and the server's own
trouble (53 resources, 57 operator intervention such as a shutdown, 58 system, XX internal), and
a lost connection, are an outage: :meth:`Database.translated` makes them Unreachable (08, a lost
connection) or ServerRefused (the others). 42 in the store's own statements is a database
without its tables, or a role without rights: a ConfigurationError saying what to run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from itertools import groupby
from typing import Any, TypeVar

import psycopg

from streams.errors import ConfigurationError, ServerRefused, Unreachable
from streams.outbox.postgres import tcp_options, where
from streams.urls import masked

_T = TypeVar("_T")
Cursor = psycopg.Cursor[Any]
# One statement and its parameters (None: sent as written, a % in it needs no doubling).
Query = tuple[str, Sequence[Any] | Mapping[str, Any] | None]

# SQLSTATE classes that are the database's trouble, not an event's: retried after a backoff.
OUTAGE_CLASSES = frozenset({"08", "40", "53", "57", "58", "XX"})
# ...but a statement cancelled (its statement_timeout, or pg_cancel_backend) is that statement's
# own: a statement that always runs too long must not hold its partition back uncounted.
QUERY_CANCELED = "57014"
# provision_sql_store's lock: pg_advisory_xact_lock(LOCK_CLASS, hashtext(schema)), two provisions
# at once wait for each other (the outbox's init takes 0x5249 in the same two-key space).
LOCK_CLASS = 0x5253  # "RS"

TABLES = """
CREATE TABLE IF NOT EXISTS rhumbatron_partitions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    env text NOT NULL,
    slug text NOT NULL,
    topic text NOT NULL,
    partition integer NOT NULL,
    epoch bigint NOT NULL DEFAULT 0,
    acked_through bigint NOT NULL DEFAULT -1,
    cursor_revision bigint NOT NULL DEFAULT 0,
    reduced_through bigint NOT NULL DEFAULT -1,
    reducer_version text NOT NULL DEFAULT '',
    fold_generation bigint NOT NULL DEFAULT 0,
    progress json NOT NULL DEFAULT '{}',
    pending bytea,
    UNIQUE (env, slug, topic, partition)
);
CREATE TABLE IF NOT EXISTS rhumbatron_claims (
    partition_id bigint NOT NULL,
    event_id text NOT NULL,
    revision bigint NOT NULL,
    dead boolean NOT NULL,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (partition_id, event_id, revision, dead)
);
CREATE TABLE IF NOT EXISTS rhumbatron_folds (
    partition_id bigint NOT NULL,
    project text NOT NULL,
    state json NOT NULL,
    PRIMARY KEY (partition_id, project)
);
CREATE TABLE IF NOT EXISTS rhumbatron_failures (
    partition_id bigint NOT NULL,
    batch_key text NOT NULL,
    count integer NOT NULL,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (partition_id, batch_key)
);
CREATE TABLE IF NOT EXISTS rhumbatron_excluded (
    partition_id bigint NOT NULL,
    "offset" bigint NOT NULL,
    PRIMARY KEY (partition_id, "offset")
)
"""
TABLE_NAMES = (
    "rhumbatron_partitions",
    "rhumbatron_claims",
    "rhumbatron_folds",
    "rhumbatron_failures",
    "rhumbatron_excluded",
)


def reason(exc: BaseException) -> str:
    """What the server (or libpq) said, on one line."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        return exc.diag.message_primary
    lines = [line for line in str(exc).strip().splitlines() if line and not line[0].isspace()]
    return lines[-1] if lines else repr(exc)


def connect(url: str, *, timeout_s: float, application_name: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(2, round(timeout_s)),
            application_name=application_name,
            **tcp_options(timeout_s),
        )
    except psycopg.OperationalError as exc:
        raise Unreachable("PostgreSQL", where(url), f"connecting: {reason(exc)}") from None
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(
            f"not a usable PostgreSQL URL ({masked(url)}): {exc}; give a "
            "postgresql://user:password@host:port/database URL"
        ) from None


def provision_sql_store(url: str, *, connect_timeout_s: float = 10.0) -> None:
    """Create the SQL store's tables in the first schema of the URL's search_path, unless they are
    there (idempotent; two at once wait for each other)."""
    with (
        connect(url, timeout_s=connect_timeout_s, application_name="rhumbatron provision") as conn,
        conn.transaction(),
    ):
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (LOCK_CLASS,))
        conn.execute(TABLES)


class Database:
    """One connection to a subscription's database (a new one when the last was lost or a call
    broke off), used under a lock: the runner is one thread, and an operator's controls build a
    store, and a database, of their own."""

    def __init__(self, url: str, *, slug: str, connect_timeout_s: float) -> None:
        self.url = url
        self.slug = slug
        self.connect_timeout_s = connect_timeout_s
        self.where = where(url)
        self.lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._cursor: Cursor | None = None

    def cursor(self) -> Cursor:
        """A cursor of the store's connection (a new connection when the last one was lost)."""
        conn, cursor = self._conn, self._cursor
        if conn is not None and cursor is not None and not conn.closed and not conn.broken:
            return cursor
        self._drop()
        conn = connect(
            self.url, timeout_s=self.connect_timeout_s, application_name=f"rhumbatron {self.slug}"
        )
        self._conn, self._cursor = conn, conn.cursor()
        return self._cursor

    def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self.lock:
            self._drop()

    def lost(self) -> bool:
        conn = self._conn
        return conn is None or conn.closed or conn.broken

    def is_outage(self, exc: BaseException) -> bool:
        if not isinstance(exc, psycopg.Error):
            return False
        if self.lost():
            return True
        code = exc.sqlstate
        if code is None:  # raised by the client: libpq's own trouble, or a bad call of ours
            return isinstance(exc, psycopg.OperationalError)
        return code[:2] in OUTAGE_CLASSES and code != QUERY_CANCELED

    def translated(self, exc: psycopg.Error, doing: str) -> Exception:
        """A psycopg error as ours: an outage as Unreachable (08, a lost connection) or
        ServerRefused (40 and the server's own trouble); missing tables or rights as the
        ConfigurationError that says what to run; anything else as it is."""
        code = exc.sqlstate or ""
        detail = f"{doing}: {reason(exc)}" + (f" (SQLSTATE {code})" if code else "")
        if self.is_outage(exc):
            if code.startswith("08") or not code or self.lost():
                return Unreachable("PostgreSQL", self.where, detail)
            return ServerRefused("PostgreSQL", self.where, detail)
        if code.startswith("42"):
            return ConfigurationError(
                f"{self.slug}'s SQL store at {self.where}: {detail}; the subscription's database "
                f"([subscriptions.{self.slug}] database) needs its tables, made by `rhumbatron "
                "provision`, and a role that may read and write them"
            )
        return exc

    def abandon(self) -> None:
        """A call broken off: its connection is closed (the server rolls its transaction back),
        the next call opens another. Not rolled back and kept: after a failed pipeline, psycopg
        may take a statement for prepared that the server never saw."""
        self._drop()

    def read(self, doing: str, read: Callable[[Cursor], _T]) -> _T:
        """A read, tried once more on a new connection when the first was lost under it (a
        server restart between polls)."""
        with self.lock:
            for attempt in (1, 2):
                cursor = self.cursor()
                try:
                    return read(cursor)
                except psycopg.Error as exc:
                    if attempt == 1 and self.lost():
                        continue
                    error = self.translated(exc, doing)
                    self.abandon()
                    raise error from exc
        raise AssertionError("unreachable")

    def write(self, doing: str, write: Callable[[Cursor], _T]) -> _T:
        """A write in a transaction of its own (``write`` begins and commits it); rolled back on
        any error, an outage raised as ours."""
        with self.lock:
            cursor = self.cursor()
            try:
                return write(cursor)
            except psycopg.Error as exc:
                error = self.translated(exc, doing)
                self.abandon()
                raise error from exc
            except BaseException:
                self.abandon()
                raise

    def missing_tables(self) -> list[str]:
        """The store's tables the database lacks (or this role may not see)."""

        def missing(cursor: Cursor) -> list[str]:
            found = cursor.execute(
                "SELECT name FROM unnest(%s::text[]) AS t(name) WHERE to_regclass(name) IS NULL",
                (list(TABLE_NAMES),),
            ).fetchall()
            return [row[0] for row in found]

        return self.read("checking the tables", missing)


def pipelined(cursor: Cursor, queries: Iterable[Query]) -> None:
    """The queries in one round trip (psycopg's pipeline mode): the first that fails raises,
    and none after it runs; the cursor holds the last one's rows. A query with parameters seen
    often is prepared (half the server's time of a small upsert); one without (a savepoint, a
    COMMIT) never is."""
    with cursor.connection.pipeline():
        # A run of one query with several sets of parameters (the same upsert, event after
        # event) goes as one executemany: psycopg converts the query once for all of them.
        for (query, has_params), run in groupby(queries, key=lambda q: (q[0], q[1] is not None)):
            if not has_params:
                for _ in run:
                    cursor.execute(query, prepare=False)
                continue
            params = [p for _, p in run]
            if len(params) == 1:
                cursor.execute(query, params[0])
            else:
                cursor.executemany(query, params)  # type: ignore[arg-type]
