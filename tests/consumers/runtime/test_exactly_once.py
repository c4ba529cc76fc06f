"""Holes in exactly-once that a happy-shaped crash test does not reach: each test here builds the
exact batch shape (a failing head event of one project, later events of another project in the
same partition, operator moves) that once lost or doubled an effect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.memory_transport import cuts_from
from consumers.runtime.transport import Committed
from consumers.runtime.types import JSON, TP, Delivery, Effects
from consumers.subscriptions.archive.archiver import AuditArchiver, PartLimits
from consumers.subscriptions.archive.store import LocalObjectStore
from streams.envelopes import Event, encode
from streams.errors import ControlRefused
from streams.headers import ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC
from tests.support.runtime_harness import (
    LIMIT,
    PROJECTS_SHARING,
    REDELIVERY,
    STREAMS,
    Counter,
    Crash,
    FlakyEffects,
    World,
    event,
)


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


@pytest.mark.parametrize(
    "boundary", ["runtime.after_store_commit", "runtime.after_transaction_commit"]
)
def test_offsets_rewritten_from_outside_neither_lose_nor_double_a_pending_copy(
    boundary: str,
) -> None:
    world = World()
    x, y = _held_head_log(world)
    first = world.runner(Counter(), cuts=cuts_from([1, 5]), failpoint=_crash_at(boundary, 2))
    with pytest.raises(Crash):
        world.drain(first)
    # An operator resets the group's offsets with Kafka's own tools: the marker is gone.
    tp = world.tp_of(x)
    world.log.offsets[f"group-{Counter.slug}"][tp] = Committed(1, "")
    world.drain(world.runner(Counter()))
    assert _out_by_project(world) == {x: [1], y: [1, 2, 3, 4]}
    ids = [r["_id"] for r in world.out_records()]
    assert len(ids) == len(set(ids))


# -- operator moves -------------------------------------------------------------------------------


def test_reprocess_from_the_first_offset_survives_the_next_assignment() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 4):
        world.publish(event(x, n))
    world.drain(world.runner(Counter()))
    world.controls(Counter()).reprocess_from(tp, 0, 0, who="oncall", why="rebuild everything")
    # A new owner takes the partition: it must start at offset 0, not at the group's offset.
    world.drain(world.runner(Counter()))
    assert _out_by_project(world) == {x: [1, 1, 2, 2, 3, 3]}
    assert world.states()[x] == {"count": 3, "seen": [1, 2, 3]}


class Rebuilt(Counter):
    """The same fold, as an operator's tool rebuilds it (marks the states it made)."""

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        out = super().reduce(state, event)
        return {**out, "rebuilt": True} if out is not None else None


def test_a_re_reduce_is_seen_by_the_running_owner_and_not_written_over() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 3):
        world.publish(event(x, n))
    owner = world.runner(Counter())
    world.drain(owner)
    world.controls(Rebuilt()).re_reduce(tp, who="oncall", why="fold repaired")
    world.publish(event(x, 3))
    world.drain(owner)  # the owner keeps running; its cached fold is the old one
    assert world.states()[x] == {"count": 3, "seen": [1, 2, 3], "rebuilt": True}


def test_reprocess_from_is_bounded_by_the_retained_range_and_the_cursor() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 5):
        world.publish(event(x, n))
    runner = world.runner(Counter())
    world.drain(runner)
    controls = world.controls(Counter())
    with pytest.raises(ControlRefused, match=r"0\.\.4"):
        controls.reprocess_from(tp, 9, 0, who="oncall", why="forward is not a reprocess")
    with pytest.raises(ControlRefused, match=r"0\.\.4"):
        controls.reprocess_from(tp, -1, 0, who="oncall", why="no such offset")
    assert world.audit.entries() == []


def test_skip_through_is_bounded_by_the_partition_end() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 4):
        world.publish(event(x, n, fail=(n == 2)))
    controls = world.controls(Counter())
    with pytest.raises(ControlRefused, match=r"end.*2"):
        controls.skip_through(tp, 10, who="oncall", why="skip what has not arrived")
    controls.skip_through(tp, 2, who="oncall", why="ticket 7")
    assert [e["action"] for e in world.audit.entries()] == ["skip_through"]


class Flaky(Counter):
    """Fails an event the given number of times, then applies it."""

    budget: dict[str, int] = {}

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        left = self.budget.get(event.event_id, 0)
        if left > 0:
            self.budget[event.event_id] = left - 1
            raise ValueError(f"flaky {event.event_id}")
        return super().reduce(state, event)


def test_a_success_clears_the_failure_count_so_a_later_failure_starts_from_one() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    evs = [event(x, n) for n in range(1, 4)]
    for ev in evs:
        world.publish(ev)
    Flaky.budget = {evs[1].event_id: 3}
    runner = world.runner(Flaky())
    world.drain(runner)
    assert world.dead.list() == []
    world.controls(Flaky()).reprocess_from(tp, 0, 0, who="oncall", why="rerun")
    Flaky.budget = {evs[1].event_id: 3}  # fails three times again: still below five
    world.drain(runner)
    assert world.dead.list() == [], "an old failure count dead-lettered the event early"
    assert world.states()[x]["seen"] == [1, 2, 3]


# -- hostile headers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        ((ORIGIN_TOPIC, b"s1"), (ORIGIN_PARTITION, b"1"), (ORIGIN_OFFSET, b"0")),
        ((ORIGIN_TOPIC, b"s0"), (ORIGIN_PARTITION, b"zero")),
        ((ORIGIN_TOPIC, b"\xff"), (ORIGIN_OFFSET, b"-x")),
    ],
)
def test_a_stream_record_with_redelivery_headers_is_judged_on_its_value(
    headers: tuple[tuple[str, bytes], ...],
) -> None:
    world = World()
    x, _, tp = _two_projects(world)
    good = event(x, 1)
    world.log.append(tp.topic, tp.partition, encode(good, max_bytes=LIMIT), b"x", headers)
    world.log.append(tp.topic, tp.partition, b"not an event", b"x", headers)
    world.publish(event(x, 2))
    runner = world.runner(Counter(), auto_assign=False)
    runner.transport.assign([tp])  # type: ignore[attr-defined]  # s1[1] is another's
    world.drain(runner)
    assert _out_by_project(world) == {x: [1, 2]}
    assert [letter.kind for letter in world.dead.list()] == ["poison"]
    assert world.store.load(tp).acked_through == 2


def test_a_redelivered_record_with_a_broken_origin_offset_is_poison_not_a_crash() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    world.publish(event(x, 1))
    runner = world.runner(Counter())
    world.drain(runner)
    k = world.policy().redelivery_partition(tp)
    assert k is not None
    headers = ((ORIGIN_TOPIC, tp.topic.encode()), (ORIGIN_OFFSET, b"first"))
    world.log.append(REDELIVERY, k, encode(event(x, 9), max_bytes=LIMIT), b"x", headers)
    world.drain(runner)
    assert [letter.kind for letter in world.dead.list()] == ["poison"]
    assert ORIGIN_OFFSET in world.dead.list()[0].error
    assert world.store.load(tp).redelivered_next == 1


# -- refolds --------------------------------------------------------------------------------------


class FailsInProcess(Counter):
    """Folds everything; its effect fails for events marked to fail (so only the dead-letter
    record keeps them out of a rebuilt fold)."""

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if event.payload.get("drill") == "fail":
            raise ValueError(f"effect of {event.event_id} fails")
        return super().process(event, state, delivery)


def test_a_refold_excludes_every_dead_letter_of_its_partition_not_only_the_first_thousand() -> None:
    world = World()
    x, y, tp = _two_projects(world)
    for n in range(1, 1003):
        world.publish(event(y, n, fail=True))
    world.publish(event(x, 1))
    runner = world.runner(FailsInProcess(), max_batch_failures=1)
    world.drain(runner, max_rounds=5000)
    assert len(world.dead.list(limit=5000)) == 1002
    world.controls(FailsInProcess()).re_reduce(tp, who="oncall", why="rebuild")
    assert y not in world.states(), "dead-lettered events were folded by the rebuild"
    assert world.states()[x] == {"count": 1, "seen": [1]}


class Stricter(Counter):
    """A new reducer version whose reduce refuses an event the old one took."""

    reducer_version = "2"
    refuses: set[int] = set()

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        if event.payload["n"] in self.refuses:
            raise ValueError(f"reducer 2 refuses n={event.payload['n']}")
        return super().reduce(state, event)


def test_a_reduce_that_raises_during_a_refold_excludes_that_event_with_its_reason() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 5):
        world.publish(event(x, n))
    world.drain(world.runner(Counter()))
    Stricter.refuses = {2}
    world.publish(event(x, 5))
    runner = world.runner(Stricter())  # the reducer version changed: an automatic refold
    world.drain(runner)
    assert world.states()[x] == {"count": 4, "seen": [1, 3, 4, 5]}
    letters = world.dead.list()
    assert len(letters) == 1 and "reducer 2 refuses n=2" in letters[0].error
    assert [e.offset for e in letters[0].entries] == [1]
    # The rebuilt fold stays consistent on the next rebuild.
    world.controls(Stricter()).re_reduce(tp, who="oncall", why="again")
    assert world.states()[x] == {"count": 4, "seen": [1, 3, 4, 5]}


def test_reprocess_from_does_not_apply_twice_an_event_whose_copy_sits_after_the_offset() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    evs = [event(x, n) for n in range(1, 5)]
    for ev in evs:
        world.publish(ev)
    world.publish(evs[1])  # the publisher's crash window: a copy of n=2 at offset 4
    world.publish(event(x, 5))
    world.drain(world.runner(Counter()))
    assert world.states()[x]["seen"] == [1, 2, 3, 4, 5]
    world.controls(Counter()).reprocess_from(tp, 3, 0, who="oncall", why="rerun 4 and 5")
    runner = world.runner(Counter())
    world.drain(runner)
    assert world.states()[x] == {"count": 5, "seen": [1, 2, 3, 4, 5]}
    assert _out_by_project(world) == {x: [1, 2, 3, 4, 4, 5, 5]}
    # A late copy of n=1 after the reprocess is a duplicate too.
    world.publish(evs[0])
    world.drain(runner)
    assert world.states()[x]["count"] == 5


# -- zombies --------------------------------------------------------------------------------------


class FailingArchiver(AuditArchiver):
    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if event.payload.get("drill") == "fail":
            raise ValueError(f"cannot archive {event.event_id}")
        return super().process(event, state, delivery)


def test_a_fenced_files_processor_neither_counts_nor_dead_letters_and_drops_the_partition(
    tmp_path: Path,
) -> None:
    world = World()
    x, _, tp = _two_projects(world)
    archiver = FailingArchiver(
        LocalObjectStore(tmp_path),
        PartLimits(5, 1 << 20, 60.0),
        {name: n for n, name in enumerate(STREAMS)},
        max_envelope_bytes=LIMIT,
    )
    zombie = world.runner(
        archiver, auto_assign=False, max_batch_failures=1, control_check_interval_s=1e9
    )
    zombie.transport.assign([tp])  # type: ignore[attr-defined]
    zombie.run_once(timeout=0)  # assigned at epoch 1
    world.store.acquire(tp)  # another process owns the partition from here on
    world.publish(event(x, 1, fail=True))
    zombie.run_once(timeout=0)
    assert world.dead.list() == [], "a fenced process wrote a dead letter"
    assert tp not in zombie.parts, "a fenced process kept the partition"
    assert world.store.count_failure(tp, "0") == 1, "a fenced process counted a failure"


def test_reprocess_from_judges_skipped_and_dead_lettered_offsets_after_it_again() -> None:
    # Found by the adversarial suite: Plan(order=[alpha 1, beta 1], steps=[skip, reprocess])
    # left the live fold with alpha 1 and the rebuilt fold without it.
    world = World()
    x, y, tp = _two_projects(world)
    world.publish(event(x, 1))
    world.publish(event(y, 1))
    controls = world.controls(Counter())
    controls.skip_through(tp, 0, who="oncall", why="skip x1")
    runner = world.runner(Counter())
    world.drain(runner)
    assert world.states() == {y: {"count": 1, "seen": [1]}}
    controls.reprocess_from(tp, 0, 0, who="oncall", why="run everything again")
    world.drain(runner)
    progress = world.store.load(tp)
    assert world.store.all_states(tp) == controls.fold(tp, progress, progress.acked_through).states
    assert world.states()[x] == {"count": 1, "seen": [1]}


# -- found by the adversarial suite (tests/consumers/runtime/test_adversarial.py) -----------------------


def test_a_copy_of_a_dead_lettered_event_is_a_duplicate_not_a_second_chance() -> None:
    # Plan(order=[alpha 1, beta 1, beta 1], failures={beta 1: 5}): the copy applied after the
    # original was dead-lettered, so the event was both dead-lettered and applied.
    world = World()
    x, y, tp = _two_projects(world)
    poison = event(y, 1)
    world.publish(event(x, 1))
    world.publish(poison)
    world.publish(poison)
    FlakyEffects.budget = {poison.event_id: 5}
    world.drain(world.runner(FlakyEffects()))
    assert [e.event_id for letter in world.dead.list() for e in letter.entries] == [poison.event_id]
    assert _out_by_project(world) == {x: [1]}
    progress = world.store.load(tp)
    fold = world.controls(FlakyEffects()).fold(tp, progress, progress.acked_through).states
    assert world.store.all_states(tp) == fold


def test_a_redelivery_held_behind_a_batch_that_is_dead_lettered_comes_again() -> None:
    # Plan(... failures={alpha 1: 7, alpha 3: 5}, steps=[..., retry_letters]): the retried
    # alpha 1 sat behind alpha 3's fifth failure and was never read again.
    world = World()
    x, _, tp = _two_projects(world)
    first, third = event(x, 1), event(x, 3)
    for ev in (first, event(x, 2), third):
        world.publish(ev)
    FlakyEffects.budget = {first.event_id: 6, third.event_id: 5}
    runner = world.runner(FlakyEffects())
    world.drain(runner)
    letter = next(lt for lt in world.dead.list() if lt.entries[0].event_id == first.event_id)
    world.publish(event(x, 4, fail=False))
    FlakyEffects.budget[third.event_id] = 5  # the retry meets a batch that fails five times again
    world.actions().retry(letter.id, who="oncall", why="fixed")
    reprocess = world.controls(FlakyEffects())
    reprocess.reprocess_from(tp, 2, world.store.load(tp).cursor_revision, who="op", why="x")
    world.drain(runner)
    assert 1 in _out_by_project(world)[x], "the retried event was lost"


def test_skip_through_leaves_events_applied_past_a_held_one_in_the_fold() -> None:
    # Plan(order=[alpha 1, beta 1], failures={alpha 1: 4}, steps=[..., skip]): beta 1 applied
    # past the failing alpha 1 was recorded as skipped, and a rebuild dropped it.
    world = World()
    x, y, tp = _two_projects(world)
    head = event(x, 1)
    world.publish(head)
    world.publish(event(y, 1))
    FlakyEffects.budget = {head.event_id: 1}
    runner = world.runner(FlakyEffects(), cuts=cuts_from([2, 1]))
    runner.run_once(timeout=0)  # x1 fails, y1 applies past it
    world.clock.advance(10)
    runner.run_once(timeout=0)  # x1 applies alone: acked 0, y1 still in applied_beyond
    assert world.store.load(tp).applied_beyond == [1]
    controls = world.controls(FlakyEffects())
    controls.skip_through(tp, 1, who="oncall", why="skip the rest")
    world.drain(runner)
    progress = world.store.load(tp)
    assert controls.fold(tp, progress, progress.acked_through).states == world.store.all_states(tp)
    assert world.states()[y] == {"count": 1, "seen": [1]}


def test_a_second_reprocess_before_the_first_caught_up_keeps_its_duplicates() -> None:
    # Found by the soak: Plan(order=[alpha 1, alpha 1, beta 1..4, delta 1], steps=[run...,
    # reprocess from 1, reprocess from 1 again]) applied alpha 1's copy a second time.
    world = World()
    x, y, tp = _two_projects(world)
    first = event(x, 1)
    world.publish(first)
    world.publish(first)  # a copy right behind
    for n in range(1, 4):
        world.publish(event(y, n))
    runner = world.runner(Counter())
    world.drain(runner)
    controls = world.controls(Counter())
    controls.reprocess_from(tp, 1, 0, who="oncall", why="rerun")
    controls.reprocess_from(tp, 1, 1, who="oncall", why="rerun again, before it caught up")
    world.drain(runner)
    assert world.states()[x] == {"count": 1, "seen": [1]}
    progress = world.store.load(tp)
    assert world.store.all_states(tp) == controls.fold(tp, progress, progress.acked_through).states


class SideEffects(Counter):
    """Acts on the world itself in process() (as the router writes its outbox), after asking
    whether it still owns the partition; a test hook runs before the second event."""

    acted: ClassVar[list[int]] = []
    before_second: ClassVar[Callable[[], None]] = staticmethod(lambda: None)

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if event.payload["n"] == 2:
            type(self).before_second()
        delivery.check_owner()
        self.acted.append(int(event.payload["n"]))
        return super().process(event, state, delivery)


def test_an_owner_frozen_mid_batch_asks_again_before_acting_when_it_wakes() -> None:
    world = World()
    x, _, tp = _two_projects(world)
    for n in range(1, 4):
        world.publish(event(x, n))
    runner = world.runner(SideEffects(), control_check_interval_s=5.0)

    def frozen_past_its_session() -> None:
        world.store.acquire(tp)  # the group moved on while this process was stopped
        world.clock.advance(30)

    SideEffects.acted = []
    SideEffects.before_second = staticmethod(frozen_past_its_session)
    runner.run_once(timeout=0)
    assert SideEffects.acted == [1], "a process that lost the partition acted after waking"
    assert tp not in runner.parts and runner.stats.fenced == 1


def test_redis_effects_lost_with_their_first_cursor_are_applied_again() -> None:
    """A Redis that lost its latest writes (append-only with fsync every second: up to about two
    seconds when the machine fails or the disk stalls; a restore from an older copy) can have
    lost a partition's first cursor with its claims and effects, while the group's offsets,
    committed to Kafka after each batch, survive. The next owner must read that partition from
    its start, not from the committed offset, or those events are never applied."""
    world = World()
    x, y, tp = _two_projects(world)
    for n in range(1, 4):
        world.publish(event(x, n))
        world.publish(event(y, n))
    world.drain(world.runner())
    assert world.ledger() == {x: [1, 2, 3], y: [1, 2, 3]}
    assert world.log.offsets["group-ledger"][tp].offset == 6  # the offsets outlived the state
    world.store = MemoryStore()  # Redis restarted without the partition's writes
    world.drain(world.runner())
    assert world.ledger() == {x: [1, 2, 3], y: [1, 2, 3]}
    assert world.ledger_counts() == {e: 1 for e in world.ledger_counts()}


def test_a_batch_broken_off_by_its_store_commits_no_offset_past_its_cursor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis lost in the middle of a batch (the claims lookup or the commit raises): the process
    exits through ``close``, which commits the group's offsets. The records the poll handed over were never
    applied, so the offset committed must stay at the cursor: past them, lag tooling reads 0
    while they wait, and an owner without a cursor would start after them."""
    world = World()
    x, y, tp = _two_projects(world)
    world.drain(world.runner())  # the group exists, nothing committed yet
    for n in range(1, 4):
        world.publish(event(x, n))
        world.publish(event(y, n))
    runner = world.runner()

    def gone(*args: object, **kwargs: object) -> object:
        raise ConnectionError("Connection closed by server.")

    monkeypatch.setattr(world.store, "decisions_many", gone)
    monkeypatch.setattr(world.store, "commit_many", gone)
    with pytest.raises(ConnectionError):
        runner.run_once(timeout=0)
    runner.close()
    committed = world.log.offsets.get("group-ledger", {}).get(tp)
    assert committed is None or committed.offset == 0, committed
    monkeypatch.undo()
    world.drain(world.runner())
    assert world.ledger() == {x: [1, 2, 3], y: [1, 2, 3]}
