"""The runtime tests' side of the in-memory harness (consumers.runtime.harness, the one harness
the runtime's tests and processor authors share): its world with the ledger as the default
processor and readers of the test processors' effects, events numbered per project, and the
test processors themselves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import orjson

from consumers.runtime.harness import (
    BOUNDARIES,
    LIMIT,
    OUT,
    PARTITIONS,
    PROJECTS_SHARING,
    REDELIVERY,
    STREAMS,
    Crash,
)
from consumers.runtime.harness import World as HarnessWorld
from consumers.runtime.runner import Runner
from consumers.runtime.types import (
    JSON,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    Processor,
)
from consumers.subscriptions.ledger import Ledger
from streams.envelopes import Event, build
from streams.ids import stable_event_id

__all__ = [
    "BOUNDARIES",
    "LIMIT",
    "OUT",
    "PARTITIONS",
    "PROJECTS_SHARING",
    "REDELIVERY",
    "STREAMS",
    "Counter",
    "Crash",
    "FlakyEffects",
    "World",
    "event",
    "fresh_ledger",
]


def event(project: str, n: int, *, fail: bool = False, etype: str = "task.completed") -> Event:
    return build(
        Event,
        event_id=stable_event_id(project, etype, f"t{n}"),
        event_type=etype,
        tenant_id="tenant",
        project_id=project,
        actor="test",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=n),
        payload={"n": n, **({"drill": "fail"} if fail else {})},
        slot=n,
    )


class Counter(BaseProcessor):
    """A fold (events per project, and the last n) with Kafka effects: one record per event."""

    slug: ClassVar[str] = "counter"
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA
    consumes: ClassVar[frozenset[str] | None] = frozenset({"task.completed", "task.failed"})
    failing: ClassVar[set[str]] = set()

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        if event.event_id in self.failing:
            raise ValueError(f"reduce refuses {event.event_id}")
        s = dict(state or {"count": 0, "seen": []})
        s["count"] += 1
        s["seen"] = [*s["seen"], event.payload["n"]]
        return s

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        assert state is not None
        body = {
            "project": event.project_id,
            "n": event.payload["n"],
            "count": state["count"],
            "key": delivery.idempotency_key(event.event_id),
        }
        return Effects(
            records=[
                OutRecord(
                    OUT,
                    event.project_id,
                    orjson.dumps(body),
                    delivery.idempotency_key(event.event_id),
                )
            ]
        )


class FlakyEffects(Counter):
    """Kafka effects and a fold; an event's effect fails as often as the test's budget says
    (the fold itself is total, so refolds are not disturbed)."""

    budget: ClassVar[dict[str, int]] = {}

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        left = self.budget.get(event.event_id, 0)
        if left > 0:
            self.budget[event.event_id] = left - 1
            raise ValueError(f"effect of {event.event_id} fails ({left} left)")
        return super().process(event, state, delivery)


class World(HarnessWorld):
    """The harness's world, running the ledger unless told otherwise."""

    def runner(self, processor: Processor | None = None, **kw: Any) -> Runner:
        return super().runner(processor or Ledger(), **kw)

    def ledger(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for key, value in self.store.space.data.items():
            marker = "|ledger:project:"
            if marker in key:
                out[key.split(marker)[1]] = [int(v) for v in value]  # type: ignore[attr-defined]
        return out

    def ledger_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for key, value in self.store.space.data.items():
            if key.endswith("|ledger:counts"):
                for k, v in value.items():  # type: ignore[attr-defined]
                    counts[k] = counts.get(k, 0) + int(v)
        return counts

    def out_records(self) -> list[dict[str, Any]]:
        return [
            orjson.loads(r.value or b"") | {"_id": r.header("record_id")} for r in self.log.all(OUT)
        ]


def fresh_ledger() -> Ledger:
    return Ledger()
