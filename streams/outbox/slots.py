"""Dense per-project slots: the rules every backend applies inside the append.

The backend reads the project's counter ``head`` under its write lock (SQLite: the database lock
taken by ``BEGIN IMMEDIATE``; PostgreSQL: the counter row's lock) and asks :func:`plan_append`
what to do. New events take ``head+1, head+2 …`` — dense, gap-free, and never reused, because
the counter only moves forward (purging published rows leaves it alone). Because the lock is
held from allocation to commit, a slot is never visible before every lower slot of its project.

``seen_slot`` is the highest slot the writer has seen (``None``: the writer does not say).

- Bump-and-report (default): the append lands above whatever others appended; the plan names
  the slots the writer had not seen, ``seen_slot+1 .. head``, for the result to report.
- Strict: refused when ``head > seen_slot``; nothing is written.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from streams.envelopes import Draft
from streams.errors import OutboxError


@dataclass(frozen=True, slots=True)
class AppendPlan:
    new: tuple[tuple[Draft, int], ...]  # (draft, slot) in slot order
    duplicates: tuple[str, ...]  # event ids already present (or repeated in this append)
    missed_from: int  # first slot the writer had not seen (missed_from > missed_to: none)
    missed_to: int
    conflict: bool  # strict mode and the project moved: refuse, write nothing

    @property
    def head_after(self) -> int:
        return self.new[-1][1] if self.new else self.missed_to


def check_drafts(project_id: str, drafts: Sequence[Draft]) -> None:
    for draft in drafts:
        if draft.project_id != project_id:
            raise OutboxError(
                f"event {draft.event_id} belongs to project '{draft.project_id}' but was appended "
                f"to project '{project_id}': append each project's events in their own call"
            )


def plan_append(
    project_id: str,
    drafts: Sequence[Draft],
    *,
    head: int,
    existing: Collection[str],
    seen_slot: int | None,
    strict: bool,
) -> AppendPlan:
    """Decide slots, duplicates and the missed range for one append. ``existing`` holds the ids
    among ``drafts`` that are already in the outbox."""
    check_drafts(project_id, drafts)
    if strict and seen_slot is None:
        raise OutboxError(
            f"strict append to project '{project_id}' needs seen_slot (the highest slot the "
            "writer has seen; 0 if it has seen none)"
        )
    if seen_slot is not None and not 0 <= seen_slot <= head:
        raise OutboxError(
            f"seen_slot {seen_slot} for project '{project_id}' is outside 0..{head} (the "
            f"project's last slot is {head}): pass the highest slot the writer actually read"
        )
    missed_from = head + 1 if seen_slot is None else seen_slot + 1
    conflict = strict and seen_slot is not None and head > seen_slot
    duplicates: list[str] = []
    new: list[tuple[Draft, int]] = []
    seen_ids: set[str] = set()
    slot = head
    for draft in drafts:
        if draft.event_id in existing or draft.event_id in seen_ids:
            duplicates.append(draft.event_id)
            continue
        seen_ids.add(draft.event_id)
        slot += 1
        new.append((draft, slot))
    return AppendPlan(
        new=() if conflict else tuple(new),
        duplicates=tuple(duplicates),
        missed_from=missed_from,
        missed_to=head,
        conflict=conflict,
    )
