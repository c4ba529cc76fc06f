"""Files effects on the in-memory runtime: every event in exactly one part, across crashes."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.memory_transport import cuts_from
from consumers.runtime.parts import Line
from consumers.runtime.types import JSON, TP, BaseProcessor, Delivery, EffectKind, Effects
from streams.envelopes import Event
from tests.support.runtime_harness import Crash, World, event

PROJECTS = ["alpha", "beta", "gamma", "delta", "eps"]


class Parts(BaseProcessor):
    """Writes each event's id as a line; a part closes at ``size`` lines or ``max_age`` seconds."""

    slug: ClassVar[str] = "parts"
    effect_kind: ClassVar[EffectKind] = EffectKind.FILES

    def __init__(self, size: int = 7, max_age: float = 60.0) -> None:
        self.size = size
        self.max_age = max_age
        self.objects: dict[str, bytes] = {}
        self.writes = 0

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        return Effects(lines=[event.event_id.encode()])

    def should_close(self, lines: int, size: int, age_s: float) -> bool:
        return lines >= self.size or (lines > 0 and age_s >= self.max_age)

    def finish(self, tp: TP, lines: list[Line]) -> tuple[str, bytes]:
        blob = b"\n".join(line.data for line in lines)
        return (
            f"{tp.topic}/{tp.partition}/{lines[0].offset}-{hashlib.sha256(blob).hexdigest()[:12]}",
            blob,
        )

    def store(self, key: str, blob: bytes) -> None:
        self.writes += 1
        self.objects[key] = blob


def _fill(world: World, per_project: int = 6, twice: bool = False) -> list[str]:
    ids = []
    for n in range(1, per_project + 1):
        for p in PROJECTS:
            ev = event(p, n)
            world.publish(ev)
            if twice:
                world.publish(ev)
            ids.append(ev.event_id)
    return ids


def _archived(proc: Parts) -> Counter[str]:
    return Counter(line.decode() for blob in proc.objects.values() for line in blob.split(b"\n"))


def test_every_event_lands_in_exactly_one_part_even_when_published_twice() -> None:
    world = World()
    ids = _fill(world, twice=True)
    proc = Parts()
    runner = world.runner(proc)
    world.drain(runner)
    runner.close()
    assert _archived(proc) == Counter(ids)


def test_an_open_part_closes_on_age_while_idle() -> None:
    world = World()
    ids = _fill(world, per_project=1)
    proc = Parts(size=1000, max_age=30)
    runner = world.runner(proc)
    world.drain(runner, tick=1.0)
    # Every event was handled and the part is still open: younger than max_age, far from size.
    assert runner.idle() and proc.objects == {} and proc.writes == 0
    world.clock.advance(31)
    runner.run_once(timeout=0)
    assert _archived(proc) == Counter(ids)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 9), min_size=1, max_size=30), st.integers(1, 12))
def test_any_batch_cuts_and_part_sizes_archive_every_event_once(cuts: list[int], size: int) -> None:
    world = World()
    ids = _fill(world)
    proc = Parts(size=size)
    runner = world.runner(proc, cuts=cuts_from(cuts))
    world.drain(runner)
    runner.close()
    assert _archived(proc) == Counter(ids)


@pytest.mark.parametrize(
    "boundary",
    ["runtime.before_store_commit", "runtime.after_store_commit", "runtime.after_part_write"],
)
@pytest.mark.parametrize("nth", [1, 3])
def test_a_crash_around_a_part_loses_nothing_and_doubles_nothing(boundary: str, nth: int) -> None:
    world = World()
    ids = _fill(world)
    proc = Parts(size=5)
    hits = {"n": 0}

    def crash(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == nth:
                raise Crash(name)

    first = world.runner(proc, cuts=cuts_from([4] * 100), failpoint=crash)
    with pytest.raises(Crash):
        world.drain(first)
    second = world.runner(proc, cuts=cuts_from([3] * 100))
    world.drain(second)
    second.close()
    assert _archived(proc) == Counter(ids)
    if boundary == "runtime.after_store_commit":
        assert second.stats.recovered == 1  # the recorded part was written by the next owner


def test_revoke_closes_the_open_part_first() -> None:
    world = World()
    ids = _fill(world, per_project=2)
    proc = Parts(size=1000)
    a = world.runner(proc)
    a.run_once(timeout=0)
    tps = sorted(a.parts)
    a.transport.revoke(tps)  # type: ignore[attr-defined]
    a.run_once(timeout=0)
    assert _archived(proc) == Counter(ids)
    b = world.runner(proc)
    world.drain(b)
    b.close()
    assert _archived(proc) == Counter(ids)
