"""The command worker runtime on the in-memory log with a manual clock, for unit tests: a
scripted handler that remembers its runs, a queue's policy, a world of one log and clock that
makes workers and commands, and the pipeline of a failing queue's worker and the dead-letter
consumer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar

from consumers.runtime.dead_letters import MemoryDeadLetters
from consumers.runtime.memory_transport import MemoryLog, MemoryOutput, MemoryTransport
from consumers.runtime.types import Record
from router.settings import Settings
from router.workers.dead_letter_consumer import DeadLetterRecorder
from router.workers.model import Context, QueueHandler, WorkerPolicy
from router.workers.stores import MemoryCommandLedger, MemoryWorkerMetrics
from router.workers.worker import Worker
from streams.clock import ManualClock
from streams.envelopes import Command, build, encode
from streams.outbox.sqlite import SqliteOutbox
from streams.topology import queue_name

ENV = "unit"
MAX = 256 * 1024
Behaviour = Callable[[Command, Context], str | None]
DEFAULTS = Settings.model_fields


class Scripted(QueueHandler):
    """Runs ``behaviour`` and remembers every run: (command id, attempt, clock time)."""

    name: ClassVar[str] = "scripted"

    def __init__(self, behaviour: Behaviour, clock: ManualClock) -> None:
        self.behaviour = behaviour
        self.clock = clock
        self.runs: list[tuple[str, int, float]] = []

    def handle(self, command: Command, ctx: Context) -> str | None:
        self.runs.append((command.command_id, ctx.attempt, self.clock.monotonic()))
        return self.behaviour(command, ctx)

    def attempts_of(self, command_id: str) -> list[int]:
        return [a for c, a, _ in self.runs if c == command_id]

    def times_of(self, command_id: str) -> list[float]:
        return [t for c, _, t in self.runs if c == command_id]


def fail_for(*bad: str) -> Behaviour:
    def behaviour(command: Command, ctx: Context) -> str | None:
        if command.command_id in bad:
            raise RuntimeError(f"boom on {command.command_id}")
        return None

    return behaviour


def policy(purpose: str = "agent-wakeups", **overrides: object) -> WorkerPolicy:
    values: dict[str, object] = {
        "purpose": purpose,
        "env": ENV,
        "batch": 10,
        "retries": 3,
        "retry_delay_s": 30.0,
        "max_in_flight": 1,
        "dead_letter": "dead-letter",
        "max_deliveries": 4,
        "max_envelope_bytes": MAX,
        "poll_interval_s": 0.5,
        "error_max_bytes": 1000,
        "transaction_max_commands": DEFAULTS["worker_transaction_max_commands"].default,
        "transaction_max_ms": DEFAULTS["worker_transaction_max_ms"].default,
    }
    values.update(overrides)
    return WorkerPolicy(**values)  # type: ignore[arg-type]


class World:
    def __init__(self, p: WorkerPolicy) -> None:
        self.policy = p
        self.log = MemoryLog()
        self.clock = ManualClock()
        self.ledger = MemoryCommandLedger()
        self.metrics = MemoryWorkerMetrics()
        self.dlq = queue_name("dead-letter", ENV)
        for topic in {p.queue_topic, *p.retry_topics, self.dlq}:
            self.log.create(topic, 2)

    def worker(self, handler: QueueHandler, *, auto_assign: bool = True) -> Worker:
        transport = MemoryTransport(self.log, "group", auto_assign=auto_assign)
        w = Worker(
            self.policy,
            handler,
            transport,
            MemoryOutput(self.log),
            self.ledger,
            self.clock,
            metrics=self.metrics,
        )
        w.start()
        return w

    def command(
        self,
        command_id: str,
        *,
        project: str = "p1",
        deadline_s: float | None = 3600,
        **payload: object,
    ) -> Command:
        now = self.clock.now()
        return build(
            Command,
            command_id=command_id,
            command_type="agent.wake",
            project_id=project,
            change_id="chg1",
            task_id="t1",
            created_at=now,
            deadline=now + timedelta(seconds=deadline_s) if deadline_s is not None else None,
            payload=dict(payload),
        )

    def send(self, *commands: Command, partition: int = 0) -> None:
        for c in commands:
            self.log.append(
                self.policy.queue_topic, partition, encode(c, max_bytes=MAX), c.project_id.encode()
            )

    def dead_letters(self) -> list[Record]:
        return self.log.all(self.dlq)

    def run_for(self, worker: Worker, seconds: float, step_s: float = 1.0) -> None:
        elapsed = 0.0
        while elapsed <= seconds:
            worker.step()
            self.clock.advance(step_s)
            elapsed += step_s


def always_fail(command: Command, ctx: Context) -> str | None:
    raise RuntimeError(f"handler refuses {command.command_id}")


class Pipeline:
    """A queue's worker that dead-letters everything, and the dead-letter consumer, sharing one
    in-memory log and clock."""

    def __init__(self, outbox: SqliteOutbox) -> None:
        self.world = World(policy(retries=1, retry_delay_s=30))
        self.queue = self.world.worker(Scripted(always_fail, self.world.clock))
        self.store = MemoryDeadLetters()
        dl_policy = policy("dead-letter", batch=5, retries=5, retry_delay_s=60, dead_letter=None)
        self.dl_world = World(dl_policy)
        self.dl_world.log = self.world.log  # one log, one clock
        self.dl_world.clock = self.world.clock
        self.world.log.create(dl_policy.retry_topic, 2)
        self.recorder = DeadLetterRecorder(
            self.store, outbox, self.world.clock, default_tenant="tenant-x"
        )
        self.consumer = self.dl_world.worker(self.recorder)

    def run(self, seconds: float) -> None:
        elapsed = 0.0
        while elapsed <= seconds:
            self.queue.step()
            self.consumer.step()
            self.world.clock.advance(1)
            elapsed += 1
