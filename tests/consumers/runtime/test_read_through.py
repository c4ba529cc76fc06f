"""The group's committed offset past transaction markers, on the in-memory twin: a partition read
to its end with everything handed over done commits the consumer's position (past the markers
that take offsets but are never delivered), so a caught-up group reads lag 0; short of that, the
committed offset is never past the first record not yet done."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.memory_transport import cuts_from
from consumers.runtime.runner import Runner
from consumers.runtime.types import TP, Processor
from consumers.subscriptions.ledger import Ledger
from tests.support.runtime_harness import (
    STREAMS,
    Counter,
    FlakyEffects,
    World,
    event,
)

PROJECTS = ("alpha", "beta", "gamma", "delta")


@pytest.fixture(autouse=True)
def _no_failing_effects() -> Iterator[None]:
    yield
    FlakyEffects.budget = {}


def _publish_in_transactions(world: World, sizes: list[int], aborted: list[int]) -> None:
    """Events of ``PROJECTS`` in transactions of these sizes, round robin over the projects;
    each transaction writes its records, then its marker on every partition it wrote to.
    ``aborted[i]`` records of an aborted transaction (and its marker) follow transaction i."""
    n = 0
    for i, size in enumerate(sizes):
        touched: set[TP] = set()
        for _ in range(size):
            n += 1
            project = PROJECTS[n % len(PROJECTS)]
            touched.add(world.tp_of(project))
            world.publish(event(project, n))
        for tp in sorted(touched):
            world.log.unreadable(tp.topic, tp.partition)
        gone = aborted[i] if i < len(aborted) else 0
        if gone:
            tp = world.tp_of(PROJECTS[i % len(PROJECTS)])
            world.log.unreadable(tp.topic, tp.partition, gone + 1)


def _partitions(world: World) -> list[TP]:
    return [TP(s, p) for s in STREAMS for p in range(world.log.partitions[s])]


def _committed(world: World, runner: Runner) -> dict[TP, int | None]:
    group = world.log.offsets.get(f"group-{runner.processor.slug}", {})
    return {tp: (c.offset if (c := group.get(tp)) else None) for tp in _partitions(world)}


def _first_not_done(world: World, tp: TP) -> int:
    """The first readable offset the store does not count as done (the end if none)."""
    progress = world.store.load(tp)
    for offset, record in enumerate(world.log.records[tp]):
        if record is not None and not progress.is_done(offset):
            return offset
    return world.log.end(tp)


def _last_record(world: World, tp: TP) -> int:
    return max((r.offset for r in world.log.records[tp] if r is not None), default=-1)


@pytest.mark.parametrize("processor", [Ledger, Counter], ids=["redis-effects", "kafka-effects"])
def test_a_caught_up_group_commits_past_the_markers_while_the_cursor_stays_on_the_last_record(
    processor: type[Processor],
) -> None:
    world = World()
    _publish_in_transactions(world, [3, 1, 4, 2], aborted=[0, 2])
    runner = world.runner(processor())
    world.drain(runner)
    marked = 0
    for tp in _partitions(world):
        end = world.log.end(tp)
        last = _last_record(world, tp)
        if last < 0:
            continue
        # The markers are what makes the test meaningful: the old rule (last record + 1)
        # stays behind the end on every partition a transaction ended on.
        assert end > last + 1, (tp, last, end)
        marked += 1
        assert _committed(world, runner)[tp] == end, tp
        # The cursor is what resumes work; it stays on the last record applied.
        assert world.store.load(tp).acked_through == last
    assert marked >= 2
    # A new owner starts after the cursor, reads only markers, applies nothing twice.
    applied = runner.stats.applied
    runner.close()
    again = world.runner(processor())
    world.drain(again)
    assert again.stats.applied == 0 and applied == 10
    written = [tp for tp in _partitions(world) if _last_record(world, tp) >= 0]
    assert all(_committed(world, again)[tp] == world.log.end(tp) for tp in written)


def test_a_batch_that_fills_up_before_the_marker_commits_the_position_once_it_reads_on() -> None:
    world = World()
    tp = world.tp_of("alpha")
    for n in range(1, 4):
        world.publish(event("alpha", n))
    world.log.unreadable(tp.topic, tp.partition)
    runner = world.runner(Counter(), batch_size=3)
    assert runner.run_once(timeout=0) == 3
    # The batch stopped right after its last record: that is what its transaction commits.
    assert _committed(world, runner)[tp] == 3
    transactions = runner.stats.transactions
    assert runner.run_once(timeout=0) == 0
    # The next poll read the marker and found the end: one transaction of offsets only.
    assert _committed(world, runner)[tp] == 4 == world.log.end(tp)
    assert runner.stats.transactions == transactions + 1
    assert runner.run_once(timeout=0) == 0
    assert runner.stats.transactions == transactions + 1, "committed again with nothing new"
    assert world.store.load(tp).acked_through == 2


def test_a_failing_last_event_keeps_the_committed_offset_at_it_until_it_is_done() -> None:
    world = World()
    tp = world.tp_of("alpha")
    for n in range(1, 4):
        world.publish(event("alpha", n))
    world.log.unreadable(tp.topic, tp.partition)
    failing = event("alpha", 3)
    FlakyEffects.budget = {failing.event_id: 2}
    runner = world.runner(FlakyEffects())
    runner.run_once(timeout=0)
    assert _committed(world, runner)[tp] == 2
    for _ in range(3):
        runner.run_once(timeout=0)
        assert _committed(world, runner)[tp] == 2, "past a record not yet applied"
    world.drain(runner)
    assert _committed(world, runner)[tp] == 4 == world.log.end(tp)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    aborted=st.lists(st.integers(0, 2), max_size=8),
    cuts=st.lists(st.integers(1, 7), max_size=30),
    failures=st.dictionaries(st.integers(1, 40), st.integers(1, 3), max_size=4),
    kafka=st.booleans(),
    poison=st.booleans(),
)
def test_the_committed_offset_is_never_past_a_record_not_done_and_reaches_the_end(
    sizes: list[int],
    aborted: list[int],
    cuts: list[int],
    failures: dict[int, int],
    kafka: bool,
    poison: bool,
) -> None:
    world = World()
    _publish_in_transactions(world, sizes, aborted)
    if poison:
        tp = world.tp_of("alpha")
        world.publish_raw(tp, b"not an event")
        world.log.unreadable(tp.topic, tp.partition)
    total = sum(sizes)
    # Effects that fail a few times (retried after a backoff; five failures dead-letter).
    FlakyEffects.budget = {
        event(PROJECTS[n % len(PROJECTS)], n).event_id: k for n, k in failures.items() if n <= total
    }
    processor: Processor = FlakyEffects() if kafka else Ledger()
    runner = world.runner(processor, cuts=cuts_from(cuts), max_batch_failures=3)
    for _ in range(400):
        handled = runner.run_once(timeout=0)
        committed = _committed(world, runner)
        for tp in _partitions(world):
            mark = committed[tp]
            assert mark is None or mark <= _first_not_done(world, tp), (tp, mark)
        if not handled and runner.idle() and runner.run_once(timeout=0) == 0:
            break
        if not handled:
            world.clock.advance(1.0)
    else:
        raise AssertionError("the runner did not settle")
    committed = _committed(world, runner)
    for tp in _partitions(world):
        if _last_record(world, tp) >= 0:
            assert committed[tp] == world.log.end(tp), (tp, committed[tp], world.log.end(tp))
