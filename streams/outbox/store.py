"""The outbox storage contract: what a backend (SQLite here; PostgreSQL later) provides to writers,
to the publisher and to operators. The publisher and the operator commands talk only to
:class:`OutboxStore`, so a new backend never touches them.

Row lifecycle (transitions decided in :mod:`streams.outbox.states`)::

    pending ──► published                     acknowledged by Kafka
    pending ──► retry_wait ──► pending        a failed send, after backoff 1 s, 2 s, 4 s … cap
    pending ──► failed                        10th row-level failure, or no producer for the stream
    failed / retry_wait ──► pending           operator retry (audited; counters reset)
    failed / retry_wait ──► skipped           operator skip (audited; the project moves on)

Times are seconds since the Unix epoch (floats), taken from an injected clock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from streams.envelopes import Draft, Event


def is_postgres_url(address: str | os.PathLike[str]) -> bool:
    """An outbox address is a PostgreSQL outbox's URL, or else a SQLite file's path. Told apart
    here, beside the contract, so a command that only needs to know which never imports the
    PostgreSQL driver."""
    text = os.fspath(address)
    return text.startswith(("postgresql://", "postgres://"))


class RowState(StrEnum):
    PENDING = "pending"  # waiting to be sent (or in flight right now)
    PUBLISHED = "published"  # acknowledged by Kafka
    RETRY_WAIT = "retry_wait"  # a send failed; due again at next_attempt_at
    FAILED = "failed"  # gave up; holds its project back until an operator retries or skips it
    SKIPPED = "skipped"  # an operator let the project move on without it (never sent)


# States of rows that still stand between their project and the next row.
OPEN_STATES = (RowState.PENDING, RowState.RETRY_WAIT, RowState.FAILED)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    event_id: str
    project_id: str
    slot: int
    event_type: str
    envelope: bytes  # the canonical Event JSON, slot and timestamp included
    trace_context: Mapping[str, str]  # the writer's W3C trace context (empty when untraced)
    state: RowState
    attempts: int  # failed sends the row itself caused (too large, rejected by the broker)
    deferrals: int  # failed sends that were not its fault (broker unavailable, producer reset)
    next_attempt_at: float | None
    last_error: str | None
    created_at: float
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class RowUpdate:
    """The publisher's verdict on one row it sent. Applied only if the row is still pending."""

    event_id: str
    state: RowState
    attempts: int
    deferrals: int
    next_attempt_at: float | None
    last_error: str | None
    published_at: float | None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did. ``events`` are the new events with their slots, in slot order;
    ``duplicates`` the event ids that already existed (ignored, no slot used); ``head`` the
    project's last slot after the append. When the writer named ``seen_slot`` and others had
    appended since, ``missed`` holds their events (slots ``seen_slot+1 .. first new slot-1``) so
    the writer can merge before its next decision; ``missed_complete`` is False when that list
    was cut short (report limit, or rows already purged)."""

    project_id: str
    events: tuple[Event, ...]
    duplicates: tuple[str, ...]
    head: int
    missed: tuple[Event, ...] = ()
    missed_complete: bool = True

    @property
    def slots(self) -> list[int]:
        return [event.slot or 0 for event in self.events]

    @property
    def bumped(self) -> bool:
        """Other writers appended since the writer's ``seen_slot``."""
        return bool(self.missed) or not self.missed_complete


@dataclass(frozen=True, slots=True)
class HeldProject:
    """A project held back by a failed row at its head."""

    project_id: str
    event_id: str
    slot: int
    waiting: int  # rows behind the failed one


@dataclass(frozen=True, slots=True)
class AuditEntry:
    at: float
    who: str
    action: str  # retry | skip
    event_id: str
    project_id: str
    slot: int
    from_state: RowState
    reason: str | None
    last_error: str | None

    # The columns both stores select, in this order, for from_row.
    COLUMNS: ClassVar[str] = (
        "at, who, action, event_id, project_id, slot, from_state, reason, last_error"
    )

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> AuditEntry:
        return cls(r[0], r[1], r[2], r[3], r[4], int(r[5]), RowState(r[6]), r[7], r[8])


class Cursor(Protocol):
    """What a writer's own SQL returns (DB-API cursor subset)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class UnitOfWork(Protocol):
    """One open database transaction of a writer: its own SQL and its events commit together."""

    @property
    def placeholder(self) -> str:
        """The parameter marker of the writer's own SQL here: ``?`` (SQLite) or ``%s``
        (PostgreSQL), so one statement can serve both backends."""

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        """Run the writer's own statement (its state change) inside the transaction."""

    def append(
        self,
        project_id: str,
        drafts: Sequence[Draft],
        *,
        tenant_id: str,
        seen_slot: int | None = None,
        strict: bool = False,
    ) -> AppendResult:
        """Append events of one project, allocating slots ``head+1 ..`` (bump-and-report), or
        with ``strict`` raise SlotConflict when the project moved past ``seen_slot``."""


class CommitSignal:
    """Wakes a waiting publisher when a writer in the same process commits events."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Block until a commit after generation ``seen``, or ``timeout`` seconds (real time:
        this is the in-process wake-up, the poll interval is the backstop). True if woken."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != seen, timeout=max(timeout, 0))


class OutboxStore(Protocol):
    """A transactional outbox backend."""

    commits: CommitSignal
    location: str  # what operators see in messages: a path or a DSN without secrets

    # -- writers ---------------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[UnitOfWork]:
        """One write transaction: commit on normal exit, roll back (everything) on an exception."""

    # -- the publisher ---------------------------------------------------------------------------
    def publisher_lease(self) -> AbstractContextManager[None]:
        """Hold the single-publisher lease; raises PublisherLocked if someone else holds it."""

    def release_due(self, now: float) -> int:
        """retry_wait rows whose time has come go back to pending. Returns how many."""

    def sendable(
        self, rows_per_project: int, max_rows: int, after_project: str | None
    ) -> list[OutboxRow]:
        """For every project whose first open row (pending, retry_wait or failed) is pending: its
        first ``rows_per_project`` open rows, in (project, slot) order — projects after
        ``after_project`` first, then wrapping around — at most ``max_rows`` in all. When the
        projects' full windows would exceed ``max_rows``, each gets an even share of it (at least
        one row), so a capped pass still keeps every project moving."""

    def next_due_at(self) -> float | None:
        """The earliest next_attempt_at of a retry_wait row."""

    def apply(self, updates: Sequence[RowUpdate]) -> int:
        """Record the publisher's verdicts in one transaction. Returns rows changed."""

    # -- operators -------------------------------------------------------------------------------
    def counts(self) -> dict[RowState, int]: ...

    def oldest_unpublished_at(self) -> float | None:
        """created_at of the oldest pending or retry_wait row."""

    def rows_in_state(self, state: RowState, limit: int) -> list[OutboxRow]: ...

    def held_projects(self, limit: int) -> list[HeldProject]: ...

    def get(self, event_id: str) -> OutboxRow | None: ...

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
        """Atomically move a row in one of ``allowed`` states to ``to`` (resetting its attempt
        counters and next_attempt_at) and write the audit entry. Returns the row as it was before
        (None if no such row) and whether the change was made."""

    def audit_log(self, event_id: str | None, limit: int) -> list[AuditEntry]: ...

    def purge_published(self, before: float) -> int:
        """Delete published rows published before ``before``. Slot counters are untouched."""

    def last_slot(self, project_id: str) -> int:
        """The project's slot counter (0 when it has no events)."""

    def outbox_id(self) -> str | None:
        """The outbox's identity as its database holds it (:mod:`streams.outbox.identity`);
        None when it holds none (a PostgreSQL outbox below schema version 3)."""

    def close(self) -> None: ...
