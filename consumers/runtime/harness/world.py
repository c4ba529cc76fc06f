"""The in-memory world a subscription runs in under test: a log with streams, a store, dead
letters, a clock that moves only when told, an audit log, and runners over them.

It is the runtime's own twin of production (``MemoryLog`` for Kafka, ``MemoryStore`` for Redis),
held to the real backends by the shared contract tests, so what a processor does here it does
there. The property tests drive it step by step; :func:`consumers.runtime.harness.run` drives it
for a processor's author.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

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
from consumers.runtime.metrics import RuntimeInstruments
from consumers.runtime.runner import Runner, RuntimePolicy
from consumers.runtime.types import JSON, TP, EffectKind, OutRecord, Processor
from streams.catalog import CATALOG, Catalog
from streams.clock import ManualClock
from streams.envelopes import Event, encode
from streams.errors import SimulatedCrash
from streams.headers import OUTBOX

STREAMS = ("s0", "s1")
PARTITIONS = 2
REDELIVERY = "redeliver"
OUT = "out"
# Partitions of an output topic the world makes on a processor's first record to it.
OUTPUT_PARTITIONS = 3
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


def partition_of(project: str) -> TP:
    """The stream partition a project lives on in the world (a project lives on one)."""
    h = sum(project.encode())
    return TP(STREAMS[h % len(STREAMS)], (h // 7) % PARTITIONS)


HARNESS_OUTBOX = "obx_" + "5e" * 8

# A simulated process death (a BaseException: nothing in the runner swallows it).
Crash = SimulatedCrash


class OutputOnDemand(MemoryOutput):
    """A transactional producer that creates an output topic on its first record, as a broker
    with ``auto.create.topics.enable`` would: a processor under test names its own topics."""

    def produce(self, record: OutRecord) -> None:
        with self.log.lock:
            if record.topic not in self.log.partitions:
                self.log.create(record.topic, OUTPUT_PARTITIONS)
        super().produce(record)


@dataclass
class World:
    log: MemoryLog = field(default_factory=MemoryLog)
    store: MemoryStore = field(default_factory=MemoryStore)
    dead: MemoryDeadLetters = field(default_factory=MemoryDeadLetters)
    clock: ManualClock = field(default_factory=ManualClock)
    audit: MemoryAuditLog = field(default_factory=MemoryAuditLog)
    outputs: list[MemoryOutput] = field(default_factory=list)
    # The runners' metrics: None reports to the process's own (the runtime's default).
    instruments: RuntimeInstruments | None = None
    # The event types and versions the processors' code knows (their runners' and controls').
    catalog: Catalog = CATALOG
    # The identity of the outbox ``publish`` plays: an event with a slot goes out with it, as the
    # outbox publisher sends it, so subscriptions claim it by slot. None: as a direct producer.
    outbox: str | None = HARNESS_OUTBOX

    def __post_init__(self) -> None:
        for s in STREAMS:
            self.log.create(s, PARTITIONS)
        self.log.create(REDELIVERY, len(STREAMS) * PARTITIONS)
        self.log.create(OUT, OUTPUT_PARTITIONS)

    def tp_of(self, project: str) -> TP:
        return partition_of(project)

    def stream_partitions(self) -> list[TP]:
        return [TP(s, p) for s in STREAMS for p in range(PARTITIONS)]

    def publish(self, ev: Event, raw: bytes | None = None) -> int:
        tp = self.tp_of(ev.project_id)
        headers = ((OUTBOX, self.outbox.encode()),) if self.outbox and ev.slot else ()
        return self.log.append(
            tp.topic,
            tp.partition,
            raw if raw is not None else encode(ev, max_bytes=LIMIT),
            ev.project_id.encode(),
            headers,
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
            # Every poll looks at the store: an operator's move is seen at once.
            control_check_interval_s=0.0,
            streams=STREAMS,
            partitions_per_stream=PARTITIONS,
            catalog=self.catalog,
        )
        values.update(kw)
        return RuntimePolicy(**values)

    def controls(self, processor: Processor, catalog: Catalog | None = None) -> Controls:
        return Controls(
            processor,
            self.store,
            MemoryReader(self.log),
            self.audit,
            self.dead,
            self.clock,
            LIMIT,
            catalog=self.catalog if catalog is None else catalog,
        )

    def runner(
        self,
        processor: Processor,
        *,
        cuts: Iterator[int] | None = None,
        failpoint: Callable[[str], None] = lambda name: None,
        auto_assign: bool = True,
        **policy: Any,
    ) -> Runner:
        transport = MemoryTransport(
            self.log, f"group-{processor.slug}", cuts=cuts, auto_assign=auto_assign
        )
        output = None
        if processor.effect_kind == EffectKind.KAFKA:
            output = OutputOnDemand(self.log)
            self.outputs.append(output)
        runtime = self.policy(**policy)
        runner = Runner(
            processor,
            transport,
            self.store,
            self.dead,
            runtime,
            self.clock,
            output=output,
            output_log=MemoryOutputLog(self.log) if output is not None else None,
            redelivery=MemoryRedelivery(self.log, REDELIVERY),
            controls=self.controls(processor, runtime.catalog),
            failpoint=failpoint,
            instruments=self.instruments,
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
        raise AssertionError(
            f"{runner.processor.slug} did not settle in {max_rounds} rounds of {tick} s: a "
            "partition still waits for a retry or a pending effect (under the block policy a "
            "failing event is retried forever)"
        )

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

    def states(self) -> dict[str, JSON]:
        """Every project's fold, over all stream partitions."""
        out: dict[str, JSON] = {}
        for tp in self.stream_partitions():
            out.update(self.store.all_states(tp))
        return out
