"""The router's fold and rules on what the dead-letter path writes: a dead-lettered dispatch's
``task.blocked`` and ``task.failed``, produced by the real dead-letter consumer from a command the
router built, then folded and processed by the router."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from consumers.subscriptions.causal_router.fold import in_flight
from consumers.subscriptions.causal_router.processor import CausalRouter
from streams.envelopes import Command, Event, decode_event
from tests.support.causal_router import (
    MAX_BYTES,
    Driver,
    History,
    make_router,
    open_test_outbox,
)
from tests.support.worker_harness import Pipeline


def dead_lettered(command: Command, path: Path) -> list[Event]:
    """What the dead-letter path writes for ``command`` once it failed all its retries."""
    outbox = open_test_outbox(path)
    p = Pipeline(outbox)
    p.world.send(command)
    p.run(40)
    with sqlite3.connect(outbox.path) as conn:
        rows = conn.execute("SELECT envelope FROM outbox ORDER BY slot").fetchall()
    return [decode_event(bytes(r[0]), max_bytes=MAX_BYTES) for r in rows]


def _dispatched(driver: Driver, *events: Event) -> list[tuple[str | None, object]]:
    return [(c.task_id, c.payload["reason"]) for c in driver.feed(events)]


def _task(driver: Driver, task: str) -> dict[str, object]:
    found: dict[str, object] = driver.states["proj-1"]["changes"]["chg-1"]["tasks"][task]
    return found


def test_a_task_blocked_then_failed_by_the_dead_letter_path_stays_blocked_in_the_fold(
    tmp_path: Path,
) -> None:
    router: CausalRouter = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    h = History()
    h.add("task.created", task="t1")
    h.add("task.created", task="t2", dependsOn=["t1"])
    h.add("task.ready", task="t1")
    h.add("task.started", task="t1", agentId="agent-a")
    h.add("task.completed", task="t1", agentId="agent-a")
    driver = Driver(router)
    [dispatch] = driver.feed(h.events)
    assert (dispatch.command_type, dispatch.task_id) == ("change.dispatch", "t2")

    blocked, failed = dead_lettered(dispatch, tmp_path / "dl-outbox.sqlite")
    assert (blocked.event_type, failed.event_type) == ("task.blocked", "task.failed")
    assert _dispatched(driver, blocked) == []
    assert _task(driver, "t2")["status"] == "blocked"
    assert _task(driver, "t2")["blockedLimit"] == "dead_letter"
    assert _dispatched(driver, failed) == []
    # The failure that follows the block does not hide it: the task shows why it stopped.
    assert _task(driver, "t2")["status"] == "blocked"
    assert _task(driver, "t2")["blockedLimit"] == "dead_letter"


def test_a_blocked_task_holds_its_slot_until_its_failure_frees_it_for_a_waiting_task(
    tmp_path: Path,
) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), agents_per_change=8)
    h = History()
    h.add("task.created", task="root")
    for n in range(10):
        h.add("task.created", task=f"w{n}", dependsOn=["root"])
    h.add("task.ready", task="root")
    h.add("task.started", task="root", agentId="agent-root")
    h.add("task.completed", task="root", agentId="agent-root")
    driver = Driver(router)
    # The agent limit is reached: w0..w7 are dispatched, w8 and w9 wait.
    commands = driver.feed(h.events)
    assert [c.task_id for c in commands] == [f"w{n}" for n in range(8)]
    assert driver.states["proj-1"]["changes"]["chg-1"]["waiting"] == ["w8", "w9"]

    blocked, failed = dead_lettered(commands[0], tmp_path / "dl-outbox.sqlite")
    assert (blocked.event_type, blocked.task_id) == ("task.blocked", "w0")
    # The block alone frees nothing: w0 still holds its agent slot, nobody is dispatched ...
    assert _dispatched(driver, blocked) == []
    assert in_flight(driver.states["proj-1"]["changes"]["chg-1"]) == 8
    # ... so a task completing meanwhile frees exactly one slot, for w8 only.
    assert _dispatched(driver, h.add("task.completed", task="w1", agentId="agent-1")) == [
        ("w8", "agent-slot-freed")
    ]
    # The failure that follows the block frees w0's slot: the last waiting task goes.
    assert (failed.event_type, failed.task_id) == ("task.failed", "w0")
    assert _dispatched(driver, failed) == [("w9", "agent-slot-freed")]
    assert driver.states["proj-1"]["changes"]["chg-1"]["waiting"] == []
    assert _task(driver, "w0")["status"] == "blocked"
