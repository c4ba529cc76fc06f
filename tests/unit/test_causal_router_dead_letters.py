"""The router's fold and rules on what the dead-letter path writes: a dead-lettered dispatch's
``task.blocked`` and ``task.failed``, produced by the real dead-letter consumer from a command the
router built, then folded and processed by the router."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from consumers.subscriptions.causal_router import CausalRouter
from streams.envelopes import Command, Event, decode_event
from tests.causal_router_helpers import (
    MAX_BYTES,
    Driver,
    History,
    make_router,
    open_test_outbox,
)
from tests.unit.test_dead_letter_consumer import Pipeline


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
