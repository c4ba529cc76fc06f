"""The folds a runner keeps between polls are bounded by ``fold_cache_projects`` and by
``fold_cache_bytes`` (their encoded size): a project's fold past its partition's share of either
is dropped and read back from the store by its next event, and every fold and effect is the same
as with no bound (the in-memory twin, whose store contract is the Redis store's)."""

from __future__ import annotations

from collections.abc import Iterable

import orjson
import pytest

from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.types import JSON, TP
from tests.support.runtime_harness import Counter, FlakyEffects, World, event

PROJECTS = [f"p{i:02d}" for i in range(24)]
ROUNDS = 6


class ReadCounting(MemoryStore):
    """A MemoryStore that counts the folds read back from it."""

    def __init__(self) -> None:
        super().__init__()
        self.folds_read = 0

    def states(self, tp: TP, projects: Iterable[str]) -> dict[str, JSON | None]:
        asked = list(projects)
        self.folds_read += len(asked)
        return super().states(tp, asked)


def _run(
    bound: int, batch_size: int, flaky: bool, bound_bytes: int = 0
) -> tuple[World, ReadCounting, int]:
    store = ReadCounting()
    world = World(store=store)
    # Round-robin over the projects: between two events of a project, every other project of its
    # partition has an event, so a share smaller than the partition's projects must evict.
    for n in range(1, ROUNDS + 1):
        for p in PROJECTS:
            world.publish(event(p, n))
    processor = FlakyEffects() if flaky else Counter()
    FlakyEffects.budget = {event(p, 3).event_id: 2 for p in PROJECTS[::5]} if flaky else {}
    runner = world.runner(
        processor, batch_size=batch_size, fold_cache_projects=bound, fold_cache_bytes=bound_bytes
    )
    most = 0
    for _ in range(500):
        handled = runner.run_once(timeout=0)
        most = max([most, *(len(part.states) for part in runner.parts.values())])
        if not handled and runner.idle() and runner.run_once(timeout=0) == 0:
            break
        if not handled:
            world.clock.advance(1.0)
    return world, store, most


def _effects(world: World) -> list[tuple[str, int, int]]:
    return sorted((r["project"], r["n"], r["count"]) for r in world.out_records())


@pytest.mark.parametrize("flaky", [False, True], ids=["clean", "failing-heads"])
@pytest.mark.parametrize("batch_size", [1, 7, 50])
@pytest.mark.parametrize("bound", [1, 4, 9])
def test_a_bounded_fold_cache_gives_the_folds_and_effects_of_an_unbounded_one(
    bound: int, batch_size: int, flaky: bool
) -> None:
    reference, _, _ = _run(0, batch_size, flaky)
    world, store, most = _run(bound, batch_size, flaky)

    assert world.states() == reference.states()
    assert _effects(world) == _effects(reference)
    assert _effects(world) == sorted(
        (p, n, n) for p in PROJECTS for n in range(1, ROUNDS + 1)
    )  # each event's effect once, its count the fold's, in order per project
    share = max(1, bound // 4)  # the harness's 2 streams x 2 partitions, all owned by one runner
    # Between polls a partition keeps its share; during one it also holds its batch's projects.
    assert most <= share + min(batch_size, len(PROJECTS))
    assert store.folds_read > len(PROJECTS)  # dropped folds were read back


def test_between_polls_a_partition_keeps_no_more_than_its_share() -> None:
    store = ReadCounting()
    world = World(store=store)
    for n in (1, 2):
        for p in PROJECTS:
            world.publish(event(p, n))
    runner = world.runner(Counter(), batch_size=500, fold_cache_projects=8)
    world.drain(runner)
    assert all(len(part.states) <= 2 for part in runner.parts.values())
    unbounded = World()
    for n in (1, 2):
        for p in PROJECTS:
            unbounded.publish(event(p, n))
    runner = unbounded.runner(Counter(), batch_size=500)
    unbounded.drain(runner)
    assert sum(len(part.states) for part in runner.parts.values()) == len(PROJECTS)


@pytest.mark.parametrize("flaky", [False, True], ids=["clean", "failing-heads"])
@pytest.mark.parametrize("batch_size", [1, 7, 50])
@pytest.mark.parametrize("bound_bytes", [1, 60, 200])
def test_a_fold_cache_bounded_by_bytes_gives_the_folds_and_effects_of_an_unbounded_one(
    bound_bytes: int, batch_size: int, flaky: bool
) -> None:
    reference, _, _ = _run(0, batch_size, flaky)
    world, store, _ = _run(0, batch_size, flaky, bound_bytes)

    assert world.states() == reference.states()
    assert _effects(world) == _effects(reference)
    assert store.folds_read > len(PROJECTS)  # dropped folds were read back


@pytest.mark.parametrize("bound_bytes", [1, 100, 400])
def test_between_polls_a_partition_keeps_no_more_than_its_share_of_the_bytes(
    bound_bytes: int,
) -> None:
    world = World()
    for n in range(1, 12):  # counts of one and two digits: folds of two sizes
        for p in PROJECTS:
            world.publish(event(p, n))
    runner = world.runner(Counter(), batch_size=50, fold_cache_bytes=bound_bytes)
    world.drain(runner)
    share = bound_bytes // 4  # the harness's 2 streams x 2 partitions, all owned by one runner
    for part in runner.parts.values():
        encoded = sum(len(orjson.dumps(state)) for state in part.states.values())
        assert part.kept_bytes == encoded  # every fold kept was written, its size counted
        assert part.kept_bytes <= share or len(part.states) == 1
        assert part.states  # the latest written is always kept
    unbounded = World()
    for n in range(1, 12):
        for p in PROJECTS:
            unbounded.publish(event(p, n))
    runner = unbounded.runner(Counter(), batch_size=50, fold_cache_bytes=0)
    unbounded.drain(runner)
    assert sum(len(part.states) for part in runner.parts.values()) == len(PROJECTS)
