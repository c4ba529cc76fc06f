"""The causal router's rules (docs/router.md), one table row per rule, plus the agent limit, the
per-change command cap, the candidate.stale events and the fold's refusal of bad input."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumers.subscriptions.causal_router.budget import MemoryCommandBudget
from consumers.subscriptions.causal_router.classifier import Answer
from consumers.subscriptions.causal_router.fold import DECLARING, empty_state
from consumers.subscriptions.causal_router.processor import CausalRouter
from router.settings import Settings
from streams.envelopes import Event, decode_command, decode_event
from streams.errors import RouterInputError
from streams.ids import derived_command_id, stable_event_id
from streams.topology import queue_name
from tests.support.causal_router import (
    ENV,
    MAX_BYTES,
    Driver,
    History,
    ScriptedClassifier,
    delivery,
    drive,
    make_router,
    open_test_outbox,
)

WAKES = "agent-wakeups"
INTEGRATION = "integration"
INDEXING = "indexing"


def _fire(router: CausalRouter, h: History, trigger: Event) -> list[tuple[str, str, str]]:
    """Fold the history, then fold and process ``trigger``: its commands as (type, queue, id)."""
    assert h.events[-1] is trigger
    driver = Driver(router)
    driver.fold(h.events[:-1])
    driver.feed([trigger])
    out = []
    for record in (r for effects in driver.effects for r in effects.records):
        command = decode_command(record.value, max_bytes=MAX_BYTES)
        assert record.record_id == command.command_id
        assert record.key == command.project_id
        out.append((command.command_type, record.topic, command.command_id))
    return out


def _expect(trigger: Event, *commands: tuple[str, str, str]) -> list[tuple[str, str, str]]:
    return [
        (kind, queue_name(queue, ENV), derived_command_id(trigger.event_id, kind, target))
        for kind, queue, target in commands
    ]


def _agents(h: History, *pairs: tuple[str, str, list[str]], change: str = "chg-1") -> None:
    """Active agents: (agent, task, resources) each running one started task."""
    for agent, task, paths in pairs:
        h.add("task.created", change=change, task=task, resources=paths)
        h.add("task.ready", change=change, task=task)
        h.add("task.started", change=change, task=task, agentId=agent)


@dataclass(frozen=True)
class Rule:
    name: str
    build: Callable[[History], tuple[Event, list[tuple[str, str, str]]]]


def _task_ready(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    h.add("task.created", task="t1")
    return h.add("task.ready", task="t1"), []


def _informational(
    event_type: str,
) -> Callable[[History], tuple[Event, list[tuple[str, str, str]]]]:
    def build(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
        _agents(h, ("agent-a", "t1", ["src/a.py"]))
        return h.add(event_type, name="x", agentId="agent-a", reason="r"), []

    return build


def _completed_dispatches_newly_ready(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    h.add("task.created", task="t1")
    h.add("task.created", task="t2", dependsOn=["t1"])
    h.add("task.created", task="t3", dependsOn=["t1"])
    h.add("task.created", task="t4", dependsOn=["t1", "t5"])  # t5 not completed: stays
    h.add("task.created", task="t5")
    h.add("task.ready", task="t1")
    h.add("task.started", task="t1", agentId="agent-a")
    done = h.add("task.completed", task="t1", agentId="agent-a")
    return done, _expect(
        done, ("change.dispatch", INTEGRATION, "t2"), ("change.dispatch", INTEGRATION, "t3")
    )


def _completed_last_dependency(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    h.add("task.created", task="t1")
    h.add("task.created", task="t2")
    h.add("task.created", task="t3", dependsOn=["t1", "t2"])
    h.add("task.completed", task="t1", agentId="agent-a")
    done = h.add("task.completed", task="t2", agentId="agent-b")
    return done, _expect(done, ("change.dispatch", INTEGRATION, "t3"))


def _completed_nothing_ready(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/a.py"]))
    return h.add("task.completed", task="t1", agentId="agent-a"), []


def _failed_nothing_waiting(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/a.py"]))
    h.add("task.created", task="t2", dependsOn=["t1"])
    return h.add("task.failed", task="t1", agentId="agent-a", reason="boom"), []


def _verification(complete: bool) -> Callable[[History], tuple[Event, list[tuple[str, str, str]]]]:
    def build(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
        trigger = h.add("verification.started", candidateId="cand-1", workGraphCompleted=complete)
        if not complete:
            return trigger, []
        return trigger, _expect(trigger, ("candidate.create", INTEGRATION, "cand-1"))

    return build


def _canonical_advanced(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-b", "t2", ["src/b.py"]), ("agent-a", "t1", ["src/a.py"]))
    _agents(h, ("agent-c", "t3", ["src/c.py"]))
    h.add("task.completed", task="t3", agentId="agent-c")  # agent-c is no longer active
    trigger = h.add("canonical.advanced", change=None, generation=2)
    return trigger, _expect(
        trigger,
        ("agent.wake", WAKES, "agent-a"),
        ("agent.wake", WAKES, "agent-b"),
        ("index.build", INDEXING, "generation-2"),
    )


def _artifact_promoted(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    h.add("verification.started", candidateId="cand-1", workGraphCompleted=True)
    trigger = h.add("artifact.promoted", candidateId="cand-1", generation=3)
    return trigger, _expect(trigger, ("index.build", INDEXING, "generation-3"))


def _overlap(event_type: str, declared: list[str], held: list[str], wakes: bool) -> Rule:
    def build(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
        _agents(h, ("agent-a", "t1", ["src/own.py"]), ("agent-b", "t2", held))
        trigger = h.add(event_type, task="t1", agentId="agent-a", resources=declared)
        return trigger, (_expect(trigger, ("agent.wake", WAKES, "agent-b")) if wakes else [])

    verdict = "wakes" if wakes else "nothing"
    return Rule(f"{event_type}: {declared} vs {held} -> {verdict}", build)


def _overlap_with_inactive_agent(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/own.py"]), ("agent-b", "t2", ["src/shared.py"]))
    h.add("task.completed", task="t2", agentId="agent-b")
    return h.add("intent.declared", task="t1", agentId="agent-a", resources=["src/shared.py"]), []


def _overlap_with_itself(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/own.py"]))
    return h.add("claim.acquired", task="t1", agentId="agent-a", resources=["src/own.py"]), []


def _released_then_declared(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/own.py"]), ("agent-b", "t2", ["src/b.py"]))
    h.add("claim.acquired", task="t2", agentId="agent-b", resources=["src/shared.py"])
    released = h.add("claim.released", task="t2", agentId="agent-b", resources=["src/shared.py"])
    assert released.event_type == "claim.released"
    return h.add("intent.declared", task="t1", agentId="agent-a", resources=["src/shared.py"]), []


def _claim_released_is_informational(h: History) -> tuple[Event, list[tuple[str, str, str]]]:
    _agents(h, ("agent-a", "t1", ["src/own.py"]), ("agent-b", "t2", ["src/own.py"]))
    return h.add("claim.released", task="t1", agentId="agent-a", resources=["src/own.py"]), []


RULES = [
    Rule("task.ready is ignored (already dispatched)", _task_ready),
    *(
        Rule(f"{t} is informational", _informational(t))
        for t in (
            "project.created",
            "change.created",
            "release.completed",
            "agent.woken",
            "model.routed",
        )
    ),
    Rule(
        "task.completed -> change.dispatch per newly ready task", _completed_dispatches_newly_ready
    ),
    Rule("task.completed of the last dependency -> change.dispatch", _completed_last_dependency),
    Rule("task.completed with no dependent -> nothing", _completed_nothing_ready),
    Rule("task.failed with nothing waiting -> nothing", _failed_nothing_waiting),
    Rule("verification.started, work graph complete -> candidate.create", _verification(True)),
    Rule("verification.started, work graph incomplete -> nothing", _verification(False)),
    Rule("canonical.advanced -> wake each active agent, index.build", _canonical_advanced),
    Rule("artifact.promoted -> index.build", _artifact_promoted),
    *(
        _overlap(t, declared, held, wakes)
        for t in sorted(DECLARING)
        for declared, held, wakes in (
            (["src/api/routes.py"], ["src/api/routes.py"], True),  # exact
            (["src/api/"], ["src/api"], True),  # exact once trailing slashes are ignored
            (["src/api"], ["src/api/routes.py"], True),  # prefix, 2/3: heuristic abstains
            (["src/api/v1/routes"], ["src/api/v1/routes/users.py"], True),  # prefix, 4/5: wake
            (["docs"], ["docs/guide/api/v2/index.md"], False),  # prefix, 1/5: confident skip
            (["src/api"], ["src/apiary.py"], False),  # a shared string, not a directory
            (["src/a.py"], ["src/b.py"], False),  # none
        )
    ),
    Rule("an overlap with an agent no longer active -> nothing", _overlap_with_inactive_agent),
    Rule("an agent's own resources -> nothing", _overlap_with_itself),
    Rule("claim.released is informational", _claim_released_is_informational),
    Rule("released resources no longer overlap", _released_then_declared),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule(rule: Rule, tmp_path: Path) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    h = History()
    trigger, expected = rule.build(h)
    assert _fire(router, h, trigger) == expected


def test_informational_types_are_not_even_consumed(tmp_path: Path) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    assert router.consumes is not None
    for event_type in ("project.created", "change.created", "release.completed", "agent.woken"):
        assert event_type not in router.consumes
    assert {"task.ready", "task.completed", "canonical.advanced", *DECLARING} <= router.consumes


def test_commands_carry_stable_ids_queues_and_a_deadline(tmp_path: Path) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    h = History()
    h.add("task.created", task="t1")
    h.add("task.created", task="t2", dependsOn=["t1"])
    done = h.add("task.completed", task="t1", agentId="agent-a")
    first = drive(router, h.events)
    again = drive(make_router(open_test_outbox(tmp_path / "other.sqlite")), h.events)
    assert [c.command_id for c in first] == [c.command_id for c in again]
    (command,) = first
    assert command.command_id == f"cmd_{done.event_id}_change.dispatch_t2"
    assert (command.project_id, command.change_id, command.task_id) == ("proj-1", "chg-1", "t2")
    assert command.payload == {
        "taskId": "t2",
        "reason": "dependencies-completed",
        "causedBy": done.event_id,
    }
    assert command.deadline is not None
    assert (command.deadline - command.created_at).total_seconds() == 3600.0


def test_the_agent_limit_holds_ready_tasks_and_a_freed_slot_dispatches_them(
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

    def dispatched(*events: Event) -> list[tuple[str | None, object]]:
        return [(c.task_id, c.payload["reason"]) for c in driver.feed(events)]

    # Ten tasks became ready; the change may have 8 in flight: w0..w7 go, w8 and w9 wait.
    assert dispatched(*h.events) == [(f"w{n}", "dependencies-completed") for n in range(8)]
    assert (
        dispatched(
            h.add("task.started", task="w0", agentId="agent-0"),
            h.add("task.started", task="w1", agentId="agent-1"),
        )
        == []
    )
    assert dispatched(h.add("task.completed", task="w0", agentId="agent-0")) == [
        ("w8", "agent-slot-freed")
    ]
    assert dispatched(h.add("task.failed", task="w1", agentId="agent-1", reason="tests")) == [
        ("w9", "agent-slot-freed")
    ]
    assert dispatched(h.add("task.completed", task="w2", agentId="agent-2")) == []
    # In flight now: w3..w9 (7). w3 completing leaves 6, so 2 of its 9 dependents go.
    created = [h.add("task.created", task=f"x{n}", dependsOn=["w3"]) for n in range(9)]
    assert dispatched(*created) == []
    assert dispatched(h.add("task.completed", task="w3", agentId="agent-3")) == [
        ("x0", "dependencies-completed"),
        ("x1", "dependencies-completed"),
    ]


def test_a_ready_task_dispatched_by_someone_else_stops_waiting(tmp_path: Path) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), agents_per_change=1)
    h = History()
    h.add("task.created", task="root")
    h.add("task.created", task="a", dependsOn=["root"])
    h.add("task.created", task="b", dependsOn=["root"])
    h.add("task.completed", task="root", agentId="x")  # a dispatched, b waits (limit 1)
    h.add("task.ready", task="b")  # the integration worker dispatched b itself
    h.add("task.started", task="a", agentId="agent-a")
    freed = h.add("task.completed", task="a", agentId="agent-a")
    commands = drive(router, h.events)
    assert [c.task_id for c in commands] == ["a"]
    assert all(c.payload["causedBy"] != freed.event_id for c in commands)


def test_over_the_daily_cap_per_change_a_command_is_not_sent_but_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cap = Settings().commands_per_change_per_day
    assert cap == 1000
    budget = MemoryCommandBudget(cap)
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), budget=budget)
    h = History()
    _agents(h, ("agent-a", "t1", ["src/a.py"]), ("agent-b", "t2", ["src/shared.py"]))
    for n in range(cap + 5):  # every intent exactly overlaps agent-b (a task of chg-1)
        h.add(
            "intent.declared", task="t1", agentId="agent-a", resources=["src/shared.py"], key=str(n)
        )
    driver = Driver(router)
    with caplog.at_level(logging.WARNING, logger="rhumbatron.causal_router"):
        driver.feed(h.events)
    sent = [r for effects in driver.effects for r in effects.records]
    ops = [op for effects in driver.effects for op in effects.redis]
    assert len(sent) == cap
    assert router.stats.capped == {"agent.wake": 5}
    capped_ops = [op for op in ops if op.args[0] == "commands_capped:agent.wake"]
    assert len(capped_ops) == 5
    warnings = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(warnings) == 5
    assert all("change chg-1 of project proj-1" in w for w in warnings)
    # The same decision retried (same command id) is admitted again: not counted twice.
    assert budget.admit("proj-1", "chg-1", "2026-03-02", sent[0].record_id)
    assert not budget.admit("proj-1", "chg-1", "2026-03-02", "cmd_new_one")


def test_the_cap_is_per_change(tmp_path: Path) -> None:
    router = make_router(
        open_test_outbox(tmp_path / "outbox.sqlite"), commands_per_change_per_day=2
    )
    h = History()
    _agents(h, ("agent-b", "t2", ["src/shared.py"]), change="chg-1")
    _agents(h, ("agent-c", "t3", ["src/shared.py"]), change="chg-2")
    _agents(h, ("agent-a", "t1", ["src/own.py"]), change="chg-3")
    for n in range(3):
        h.add(
            "intent.declared",
            change="chg-3",
            task="t1",
            agentId="agent-a",
            resources=["src/shared.py"],
            key=str(n),
        )
    commands = drive(router, h.events)
    assert sorted((c.change_id, c.payload["agentId"]) for c in commands) == [
        ("chg-1", "agent-b"),
        ("chg-1", "agent-b"),
        ("chg-2", "agent-c"),
        ("chg-2", "agent-c"),
    ]


def _stale_rows(outbox_path: Path) -> list[Event]:
    with sqlite3.connect(outbox_path) as db:
        rows = db.execute("SELECT envelope FROM outbox ORDER BY slot").fetchall()
    return [decode_event(bytes(r[0]), max_bytes=MAX_BYTES) for r in rows]


def test_canonical_advanced_makes_older_open_candidates_stale_through_the_routers_outbox(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.sqlite"
    router = make_router(open_test_outbox(path))
    h = History()
    h.add("verification.started", change="chg-1", candidateId="old-open", workGraphCompleted=True)
    h.add(
        "verification.started", change="chg-2", candidateId="old-rejected", workGraphCompleted=True
    )
    h.add("candidate.rejected", change="chg-2", candidateId="old-rejected")
    h.add("verification.started", change="chg-3", candidateId="promoted", workGraphCompleted=True)
    h.add("artifact.promoted", change="chg-3", candidateId="promoted", generation=1)
    h.add("canonical.advanced", change=None, generation=1)
    h.add("verification.started", change="chg-4", candidateId="new", workGraphCompleted=True)
    h.add("candidate.verified", change="chg-4", candidateId="new")
    h.add(
        "verification.started",
        change="chg-5",
        candidateId="older",
        workGraphCompleted=False,
        canonical_generation=0,
    )
    advanced = h.add("canonical.advanced", change=None, generation=2)
    drive(router, h.events)
    stale = _stale_rows(path)
    assert [(e.event_type, e.payload["candidateId"], e.payload["generation"]) for e in stale] == [
        ("candidate.stale", "old-open", 1),
        ("candidate.stale", "new", 2),
        ("candidate.stale", "older", 2),
    ]
    assert stale[-1].event_id == stable_event_id("chg-5", "candidate.stale", None, "older")
    assert stale[-1].payload["causedBy"] == advanced.event_id
    assert [e.slot for e in stale] == [1, 2, 3]
    assert router.stats.stale_written == 3
    # The same decision again (a retried batch): the outbox ignores the repeated ids.
    again = make_router(open_test_outbox(path))
    drive(again, h.events)
    assert len(_stale_rows(path)) == 3
    assert again.stats.stale_repeated == 3


def test_the_routers_own_stale_event_coming_back_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    router = make_router(open_test_outbox(path))
    h = History()
    h.add("verification.started", change="chg-1", candidateId="c1", workGraphCompleted=True)
    h.add("canonical.advanced", change=None, generation=1)
    drive(router, h.events)
    (stale,) = _stale_rows(path)
    driver = Driver(make_router(open_test_outbox(tmp_path / "other.sqlite")))
    driver.fold(h.events)
    state = driver.states["proj-1"]
    assert router.reduce(state, stale) == state
    assert router.process(stale, state, delivery()).records == []


BAD_EVENTS = [
    ("task.created", {"task": None}, "taskId"),
    ("task.created", {"change": None, "task": "t1"}, "changeId"),
    ("task.created", {"task": "t1", "dependsOn": "t0"}, "payload.dependsOn"),
    ("task.created", {"task": "t1", "dependsOn": ["t1"]}, "payload.dependsOn"),
    ("task.created", {"task": "t1", "resources": [3]}, "payload.resources"),
    ("task.started", {"task": "t1"}, "payload.agentId"),
    ("task.completed", {"task": "t1", "agentId": 7}, "payload.agentId"),
    ("intent.declared", {"agentId": "a"}, "payload.resources"),
    ("claim.acquired", {"agentId": "a", "resources": []}, "payload.resources"),
    ("claim.released", {"resources": ["x"]}, "payload.agentId"),
    ("verification.started", {"candidateId": "c"}, "payload.workGraphCompleted"),
    ("verification.started", {"workGraphCompleted": True}, "payload.candidateId"),
    ("artifact.promoted", {"candidateId": "c", "generation": "1"}, "payload.generation"),
    ("canonical.advanced", {"change": None}, "payload.generation"),
    ("canonical.advanced", {"change": None, "generation": -1}, "payload.generation"),
]


@pytest.mark.parametrize(("event_type", "fields", "field"), BAD_EVENTS)
def test_bad_input_is_refused_naming_the_field_and_the_fold_is_untouched(
    tmp_path: Path, event_type: str, fields: dict[str, Any], field: str
) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    h = History()
    before = empty_state()
    snapshot = orjson.dumps(before)
    payload = {k: v for k, v in fields.items() if k not in ("task", "change")}
    event = h.add(
        event_type,
        change=fields.get("change", "chg-1"),
        task=fields.get("task"),
        **payload,
    )
    with pytest.raises(RouterInputError, match=field.replace(".", r"\.")) as info:
        router.reduce(before, event)
    assert event.event_id in str(info.value)
    assert orjson.dumps(before) == snapshot


def test_too_many_resources_in_one_event_are_refused(tmp_path: Path) -> None:
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"))
    h = History()
    event = h.add("intent.declared", agentId="a", resources=[f"f{n}" for n in range(1001)])
    with pytest.raises(RouterInputError, match="at most 1000"):
        router.reduce(None, event)


def test_a_confident_skip_is_the_only_classifier_answer_that_does_not_wake(tmp_path: Path) -> None:
    scripted = ScriptedClassifier(Answer(wake=False, probability=0.95))
    router = make_router(open_test_outbox(tmp_path / "outbox.sqlite"), classifier=scripted)
    h = History()
    _agents(h, ("agent-a", "t1", ["src/own.py"]), ("agent-b", "t2", ["src/api/routes.py"]))
    h.add("intent.declared", task="t1", agentId="agent-a", resources=["src/api"])
    assert drive(router, h.events) == []
    (question,) = scripted.questions
    assert (question.declaring_agent, question.active_agent) == ("agent-a", "agent-b")
    assert question.overlaps == (("src/api", "src/api/routes.py"),)
    assert router.stats.classifier == {"skip": 1}
