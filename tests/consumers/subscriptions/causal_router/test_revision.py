"""Command ids and the cursor revision: at revision 0 the router's ids are exactly the ids it
always derived; after a ``reprocess_from`` (revision > 0) every id carries the revision, so the
re-run's commands are new to the workers' dedupe and really run again."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.runtime.types import OutRecord
from streams.envelopes import Command, decode_command
from tests.support.causal_router import (
    MAX_BYTES,
    Driver,
    History,
    make_router,
    open_test_outbox,
)


def _history() -> tuple[History, dict[str, str]]:
    """Every kind of command the rules send, and the ids of their causing events."""
    h = History()
    for agent, task, path in (("agent-a", "t1", "src/a.py"), ("agent-b", "t2", "src/b.py")):
        h.add("task.created", task=task, resources=[path])
        h.add("task.ready", task=task)
        h.add("task.started", task=task, agentId=agent)
    h.add("task.created", task="t3", dependsOn=["t2"])
    intent = h.add("intent.declared", task="t2", agentId="agent-b", resources=["src/a.py"])
    verify = h.add("verification.started", candidateId="cand-1", workGraphCompleted=True)
    promoted = h.add("artifact.promoted", candidateId="cand-1", generation=1)
    advanced = h.add("canonical.advanced", change=None, generation=1)
    done = h.add("task.completed", task="t2", agentId="agent-b")
    causes = {
        "intent": intent.event_id,
        "verify": verify.event_id,
        "promoted": promoted.event_id,
        "advanced": advanced.event_id,
        "done": done.event_id,
    }
    return h, causes


def _run(tmp_path: Path, revision: int) -> tuple[list[Command], list[OutRecord]]:
    router = make_router(open_test_outbox(tmp_path / f"outbox-{revision}.sqlite"))
    h, _ = _history()
    driver = Driver(router, revision=revision)
    commands = driver.feed(h.events)
    records = [r for effects in driver.effects for r in effects.records]
    return commands, records


def _expected_ids(causes: dict[str, str]) -> list[str]:
    return [
        f"cmd_{causes['intent']}_agent.wake_agent-a",
        f"cmd_{causes['verify']}_candidate.create_cand-1",
        f"cmd_{causes['promoted']}_index.build_generation-1",
        f"cmd_{causes['advanced']}_agent.wake_agent-a",
        f"cmd_{causes['advanced']}_agent.wake_agent-b",
        f"cmd_{causes['advanced']}_index.build_generation-1",
        f"cmd_{causes['done']}_change.dispatch_t3",
    ]


def test_at_cursor_revision_0_command_ids_are_exactly_as_always(tmp_path: Path) -> None:
    commands, records = _run(tmp_path, 0)
    _, causes = _history()
    assert [c.command_id for c in commands] == _expected_ids(causes)
    assert [r.record_id for r in records] == _expected_ids(causes)


@pytest.mark.parametrize("revision", [1, 2])
def test_after_a_reprocess_every_command_id_carries_the_revision(
    tmp_path: Path, revision: int
) -> None:
    base, _ = _run(tmp_path, 0)
    commands, records = _run(tmp_path, revision)
    _, causes = _history()
    expected = [f"{i}_r{revision}" for i in _expected_ids(causes)]
    assert [c.command_id for c in commands] == expected
    assert [r.record_id for r in records] == expected
    for record in records:  # the record carries the same id as the command inside it
        assert decode_command(record.value, max_bytes=MAX_BYTES).command_id == record.record_id
    # Only the id changes: the same work, the same targets and workflow instance ids.
    assert [(c.command_type, c.task_id, c.payload) for c in commands] == [
        (c.command_type, c.task_id, c.payload) for c in base
    ]
