"""``acme-task-counts``: how many tasks each project completed and failed, as a Redis hash
``task-counts:<project>`` with the fields ``completed`` and ``failed``.

The counts are the project's fold, and each event writes them with ``HSET`` rather than adding
one with ``HINCRBY``: exactly once already holds across crashes and copies, but an operator's
``reprocess-from`` runs the events after its offset again, and a fold (rewound to that offset)
written with HSET arrives at the same numbers where an increment would count them twice.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rhumbatron import Delivery, EffectKind, Effects, Event, Processor, RedisOp

OUTCOMES = {"task.completed": "completed", "task.failed": "failed"}


def key_of(project_id: str) -> str:
    """The view's key for a project (stored as ``rh:<env>:{acme-task-counts|…}:x:<key>``)."""
    return f"task-counts:{project_id}"


class TaskCounts(Processor):
    slug: ClassVar[str] = "acme-task-counts"
    consumes: ClassVar[frozenset[str] | None] = frozenset(OUTCOMES)
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def reduce(self, state: dict[str, Any] | None, event: Event) -> dict[str, Any]:
        counts = dict(state or dict.fromkeys(OUTCOMES.values(), 0))
        counts[OUTCOMES[event.event_type]] += 1
        return counts

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        assert state is not None  # reduce made it for this very event
        key = key_of(event.project_id)
        return Effects(
            redis=[RedisOp("HSET", key, (field, state[field])) for field in sorted(state)]
        )
