"""Operator commands over any outbox backend: stats (with the outbox's identity), retry, skip,
purge.

Retry and skip change one row and write an audit entry (who, when, what, why) in the same
transaction. Both take a row that is ``failed`` (holding its project back) or ``retry_wait``:
a pending row may be in flight right now, and a published or skipped one is finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.errors import OutboxError
from streams.outbox.store import OutboxRow, OutboxStore, RowState

ACTIONABLE = frozenset({RowState.FAILED, RowState.RETRY_WAIT})


@dataclass(frozen=True, slots=True)
class OutboxStats:
    location: str
    counts: dict[RowState, int]
    oldest_pending_age_s: float | None
    failed_rows: list[OutboxRow]
    held_projects: list[dict[str, Any]]
    row_limit: int
    outbox_id: str | None = None  # the outbox's identity; None below PostgreSQL schema 3

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of ``rhumbatron outbox stats --json``."""
        out: dict[str, Any] = {state.value: self.counts[state] for state in RowState}
        out["total"] = sum(self.counts.values())
        out["oldest_pending_age_s"] = (
            None if self.oldest_pending_age_s is None else round(self.oldest_pending_age_s, 3)
        )
        out["failed_rows"] = [
            {
                "event_id": row.event_id,
                "project_id": row.project_id,
                "slot": row.slot,
                "event_type": row.event_type,
                "attempts": row.attempts,
                "last_error": row.last_error,
            }
            for row in self.failed_rows
        ]
        out["held_projects"] = self.held_projects
        out["lists_truncated_at"] = self.row_limit
        out["outbox"] = self.location
        out["outbox_id"] = self.outbox_id
        return out


def stats(store: OutboxStore, *, now: float, row_limit: int) -> OutboxStats:
    oldest = store.oldest_unpublished_at()
    return OutboxStats(
        location=store.location,
        counts=store.counts(),
        oldest_pending_age_s=None if oldest is None else max(now - oldest, 0.0),
        failed_rows=store.rows_in_state(RowState.FAILED, row_limit),
        held_projects=[
            {
                "project_id": h.project_id,
                "failed_event_id": h.event_id,
                "failed_slot": h.slot,
                "rows_waiting": h.waiting,
            }
            for h in store.held_projects(row_limit)
        ],
        row_limit=row_limit,
        outbox_id=store.outbox_id(),
    )


def _change(
    store: OutboxStore,
    event_id: str,
    *,
    to: RowState,
    action: str,
    who: str,
    reason: str | None,
    now: float,
) -> OutboxRow:
    if not who.strip():
        raise OutboxError(f"{action} of {event_id} needs the operator's name (--who)")
    before, changed = store.operator_transition(
        event_id, allowed=ACTIONABLE, to=to, who=who, action=action, reason=reason, at=now
    )
    if before is None:
        raise OutboxError(
            f"no row with event id {event_id} in outbox {store.location}: check the id "
            "(rhumbatron outbox stats lists failed rows)"
        )
    if not changed:
        raise OutboxError(
            f"cannot {action} {event_id}: it is {before.state.value}; only a failed or "
            "retry_wait row can be retried or skipped"
        )
    return before


def retry(store: OutboxStore, event_id: str, *, who: str, now: float) -> OutboxRow:
    """Back to pending with its attempt counters reset; its project flows again. Returns the
    row as it was."""
    return _change(
        store, event_id, to=RowState.PENDING, action="retry", who=who, reason=None, now=now
    )


def skip(store: OutboxStore, event_id: str, *, reason: str, who: str, now: float) -> OutboxRow:
    """Never send this row; its project moves on to the next slot (consumers record the gap).
    Returns the row as it was."""
    if not reason.strip():
        raise OutboxError(
            f"skipping {event_id} needs a reason (--reason): it goes to the audit log"
        )
    return _change(
        store, event_id, to=RowState.SKIPPED, action="skip", who=who, reason=reason, now=now
    )


def purge(store: OutboxStore, *, older_than_s: float, now: float) -> int:
    """Delete rows published more than ``older_than_s`` ago. Slot counters are never reset."""
    if older_than_s <= 0:
        raise OutboxError(f"purge needs a positive age, got {older_than_s:g}s")
    return store.purge_published(now - older_than_s)
