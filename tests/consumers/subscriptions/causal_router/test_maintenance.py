"""The daily maintenance tick's decision (a pure function of the folds, the time and the marks
the last tick left), with an injected clock."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from consumers.runtime.types import JSON
from consumers.subscriptions.causal_router.maintenance import maintenance_commands, mark_key
from streams.clock import ManualClock
from streams.ids import derived_command_id
from tests.support.causal_router import (
    START,
    Driver,
    History,
    graph_history,
    make_router,
    open_test_outbox,
)

TTL = 3600.0


def _folds(tmp_path: Path, *histories: History, history: int = 50) -> dict[str, JSON]:
    driver = Driver(make_router(open_test_outbox(tmp_path / "o.sqlite"), history=history))
    for h in histories:
        driver.fold(h.events)
    return driver.states


def _promotions(project: str, changes: list[str], *, advance: bool) -> History:
    h = History(project=project)
    for generation, change in enumerate(changes, start=1):
        h.add(
            "verification.started",
            change=change,
            candidateId=f"{change}-c",
            workGraphCompleted=True,
        )
        h.add("artifact.promoted", change=change, candidateId=f"{change}-c", generation=generation)
        if advance:
            h.add("canonical.advanced", change=None, generation=generation)
    return h


def _summary(commands: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(c.command_type, c.project_id, c.payload) for c in commands]


def test_a_tick_queues_what_each_projects_fold_calls_for(tmp_path: Path) -> None:
    states = _folds(
        tmp_path,
        graph_history("p-a"),  # chg-1 promoted at generation 1; its first candidate went stale
        _promotions("p-b", ["c1", "c2"], advance=True),  # generation 2: older indexes can go
        History(project="p-c"),  # nothing happened
    )
    now = START + timedelta(days=1)
    plan = maintenance_commands(states, now, {}, cap=100, ttl_s=TTL)
    # Oldest work first: p-b's history is short, so its facts are older than p-a's.
    assert _summary(plan.commands) == [
        ("forks.sweep", "p-b", {"changeIds": ["c1", "c2"], "complete": True}),
        ("index.purge", "p-b", {"keepGeneration": 2}),
        ("forks.sweep", "p-a", {"changeIds": ["chg-1"], "complete": True}),
        ("project.cleanup", "p-a", {"candidateIds": ["chg-1-cand-0"], "complete": True}),
    ]
    queues = {c.command_type: c for c in plan.commands}
    assert queues["index.purge"].command_id == derived_command_id(
        "maintenance-2026-03-03", "index.purge", "p-b:2"
    )
    assert all(c.deadline == now + timedelta(seconds=TTL) for c in plan.commands)
    assert plan.deferred == 0
    # The marks remember what was handled: the next tick finds nothing new.
    later = maintenance_commands(states, now + timedelta(days=1), plan.marks, cap=100, ttl_s=TTL)
    assert later.commands == []
    assert later.marks == plan.marks


def test_only_facts_newer_than_the_last_tick_are_queued(tmp_path: Path) -> None:
    h = _promotions("p-a", ["c1"], advance=True)
    first = maintenance_commands(_folds(tmp_path, h), START, {}, cap=100, ttl_s=TTL)
    assert [c.command_type for c in first.commands] == ["forks.sweep"]  # generation 1: no purge
    for change, generation in (("c2", 2), ("c3", 3)):
        h.add(
            "verification.started",
            change=change,
            candidateId=f"{change}-c",
            workGraphCompleted=True,
        )
        h.add("artifact.promoted", change=change, candidateId=f"{change}-c", generation=generation)
        h.add("canonical.advanced", change=None, generation=generation)
    h.add("verification.started", change="c4", candidateId="c4-c", workGraphCompleted=True)
    h.add("candidate.rejected", change="c4", candidateId="c4-c")
    second = maintenance_commands(
        _folds(tmp_path, h),
        START + timedelta(days=1),
        first.marks,
        cap=100,
        ttl_s=TTL,
    )
    assert _summary(second.commands) == [
        ("forks.sweep", "p-a", {"changeIds": ["c2", "c3"], "complete": True}),
        ("index.purge", "p-a", {"keepGeneration": 3}),
        ("project.cleanup", "p-a", {"candidateIds": ["c4-c"], "complete": True}),
    ]


def test_a_tick_is_bounded_and_the_rest_waits_for_the_next_one_oldest_first(
    tmp_path: Path,
) -> None:
    # Five projects, each one finished change, promoted in the order p-4, p-3, ..., p-0.
    histories = []
    for n in range(5):
        h = History(project=f"p-{n}")
        for _ in range(10 - 2 * n):  # later projects' promotions come earlier in time
            h.add("task.created", task="filler", key=str(len(h.events)))
        h.add("verification.started", candidateId="c", workGraphCompleted=True)
        h.add("artifact.promoted", candidateId="c", generation=1)
        histories.append(h)
    states = _folds(tmp_path, *histories)
    clock = ManualClock(START)
    marks: dict[str, int] = {}
    ticks = []
    for _ in range(4):
        plan = maintenance_commands(states, clock.now(), marks, cap=2, ttl_s=TTL)
        ticks.append([c.project_id for c in plan.commands])
        marks = plan.marks
        clock.advance(86_400)
    assert ticks == [["p-4", "p-3"], ["p-2", "p-1"], ["p-0"], []]


def test_a_repeated_tick_the_same_day_sends_the_same_ids(tmp_path: Path) -> None:
    states = _folds(tmp_path, graph_history("p-a"))
    at = START.replace(hour=4, minute=17)
    once = maintenance_commands(states, at, {}, cap=10, ttl_s=TTL)
    again = maintenance_commands(states, at + timedelta(hours=3), {}, cap=10, ttl_s=TTL)
    assert [c.command_id for c in once.commands] == [c.command_id for c in again.commands]
    next_day = maintenance_commands(states, at + timedelta(days=1), {}, cap=10, ttl_s=TTL)
    assert not {c.command_id for c in once.commands} & {c.command_id for c in next_day.commands}


def test_facts_the_fold_already_forgot_make_the_command_incomplete(tmp_path: Path) -> None:
    h = _promotions("p-a", ["c1", "c2", "c3", "c4"], advance=False)
    states = _folds(tmp_path, h, history=2)
    plan = maintenance_commands(
        states, START, {mark_key("p-a", "forks.sweep"): 1}, cap=10, ttl_s=TTL
    )
    # Changes 2..4 are unhandled, but the fold keeps the last two only: sweep the whole project.
    assert _summary(plan.commands) == [
        ("forks.sweep", "p-a", {"changeIds": ["c3", "c4"], "complete": False})
    ]
