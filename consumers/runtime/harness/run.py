"""One run of a processor over a list of events in the in-memory world, and what it left: the
effects as they landed (Redis data, Kafka records, SQL statements and file lines of each applied
event), the folds, the dead letters, the cursors.

SQL statements and file lines are recorded, not run: the world has no database and no object
store. What is recorded is what ``process`` returned for each event whose claim committed, so an
event processed again (a crash before its commit, a batch retried) counts once, with what the
committing call returned.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from opentelemetry.metrics import NoOpMeter

from consumers.runtime.caught_up import caught_up_mark
from consumers.runtime.controls import Controls
from consumers.runtime.harness.result import (
    Applied,
    CaughtUpCall,
    DeadLettered,
    PartitionCursor,
    Result,
)
from consumers.runtime.harness.world import (
    HARNESS_OUTBOX,
    REDELIVERY,
    STREAMS,
    Crash,
    World,
    partition_of,
)
from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.metrics import RuntimeInstruments
from consumers.runtime.runner import Runner
from consumers.runtime.store import Commit
from consumers.runtime.types import (
    TP,
    Delivery,
    Effects,
    OutRecord,
    Processor,
    Progress,
)
from streams.catalog import CATALOG
from streams.envelopes import Event
from streams.headers import RECORD_ID

# What an operator may do between the two installments of a run's events (``operator_move``).
OPERATOR_MOVES = ("re_reduce", "reprocess")
# Rounds of polls a run may take per record of its log before it counts as stuck, over a floor
# for the retries' backoffs (a failing batch is retried four times, up to 15 s apart).
ROUNDS_PER_RECORD = 4
ROUNDS_FLOOR = 500
# Marks the harness's wrapper of a processor's process method, with the method it wraps.
_WITNESSED_FROM = "_harness_witnesses"


class _EffectsWitness:
    """What ``process`` returned for each event, kept until the event's claim commits, and each
    eventless call, kept until the cursor records it."""

    def __init__(self) -> None:
        self.returned: dict[tuple[TP, str], Applied] = {}
        self.applied: list[Applied] = []
        self.calls: dict[TP, tuple[str, CaughtUpCall]] = {}
        self.caught_up_calls: list[CaughtUpCall] = []

    def saw(self, event: Event | None, delivery: Delivery, effects: Effects) -> None:
        if event is None:
            made = Progress(acked_through=delivery.offset, cursor_revision=delivery.cursor_revision)
            call = CaughtUpCall(delivery.tp, delivery.offset, delivery.cursor_revision)
            self.calls[delivery.tp] = (caught_up_mark(made), call)
            return
        self.returned[(delivery.tp, event.event_id)] = Applied(
            event.event_id,
            event.project_id,
            delivery.tp,
            delivery.offset,
            delivery.cursor_revision,
            list(effects.sql),
            list(effects.lines),
        )

    def committed(self, commit: Commit) -> None:
        for event_id in commit.claims:
            seen = self.returned.pop((commit.tp, event_id), None)
            if seen is not None:
                self.applied.append(seen)
        mark, call = self.calls.get(commit.tp, ("", None))
        if call is not None and not commit.claims and commit.progress.caught_up == mark:
            self.caught_up_calls.append(call)
            del self.calls[commit.tp]


class _WitnessedStore(MemoryStore):
    """The in-memory store, telling the witness of every commit that landed."""

    def __init__(self, witness: _EffectsWitness) -> None:
        super().__init__()
        self.witness = witness

    def commit(self, commit: Commit) -> None:
        super().commit(commit)
        self.witness.committed(commit)


def _witnessed(processor: Processor, witness: _EffectsWitness) -> Processor:
    """The processor, each ``process`` result seen by the witness. The wrapper is an attribute of
    the instance over its class's method: the processor stays of its own type, where the
    runtime reads its hooks."""
    process = processor.process
    process = getattr(process, _WITNESSED_FROM, process)  # an instance run before: its own

    def seen(event: Event | None, state: Any, delivery: Delivery) -> Effects:
        effects: Effects = process(cast(Event, event), state, delivery)
        witness.saw(event, delivery, effects)
        return effects

    setattr(seen, _WITNESSED_FROM, process)
    try:
        processor.process = seen  # type: ignore[method-assign]
    except AttributeError as exc:
        raise TypeError(
            f"{type(processor).__name__}: the harness watches a processor's process calls "
            "through an attribute of the instance, and this one takes none (__slots__ without "
            "__dict__); give it a __dict__ to test it here"
        ) from exc
    return processor


def _unwitnessed(processor: Processor) -> None:
    if hasattr(getattr(processor, "process", None), _WITNESSED_FROM):
        delattr(processor, "process")


class _Process:
    """The subscription's process in the world: one runner at a time; a crash at the armed
    fail-point kills it, and a new one (a fresh processor, a new consumer) takes over."""

    def __init__(
        self,
        world: World,
        witness: _EffectsWitness,
        factory: Callable[[], Processor],
        shape: Sequence[int],
        crash_at: tuple[str, int] | None,
        policy: Mapping[str, Any],
    ) -> None:
        self.world = world
        self.witness = witness
        self.factory = factory
        self.crash_at = crash_at
        self.policy = dict(policy)
        self.hits: Counter[str] = Counter()
        self.cuts = _cycle(shape)
        self.made: list[Processor] = []
        self.runner = self._start()

    def _failpoint(self, name: str) -> None:
        self.hits[name] += 1
        if self.crash_at == (name, self.hits[name]):
            raise Crash(f"{name} (hit {self.hits[name]})")

    def _start(self) -> Runner:
        processor = _witnessed(self.factory(), self.witness)
        self.made.append(processor)
        return self.world.runner(
            processor, cuts=self.cuts, failpoint=self._failpoint, **self.policy
        )

    def drain(self, rounds: int) -> None:
        while True:
            try:
                self.world.drain(self.runner, max_rounds=rounds)
                return
            except Crash:
                self.runner = self._start()

    def stop(self, rounds: int) -> None:
        """A clean stop (an open part closes, offsets commit), after a last drain."""
        while True:
            try:
                self.world.drain(self.runner, max_rounds=rounds)
                self.runner.close()
                return
            except Crash:
                self.runner = self._start()

    def forget(self) -> None:
        """Hand the processors back as they came (an instance may be run again)."""
        for processor in self.made:
            _unwitnessed(processor)


def _cycle(shape: Sequence[int]) -> Iterator[int] | None:
    """Poll sizes: ``shape`` over and over; none (the policy's batch size) when it is empty."""
    if not shape:
        return None
    if any(size < 1 for size in shape):
        raise ValueError(f"shape {tuple(shape)}: every poll size must be at least 1")
    return itertools.cycle(shape)


def run(
    factory: Callable[[], Processor],
    events: Sequence[Event | bytes],
    *,
    shape: Sequence[int] = (),
    crash_at: tuple[str, int] | None = None,
    operator_move: tuple[str, int] | None = None,
    policy: Mapping[str, Any] | None = None,
    outbox: str | None = HARNESS_OUTBOX,
) -> Result:
    """Publish ``events`` (raw bytes: a record that is no event, on the partition of the event
    before it) and run the processor ``factory`` makes until nothing is left to do.

    ``shape``: the poll sizes, in order and over again (empty: the policy's batch size).
    ``crash_at``: ``(fail-point, n)``: the process dies the n-th time it passes that fail-point,
    and a new one takes over. ``operator_move``: ``(move, k)``: once the first k events are
    consumed, an operator re-reduces every partition (``"re_reduce"``) or reprocesses each from
    the middle of what it acknowledged (``"reprocess"``); then the rest are published.
    ``policy``: the runtime's settings (``RuntimePolicy`` fields) over the world's own.
    ``outbox``: the identity of the outbox the events with a slot come from, as its publisher
    sends them (their claims are kept by slot); None: produced directly, claimed by id."""
    if operator_move is not None and operator_move[0] not in OPERATOR_MOVES:
        raise ValueError(
            f"operator_move {operator_move!r}: the move is one of {', '.join(OPERATOR_MOVES)}"
        )
    witness = _EffectsWitness()
    world = World(
        store=_WitnessedStore(witness),
        instruments=RuntimeInstruments(NoOpMeter("rhumbatron.harness")),
        # The operator's moves fold with the catalog the runners know.
        catalog=(policy or {}).get("catalog", CATALOG),
        outbox=outbox,
    )
    first = len(events) if operator_move is None else operator_move[1]
    rounds = ROUNDS_FLOOR + ROUNDS_PER_RECORD * len(events)
    _publish(world, events, 0, first)
    process = _Process(world, witness, factory, shape, crash_at, policy or {})
    try:
        if operator_move is not None:
            process.drain(rounds)
            _move(world, factory(), operator_move[0])
            _publish(world, events, first, len(events))
        process.stop(rounds)
    finally:
        process.forget()
    if crash_at is not None and process.hits[crash_at[0]] < crash_at[1]:
        raise ValueError(
            f"crash_at {crash_at!r}: the run passed {crash_at[0]} "
            f"{process.hits[crash_at[0]]} times, so it never crashed there (the fail-points it "
            f"passed: {dict(process.hits)})"
        )
    return _result(world, witness, process.hits, events)


def _publish(world: World, events: Sequence[Event | bytes], start: int, end: int) -> None:
    for i in range(start, end):
        item = events[i]
        if isinstance(item, Event):
            world.publish(item)
        else:
            world.publish_raw(_poison_partition(events, i), item)


def _poison_partition(events: Sequence[Event | bytes], at: int) -> TP:
    """Where a record that is no event goes: the partition of the nearest event before it, or
    after it; the first stream's first partition when there is no event at all."""
    for i in [*range(at - 1, -1, -1), *range(at + 1, len(events))]:
        item = events[i]
        if isinstance(item, Event):
            return partition_of(item.project_id)
    return TP(STREAMS[0], 0)


def _move(world: World, processor: Processor, move: str) -> None:
    controls: Controls = world.controls(processor)
    why = "the harness: an operator's move between two installments of events"
    for tp in world.stream_partitions():
        progress = world.store.load(tp)
        if not progress.has_cursor():
            continue
        if move == "re_reduce":
            controls.re_reduce(tp, who="harness", why=why)
        else:
            offset = (progress.acked_through + 1) // 2
            controls.reprocess_from(tp, offset, progress.cursor_revision, who="harness", why=why)


def _result(
    world: World,
    witness: _EffectsWitness,
    hits: Counter[str],
    events: Sequence[Event | bytes],
) -> Result:
    redis: dict[TP, dict[str, Any]] = {}
    for key in world.store.space.data:
        topic, partition, logical = key.split("|", 2)
        tp = TP(topic, int(partition))
        redis.setdefault(tp, {})[logical] = world.store.read(tp, logical)
    used = {partition_of(e.project_id) for e in events if isinstance(e, Event)}
    used |= {_poison_partition(events, i) for i, e in enumerate(events) if not isinstance(e, Event)}
    cursors = {}
    for tp in sorted(used):
        progress = world.store.load(tp)
        cursors[tp] = PartitionCursor(
            progress.acked_through, progress.cursor_revision, progress.reduced_through
        )
    return Result(
        redis={tp: redis[tp] for tp in sorted(redis)},
        records=_records(world),
        applied=list(witness.applied),
        folds=world.states(),
        dead_letters=_dead_letters(world),
        cursors=cursors,
        caught_up_calls=list(witness.caught_up_calls),
        failpoints=dict(sorted(hits.items())),
    )


def _records(world: World) -> list[OutRecord]:
    out: list[OutRecord] = []
    for topic in sorted(world.log.partitions):
        if topic in STREAMS or topic == REDELIVERY:
            continue
        for record in world.log.all(topic):
            record_id = record.header(RECORD_ID)
            out.append(
                OutRecord(
                    topic,
                    (record.key or b"").decode(),
                    record.value or b"",
                    record_id.decode() if record_id is not None else "",
                    tuple((k, v) for k, v in record.headers if k != RECORD_ID),
                )
            )
    return out


def _dead_letters(world: World) -> list[DeadLettered]:
    out = [
        DeadLettered(
            entry.event_id,
            letter.error,
            letter.attempts,
            TP(letter.source_topic, letter.source_partition),
            entry.offset,
            entry.value,
        )
        for letter in world.dead.list(limit=1 << 30)
        for entry in letter.entries
    ]
    return sorted(out, key=lambda d: (d.partition, d.offset))
