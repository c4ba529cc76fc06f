"""An in-memory world for runtime tests: a log with streams, a store, dead letters, processors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import orjson

from consumers.runtime.controls import Controls, MemoryAuditLog
from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import MemoryDeadLetters
from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.memory_transport import (
    MemoryLog,
    MemoryOutput,
    MemoryOutputLog,
    MemoryReader,
    MemoryRedelivery,
    MemoryTransport,
)
from consumers.runtime.runner import Runner, RuntimePolicy
from consumers.runtime.types import (
    JSON,
    TP,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    Processor,
)
from consumers.subscriptions.ledger import Ledger
from streams.clock import ManualClock
from streams.envelopes import Event, build, encode
from streams.ids import stable_event_id

STREAMS = ("s0", "s1")
PARTITIONS = 2
REDELIVERY = "redeliver"
OUT = "out"
LIMIT = 1 << 20
# The failpoints between a batch's writes where a crash is tested: every step of a commit.
BOUNDARIES = [
    "runtime.before_store_commit",
    "runtime.after_store_commit",  # after claim + effect + cursor (one atomic write)
    "runtime.before_transaction_commit",
    "runtime.after_transaction_commit",  # Kafka effects landed, pending copy not yet cleared
    "runtime.after_offsets_commit",
]
# Two projects that land on the same stream partition (World.tp_of).
PROJECTS_SHARING = ("alpha", "beta")


class Crash(BaseException):
    """A simulated process death (BaseException so nothing in the runner swallows it)."""


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


@dataclass
class World:
    log: MemoryLog = field(default_factory=MemoryLog)
    store: MemoryStore = field(default_factory=MemoryStore)
    dead: MemoryDeadLetters = field(default_factory=MemoryDeadLetters)
    clock: ManualClock = field(default_factory=ManualClock)
    audit: MemoryAuditLog = field(default_factory=MemoryAuditLog)
    outputs: list[MemoryOutput] = field(default_factory=list)

    def __post_init__(self) -> None:
        for s in STREAMS:
            self.log.create(s, PARTITIONS)
        self.log.create(REDELIVERY, len(STREAMS) * PARTITIONS)
        self.log.create(OUT, 3)

    def tp_of(self, project: str) -> TP:
        h = sum(project.encode())
        return TP(STREAMS[h % len(STREAMS)], (h // 7) % PARTITIONS)

    def publish(self, ev: Event, raw: bytes | None = None) -> int:
        tp = self.tp_of(ev.project_id)
        return self.log.append(
            tp.topic,
            tp.partition,
            raw if raw is not None else encode(ev, max_bytes=LIMIT),
            ev.project_id.encode(),
        )

    def publish_raw(self, tp: TP, raw: bytes) -> int:
        return self.log.append(tp.topic, tp.partition, raw)

    def policy(self, **kw: Any) -> RuntimePolicy:
        values: dict[str, Any] = dict(
            batch_size=50,
            max_batch_failures=5,
            retry_backoff_s=1.0,
            retry_backoff_max_s=8.0,
            max_envelope_bytes=LIMIT,
            control_check_interval_s=0.0,
            streams=STREAMS,
            partitions_per_stream=PARTITIONS,
        )
        values.update(kw)
        return RuntimePolicy(**values)

    def controls(self, processor: Processor) -> Controls:
        return Controls(
            processor, self.store, MemoryReader(self.log), self.audit, self.dead, self.clock, LIMIT
        )

    def runner(
        self,
        processor: Processor | None = None,
        *,
        cuts: Iterator[int] | None = None,
        failpoint: Callable[[str], None] = lambda name: None,
        auto_assign: bool = True,
        **policy: Any,
    ) -> Runner:
        processor = processor or Ledger()
        transport = MemoryTransport(
            self.log, f"group-{processor.slug}", cuts=cuts, auto_assign=auto_assign
        )
        output = None
        if processor.effect_kind == EffectKind.KAFKA:
            output = MemoryOutput(self.log)
            self.outputs.append(output)
        runner = Runner(
            processor,
            transport,
            self.store,
            self.dead,
            self.policy(**policy),
            self.clock,
            output=output,
            output_log=MemoryOutputLog(self.log) if output is not None else None,
            redelivery=MemoryRedelivery(self.log, REDELIVERY),
            controls=self.controls(processor),
            failpoint=failpoint,
        )
        runner.start(list(STREAMS))
        return runner

    def drain(self, runner: Runner, *, max_rounds: int = 500, tick: float = 1.0) -> None:
        """Run until nothing is left to do, advancing the clock over retry backoffs."""
        for _ in range(max_rounds):
            handled = runner.run_once(timeout=0)
            if not handled and runner.idle() and runner.run_once(timeout=0) == 0:
                return
            if not handled:
                self.clock.advance(tick)
        raise AssertionError("runner did not settle")

    def actions(self) -> DeadLetterActions:
        def send(
            topic: str,
            partition: int | None,
            key: bytes | None,
            value: bytes,
            headers: list[tuple[str, bytes]],
        ) -> None:
            self.log.append(topic, partition or 0, value, key, tuple(headers))

        policy = self.policy()
        return DeadLetterActions(
            self.dead,
            self.clock,
            send,
            lambda slug: REDELIVERY,
            policy.redelivery_partition,
            lambda purpose: f"queue-{purpose}",
        )

    # -- reading effects ---------------------------------------------------------------------------
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

    def states(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {}
        for s in STREAMS:
            for p in range(PARTITIONS):
                out.update(self.store.all_states(TP(s, p)))
        return out


def fresh_ledger() -> Ledger:
    return Ledger()
