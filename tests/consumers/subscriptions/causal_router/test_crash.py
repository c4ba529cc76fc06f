"""The causal router on the in-memory runtime: its commands, the consumed offsets and its fold stay
consistent across a crash at every boundary, under duplicates and any batching; bad input ends in
a dead letter naming the field while other projects flow."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.memory_transport import cuts_from
from consumers.subscriptions.causal_router.budget import MemoryCommandBudget
from consumers.subscriptions.causal_router.commands import queues
from consumers.subscriptions.causal_router.processor import CausalRouter
from streams.envelopes import Event, decode_command
from tests.support.causal_router import ENV, History, graph_history, make_router, open_test_outbox
from tests.support.runtime_harness import BOUNDARIES, Crash, World

PROJECTS = ["alpha", "beta", "gamma"]


def _interleaved(histories: list[History]) -> list[Event]:
    out: list[Event] = []
    longest = max(len(h.events) for h in histories)
    for n in range(longest):
        out.extend(h.events[n] for h in histories if n < len(h.events))
    return out


def _setup(tmp_path: Path, *, twice: bool = False) -> tuple[World, CausalRouter, list[Event]]:
    world = World()
    for queue in queues(ENV):
        world.log.create(queue, 2)
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), clock=world.clock)
    events = _interleaved([graph_history(p, change=f"{p}-chg") for p in PROJECTS])
    for event in events:
        world.publish(event)
        if twice:
            world.publish(event)  # the publisher's crash window: a duplicate right behind
    return world, router, events


def _queued(world: World) -> Counter[str]:
    """Record ids on the router's queues, with how often each appears."""
    return Counter(
        (r.header("record_id") or b"").decode() for q in queues(ENV) for r in world.log.all(q)
    )


def _by_type(world: World) -> Counter[str]:
    return Counter(
        decode_command(r.value, max_bytes=1 << 20).command_type
        for q in queues(ENV)
        for r in world.log.all(q)
    )


def _stale_events(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / "outbox.sqlite") as db:
        return sorted(r[0] for r in db.execute("SELECT event_id FROM outbox"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Counter[str], dict, list[str]]:  # type: ignore[type-arg]
    tmp = tmp_path_factory.mktemp("reference")
    world, router, _ = _setup(tmp)
    world.drain(world.runner(router))
    return _queued(world), world.states(), _stale_events(tmp)


def test_a_clean_run_sends_the_expected_commands(
    tmp_path: Path,
    reference: tuple[Counter[str], dict, list[str]],  # type: ignore[type-arg]
) -> None:
    world, router, _ = _setup(tmp_path)
    world.drain(world.runner(router))
    # Per project (see graph_history): 11 dispatches (t02..t12), 3 wakes in wave 2 and one on
    # the canonical advance, candidate.create, index.build on promotion and on the advance.
    per_project = {"change.dispatch": 11, "agent.wake": 4, "candidate.create": 1, "index.build": 2}
    assert _by_type(world) == {t: n * len(PROJECTS) for t, n in per_project.items()}
    assert set(_queued(world).values()) == {1}
    assert _queued(world) == reference[0]
    assert len(_stale_events(tmp_path)) == len(PROJECTS)  # each project's first candidate


CRASHES = [(boundary, nth) for boundary in BOUNDARIES for nth in (1, 2, 5)]


@pytest.mark.parametrize(("boundary", "nth"), CRASHES)
def test_a_crash_at_every_boundary_keeps_commands_offsets_and_fold_consistent(
    tmp_path: Path,
    reference: tuple[Counter[str], dict, list[str]],  # type: ignore[type-arg]
    boundary: str,
    nth: int,
) -> None:
    world, router, _ = _setup(tmp_path)
    hits = {"n": 0}

    def crash(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == nth:
                raise Crash(name)

    with pytest.raises(Crash):
        world.drain(world.runner(router, cuts=cuts_from([7] * 1000), failpoint=crash))
    # The process is gone; a new one (new transport and producer, same store, log and outbox)
    # takes over, with a new processor as a restarted process would build.
    restarted = make_router(
        open_test_outbox(tmp_path / "outbox.sqlite"), clock=world.clock, budget=router.budget
    )
    world.drain(world.runner(restarted, cuts=cuts_from([5] * 1000)))
    queued = _queued(world)
    assert [i for i, n in queued.items() if n > 1] == [], "a command id appears twice"
    assert queued == reference[0]
    assert world.states() == reference[1]
    assert _stale_events(tmp_path) == reference[2]


def test_every_event_published_twice_sends_each_command_once(
    tmp_path: Path,
    reference: tuple[Counter[str], dict, list[str]],  # type: ignore[type-arg]
) -> None:
    world, router, _ = _setup(tmp_path, twice=True)
    runner = world.runner(router, cuts=cuts_from([3, 11, 2]))
    world.drain(runner)
    assert _queued(world) == reference[0]
    assert world.states() == reference[1]
    assert runner.stats.duplicates > 0


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_the_same_log_cut_into_any_batches_gives_the_same_commands_and_fold(
    tmp_path_factory: pytest.TempPathFactory,
    reference: tuple[Counter[str], dict, list[str]],  # type: ignore[type-arg]
    cuts: list[int],
) -> None:
    tmp = tmp_path_factory.mktemp("cuts")
    world, router, _ = _setup(tmp)
    world.drain(world.runner(router, cuts=cuts_from(cuts)))
    assert _queued(world) == reference[0]
    assert world.states() == reference[1]


def test_bad_input_is_dead_lettered_naming_the_field_and_other_projects_flow(
    tmp_path: Path,
) -> None:
    world = World()
    for queue in queues(ENV):
        world.log.create(queue, 2)
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), clock=world.clock)
    bad = History(project="alpha")
    bad.add("task.created", task="t1")
    malformed = bad.add("task.created", task="t2", dependsOn="t1")  # not a list
    bad.add("task.completed", task="t1", agentId="a")
    good = History(project="beta")
    good.add("task.created", task="t1")
    good.add("task.created", task="t2", dependsOn=["t1"])
    good.add("task.completed", task="t1", agentId="a")
    for event in _interleaved([bad, good]):
        world.publish(event)
    world.drain(world.runner(router))
    (letter,) = world.dead.list()
    assert letter.subscription == "causal-router"
    assert [e.event_id for e in letter.entries] == [malformed.event_id]
    assert "RouterInputError" in letter.error
    assert "payload.dependsOn = 't1'" in letter.error
    assert letter.attempts == 5
    commands = [
        decode_command(r.value, max_bytes=1 << 20) for q in queues(ENV) for r in world.log.all(q)
    ]
    # beta's t2 was dispatched; alpha's t2 never entered the fold, so nothing waits on it.
    assert [(c.project_id, c.task_id) for c in commands] == [("beta", "t2")]
    assert world.states()["alpha"]["changes"]["chg-1"]["tasks"].keys() == {"t1"}


def test_a_zombie_router_neither_counts_caps_nor_writes_its_outbox(tmp_path: Path) -> None:
    world, _, _ = _setup(tmp_path)
    (tmp_path / "zombie").mkdir()
    budget = MemoryCommandBudget(1000)
    zombie_router = make_router(
        open_test_outbox(tmp_path / "zombie" / "outbox.sqlite"), clock=world.clock, budget=budget
    )
    zombie = world.runner(zombie_router, control_check_interval_s=1e9)
    zombie.transport.poll(0, 0)  # it is assigned every partition (and reads nothing yet)
    for tp in list(zombie.parts):
        world.store.acquire(tp)  # another process owns every partition from here on
    for _ in range(50):
        zombie.run_once(timeout=0)
    assert zombie.stats.fenced > 0
    assert sum(zombie_router.stats.sent.values()) == 0, "a zombie admitted commands"
    assert zombie_router.stats.stale_written == 0, "a zombie wrote to its outbox"
    assert budget.admitted == {}, "a zombie counted against the daily cap"
    assert _stale_events(tmp_path / "zombie") == []


CAP = 5  # commands per change per day: each project's change plans 19, so 14 are capped


def _capped_setup(tmp_path: Path) -> tuple[World, CausalRouter]:
    world, _, _ = _setup(tmp_path)
    router = make_router(
        open_test_outbox(tmp_path / "outbox.sqlite"),
        clock=world.clock,
        commands_per_change_per_day=CAP,
    )
    return world, router


@pytest.fixture(scope="module")
def capped_reference(tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    """The commands sent when every event is a batch of its own: admitted one after another."""
    world, router = _capped_setup(tmp_path_factory.mktemp("capped"))
    world.drain(world.runner(router, cuts=cuts_from([1] * 1000)))
    return _queued(world)


@pytest.mark.parametrize("boundary", [None, *BOUNDARIES])
def test_a_batch_admits_its_commands_as_one_event_after_another_across_a_crash(
    tmp_path: Path,
    reference: tuple[Counter[str], dict, list[str]],  # type: ignore[type-arg]
    capped_reference: Counter[str],
    boundary: str | None,
) -> None:
    # A batch's commands are admitted together after its last event (finish_batch): the cap
    # must send exactly the commands that admitting them one event at a time sends, whatever
    # the batches and wherever a process dies.
    assert len(capped_reference) < len(reference[0]), "the cap refuses nothing here"
    world, router = _capped_setup(tmp_path)
    hits = {"n": 0}

    def crash(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == 2:
                raise Crash(name)

    try:
        world.drain(world.runner(router, cuts=cuts_from([40] * 1000), failpoint=crash))
    except Crash:
        restarted = make_router(
            open_test_outbox(tmp_path / "outbox.sqlite"), clock=world.clock, budget=router.budget
        )
        world.drain(world.runner(restarted, cuts=cuts_from([13] * 1000)))
    assert (boundary is None) == (hits["n"] < 2)
    queued = _queued(world)
    assert [i for i, n in queued.items() if n > 1] == [], "a command id appears twice"
    assert queued == capped_reference
    per_change = Counter(
        decode_command(r.value, max_bytes=1 << 20).change_id
        for q in queues(ENV)
        for r in world.log.all(q)
    )
    assert max(per_change.values()) == CAP
