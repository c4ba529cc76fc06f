"""Holes in exactly-once that a happy-shaped crash test does not reach: each test here builds the
exact batch shape (a failing head event of one project, later events of another project in the
same partition, operator moves) that once lost or doubled an effect."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from consumers.runtime.memory import cuts_from
from consumers.runtime.types import TP
from tests.runtime_harness import PROJECTS_SHARING, Counter, Crash, World, event


@pytest.fixture(autouse=True)
def _no_failing_events() -> Iterator[None]:
    yield
    Counter.failing = set()


def _two_projects(world: World) -> tuple[str, str, TP]:
    x, y = PROJECTS_SHARING
    assert world.tp_of(x) == world.tp_of(y)
    return x, y, world.tp_of(x)


def _crash_at(boundary: str, nth: int = 1) -> Callable[[str], None]:
    hits = {"n": 0}

    def failpoint(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == nth:
                raise Crash(name)

    return failpoint


def _out_by_project(world: World) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in world.out_records():
        out.setdefault(r["project"], []).append(r["n"])
    return {p: sorted(ns) for p, ns in out.items()}


def _held_head_log(world: World) -> tuple[str, str]:
    """x1 applies alone; then x2 fails for good, y1..y4 of the same partition apply past it."""
    x, y, _ = _two_projects(world)
    world.publish(event(x, 1))
    head = event(x, 2)
    Counter.failing = {head.event_id}
    world.publish(head)
    for n in range(1, 5):
        world.publish(event(y, n))
    return x, y


def test_a_crash_after_the_store_commit_of_a_held_back_batch_loses_no_kafka_effect() -> None:
    world = World()
    x, y = _held_head_log(world)
    # Batch 1 is x1 alone (its transaction commits offset 1); batch 2 carries the failing x2 and
    # y1..y4: acked_through stays at 0, so its transaction would commit offset 1 again.
    first = world.runner(
        Counter(), cuts=cuts_from([1, 5]), failpoint=_crash_at("runtime.after_store_commit", 2)
    )
    with pytest.raises(Crash):
        world.drain(first)
    world.drain(world.runner(Counter()))
    assert _out_by_project(world) == {x: [1], y: [1, 2, 3, 4]}
    assert len(world.dead.list()) == 1


def test_an_aborted_transaction_of_a_held_back_batch_loses_no_kafka_effect() -> None:
    world = World()
    x, y = _held_head_log(world)
    runner = world.runner(Counter(), cuts=cuts_from([1, 5]))
    output = world.outputs[-1]
    calls = {"n": 0}

    def fail_second() -> bool:
        calls["n"] += 1
        return calls["n"] == 2

    output.fail_commit = fail_second
    world.drain(runner)
    assert _out_by_project(world) == {x: [1], y: [1, 2, 3, 4]}


def test_a_crash_after_reprocess_from_loses_no_rerun_effect() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 5):
        world.publish(event(x, n))
    world.drain(world.runner(Counter()))
    # The group's committed offset is 4; the cursor goes back to 1 at revision 1.
    world.controls(Counter()).reprocess_from(tp, 2, 0, who="oncall", why="downstream lost data")
    crashing = world.runner(Counter(), failpoint=_crash_at("runtime.after_store_commit"))
    with pytest.raises(Crash):
        world.drain(crashing)
    world.drain(world.runner(Counter()))
    assert _out_by_project(world) == {x: [1, 2, 3, 3, 4, 4]}
