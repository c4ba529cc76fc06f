"""The SQLite outbox's tables, and the mapping between their rows and :class:`OutboxRow`.

``outbox`` holds one row per event (``event_id`` UNIQUE, ``(project_id, slot)`` UNIQUE, so a
duplicate slot cannot be stored even by a bug); ``outbox_slots`` the per-project counters, which
purging never touches; ``outbox_audit`` every operator retry and skip; ``outbox_identity`` the
outbox's one identity row (:mod:`streams.outbox.identity`).

Every statement is idempotent (``IF NOT EXISTS``, ``INSERT OR IGNORE`` on the identity's fixed
key), so the schema is applied again to an outbox made by a release before a table was added:
that keeps ``user_version`` at 1, and an older release still opens the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streams.errors import StoredRowInvalid
from streams.outbox import stored
from streams.outbox.store import OPEN_STATES, OutboxRow, RowState

SCHEMA_VERSION = 1
# SQLite binds at most 32766 variables per statement; stay well inside for IN (...) lists.
IN_CHUNK = 500

# Literal, not bound: SQLite uses a partial index only when the query repeats its WHERE terms.
OPEN_SQL = "('" + "','".join(OPEN_STATES) + "')"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS outbox_slots (
    project_id TEXT PRIMARY KEY,
    last_slot INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    project_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    envelope BLOB NOT NULL,
    trace_context TEXT,
    state TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'published', 'retry_wait', 'failed', 'skipped')),
    attempts INTEGER NOT NULL DEFAULT 0,
    deferrals INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_error TEXT,
    created_at REAL NOT NULL,
    published_at REAL,
    UNIQUE (project_id, slot)
);
CREATE INDEX IF NOT EXISTS outbox_open ON outbox (project_id, slot) WHERE state IN {OPEN_SQL};
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (next_attempt_at) WHERE state = 'retry_wait';
CREATE INDEX IF NOT EXISTS outbox_published ON outbox (published_at) WHERE state = 'published';
CREATE TABLE IF NOT EXISTS outbox_audit (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    who TEXT NOT NULL,
    action TEXT NOT NULL,
    event_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    from_state TEXT NOT NULL,
    reason TEXT,
    last_error TEXT
);
CREATE TABLE IF NOT EXISTS outbox_identity (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    outbox_id TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""
# The identity's one row: the first transaction to apply the schema makes it, every later one
# (another process opening the file at the same moment) finds the key taken and leaves it.
IDENTITY_INSERT = (
    "INSERT OR IGNORE INTO outbox_identity (one, outbox_id, created_at) VALUES (1, ?, ?)"
)
IDENTITY_SELECT = "SELECT outbox_id FROM outbox_identity WHERE one = 1"

COLUMNS = (
    "event_id, project_id, slot, event_type, envelope, trace_context, state, attempts, "
    "deferrals, next_attempt_at, last_error, created_at, published_at"
)


@dataclass(frozen=True, slots=True)
class SqliteOptions:
    max_envelope_bytes: int
    missed_report_limit: int  # most missed events an append reports back
    busy_timeout_s: float  # how long a writer queues for the write lock
    synchronous: str = "FULL"  # FULL: a commit survives power loss; NORMAL: process crash only


PREFIXED_COLUMNS = ", ".join(f"o.{name.strip()}" for name in COLUMNS.split(","))


def row_from_sql(values: Sequence[Any]) -> OutboxRow:
    """A stored row as it is, for reading. The publisher sends only rows :func:`sendable_row`
    accepted: a SQLite column takes any type, and a row written by hand may hold anything."""
    raw = values[4]
    return OutboxRow(
        event_id=values[0],
        project_id=values[1],
        slot=values[2],
        event_type=values[3],
        envelope=bytes(raw) if isinstance(raw, bytes | memoryview) else str(raw).encode(),
        trace_context=stored.trace_context(values[5]),
        state=RowState(values[6]),
        attempts=values[7],
        deferrals=values[8],
        next_attempt_at=values[9],
        last_error=values[10],
        created_at=values[11],
        published_at=values[12],
    )


def sendable_row(values: Sequence[Any], max_envelope_bytes: int) -> OutboxRow:
    """A stored row the publisher may send: its columns of the right types and its envelope a
    JSON object that agrees with them; raises StoredRowInvalid saying what is wrong."""
    event_id, project_id, slot, event_type, envelope = values[:5]
    if not (
        type(envelope) is bytes
        and type(event_id) is str
        and type(project_id) is str
        and type(slot) is int
        and type(event_type) is str
        and type(values[11]) is float  # REAL: a number written there is stored as a float
    ):
        _refuse_types(values)
        envelope = stored.envelope_bytes(envelope)
    stored.check_envelope(
        envelope,
        event_id=event_id,
        project_id=project_id,
        slot=slot,
        event_type=event_type,
        max_bytes=max_envelope_bytes,
    )
    return row_from_sql(values)


def _refuse_types(values: Sequence[Any]) -> None:
    """Raise StoredRowInvalid naming the column of a wrong type; return if there is none (an
    envelope stored as text is taken as its UTF-8 bytes)."""
    for name, value in (("event_id", values[0]), ("project_id", values[1])):
        if not isinstance(value, str):
            raise StoredRowInvalid(f"{name} {value!r} is not text")
    if not isinstance(values[3], str):
        raise StoredRowInvalid(f"event_type {values[3]!r} is not text")
    stored.whole(values[2], "slot")
    stored.number(values[11], "created_at")
    stored.envelope_bytes(values[4])
