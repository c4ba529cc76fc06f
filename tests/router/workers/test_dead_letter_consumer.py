"""The dead-letter consumer on the in-memory log: one record per command id however often the dead
letter arrives, task.blocked + task.failed through the outbox once per round, the operator's
retry sent once and a renewed failure re-opening the letter, poison records."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import LetterStatus, command_letter_id
from consumers.subscriptions.projector.processor import ProjectViewProjector
from streams.envelopes import Command, Event, build, decode_event, encode
from streams.errors import DeadLetterActionRefused
from streams.headers import LEGACY, OPERATOR_RETRY, is_ours
from streams.ids import new_event_id
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.sqlite_schema import SqliteOptions
from tests.support.causal_router import History, drive, make_router, open_test_outbox
from tests.support.projector_oracle import expected_view, memory_view
from tests.support.runtime_harness import World as RuntimeWorld
from tests.support.worker_harness import MAX, Pipeline


@pytest.fixture
def outbox(tmp_path: Path) -> SqliteOutbox:
    return SqliteOutbox(
        tmp_path / "router-outbox.sqlite",
        options=SqliteOptions(max_envelope_bytes=MAX, missed_report_limit=10, busy_timeout_s=5),
    )


def outbox_events(outbox: SqliteOutbox) -> list[dict[str, object]]:
    with sqlite3.connect(outbox.path) as conn:
        rows = conn.execute("SELECT envelope FROM outbox ORDER BY project_id, slot").fetchall()
    return [orjson.loads(bytes(r[0])) for r in rows]


def test_one_record_per_command_and_task_events_once_even_when_the_letter_arrives_twice(
    outbox: SqliteOutbox,
) -> None:
    p = Pipeline(outbox)
    command = p.world.command("cmd_t1_ready", agentId="agent-7", tenantId="tenant-a")
    p.world.send(command)
    p.run(40)
    [dlq_record] = p.world.dead_letters()
    p.world.log.append(  # the same dead letter delivered a second time
        dlq_record.topic, 1, dlq_record.value, dlq_record.key, dlq_record.headers
    )
    p.run(3)

    [letter] = p.store.list()
    assert letter.id == command_letter_id("cmd_t1_ready")
    assert letter.kind == "command" and letter.origin_queue == "agent-wakeups"
    assert letter.command_id == "cmd_t1_ready" and letter.attempts == 2
    assert "handler refuses cmd_t1_ready" in letter.error
    assert letter.entries[0].value == encode(command, max_bytes=MAX)
    events = outbox_events(outbox)
    assert [e["eventType"] for e in events] == ["task.blocked", "task.failed"]
    blocked, failed = events
    assert blocked["payload"] == {"blockedLimit": "dead_letter", "commandId": "cmd_t1_ready"}
    assert blocked["taskId"] == "t1" and blocked["changeId"] == "chg1"
    assert blocked["tenantId"] == "tenant-a"
    assert failed["payload"]["agentId"] == "agent-7"  # type: ignore[index]
    assert p.consumer.stats.outcomes["recorded"] == 1
    assert p.consumer.stats.outcomes["duplicate"] == 1


def test_a_command_without_a_task_is_recorded_but_blocks_nothing(outbox: SqliteOutbox) -> None:
    p = Pipeline(outbox)
    p.world.send(p.world.command("cmd_sweep").model_copy(update={"task_id": None}))
    p.run(40)
    assert len(p.store.list()) == 1
    assert outbox_events(outbox) == []


def test_a_dead_letter_carrying_only_the_legacy_header_names_is_recorded_the_same(
    outbox: SqliteOutbox,
) -> None:
    p = Pipeline(outbox)
    p.world.send(p.world.command("cmd_t1_ready"))
    p.run(40)
    [record] = p.world.dead_letters()
    [letter] = p.store.list()
    old_name = {new: old for old, new in LEGACY.items()}
    renamed = tuple((old_name.get(k, k), v) for k, v in record.headers)
    assert any(k in LEGACY for k, _ in renamed) and not any(k in old_name for k, _ in renamed)
    again = Pipeline(outbox)
    again.world.log.append(record.topic, record.partition, record.value, record.key, renamed)
    again.run(3)

    [read] = again.store.list()
    assert (read.id, read.kind, read.origin_queue, read.command_id) == (
        letter.id,
        letter.kind,
        letter.origin_queue,
        letter.command_id,
    )
    assert (read.source_topic, read.source_partition, read.entries[0].offset) == (
        letter.source_topic,
        letter.source_partition,
        letter.entries[0].offset,
    )
    assert (read.error, read.error_type, read.attempts) == (
        letter.error,
        letter.error_type,
        letter.attempts,
    )


def test_operator_retry_sends_once_and_a_renewed_failure_reopens_the_letter(
    outbox: SqliteOutbox,
) -> None:
    p = Pipeline(outbox)
    p.world.send(p.world.command("cmd_t1_ready"))
    p.run(40)
    letter_id = command_letter_id("cmd_t1_ready")
    sent: list[tuple[str, bytes, list[tuple[str, bytes]]]] = []

    def send(
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        sent.append((topic, value, headers))
        p.world.log.append(topic, 0, value, key, tuple(headers))

    actions = DeadLetterActions(
        p.store,
        p.world.clock,
        send,
        lambda slug: f"redelivery-{slug}",
        lambda tp: None,
        lambda purpose: f"rhumbatron-{purpose}-unit",
    )
    actions.retry(letter_id, who="alice", why="fixed the agent")
    with pytest.raises(DeadLetterActionRefused):
        actions.retry(letter_id, who="bob", why="double click")
    assert [t for t, _, _ in sent] == ["rhumbatron-agent-wakeups-unit"]
    assert [k for k, _ in sent[0][2] if is_ours(k)] == [OPERATOR_RETRY]
    assert p.store.get(letter_id).status == LetterStatus.RETRIED  # type: ignore[union-attr]

    p.run(40)  # the retried command fails twice more and is dead-lettered again
    letter = p.store.get(letter_id)
    assert letter is not None and letter.status == LetterStatus.OPEN
    assert [a["action"] for a in letter.audit] == ["retrying", "retried", "open"]
    assert "failed again" in letter.audit[-1]["why"]
    assert [e["eventType"] for e in outbox_events(outbox)] == [
        "task.blocked",
        "task.failed",
        "task.blocked",
        "task.failed",
    ]
    actions.dismiss(letter_id, who="alice", why="agent retired")
    assert p.store.get(letter_id).status == LetterStatus.DISMISSED  # type: ignore[union-attr]


def test_a_dead_lettered_record_that_is_not_a_command_becomes_a_poison_letter(
    outbox: SqliteOutbox,
) -> None:
    p = Pipeline(outbox)
    p.world.log.append(p.world.policy.queue_topic, 0, b"\x00garbage", b"k")
    p.run(3)
    [letter] = p.store.list()
    assert letter.kind == "poison" and letter.origin_queue == "agent-wakeups"
    assert letter.entries[0].value == b"\x00garbage"


def test_what_the_dead_letter_path_writes_for_an_unstarted_task_is_valid_input_to_the_view(
    outbox: SqliteOutbox,
) -> None:
    # A dispatch names no agent: the task never reached one, so its task.failed names none and
    # the project view must take it as it is, not dead-letter it for lacking an agent.
    p = Pipeline(outbox)
    dispatch = p.world.command("cmd_dispatch_t1", taskId="t1")
    p.world.send(dispatch.model_copy(update={"command_type": "change.dispatch"}))
    p.run(40)
    with sqlite3.connect(outbox.path) as conn:
        rows = conn.execute("SELECT envelope FROM outbox ORDER BY slot").fetchall()
    written = [decode_event(bytes(r[0]), max_bytes=MAX) for r in rows]
    assert [e.event_type for e in written] == ["task.blocked", "task.failed"]
    assert "agentId" not in written[1].payload

    def before(slot: int, event_type: str, payload: dict[str, object]) -> Event:
        return build(
            Event,
            event_id=new_event_id(),
            event_type=event_type,
            tenant_id="tenant-x",
            project_id="p1",
            change_id="chg1",
            task_id="t1",
            actor="test",
            timestamp=written[0].timestamp,
            payload=payload,
            slot=slot,
        )

    events = [
        before(1, "task.created", {"dependsOn": [], "resources": []}),
        before(2, "task.ready", {}),
        *(e.model_copy(update={"slot": 3 + n}) for n, e in enumerate(written)),
    ]
    world = RuntimeWorld()
    for e in events:
        world.publish(e)
    runner = world.runner(ProjectViewProjector(feed_length=50, missing_cap=1000))
    world.drain(runner)
    assert runner.stats.dead_lettered == 0 and runner.stats.failures == 0
    v = memory_view(world.store, world.tp_of("p1"), "p1")
    # Blocked, then failed by the dead-letter path: the view shows it blocked, with its limit.
    assert v is not None and v["tasks"]["t1"]["state"] == "blocked"
    assert v["tasks"]["t1"]["blockedLimit"] == "dead_letter"
    assert v["activeAgents"] == {}
    assert v == expected_view("p1", world.tp_of("p1"), events)


def _router_commands(tmp_path: Path) -> dict[str, Command]:
    """Commands as the causal router builds them: a resource-overlap wake and a canonical wake
    (both naming the woken agent's smallest in-flight task), and a change.dispatch."""
    router = make_router(open_test_outbox(tmp_path / "router-own-outbox.sqlite"))
    h = History()
    for agent, task, path in (("agent-a", "t1", "src/a.py"), ("agent-b", "t2", "src/b.py")):
        h.add("task.created", task=task, resources=[path])
        h.add("task.ready", task=task)
        h.add("task.started", task=task, agentId=agent)
    h.add("task.created", task="t3", dependsOn=["t2"])
    h.add("intent.declared", task="t2", agentId="agent-b", resources=["src/a.py"])
    h.add("canonical.advanced", change=None, generation=1)
    h.add("task.completed", task="t2", agentId="agent-b")
    out: dict[str, Command] = {}
    for c in drive(router, h.events):
        if c.command_type == "agent.wake":
            out[f"wake:{c.payload['reason']}:{c.payload['agentId']}"] = c
        elif c.command_type == "change.dispatch":
            out["dispatch"] = c
    assert sorted(out) == [
        "dispatch",
        "wake:canonical-advanced:agent-a",
        "wake:canonical-advanced:agent-b",
        "wake:resource-overlap:agent-a",
    ]
    assert out["wake:resource-overlap:agent-a"].task_id == "t1"  # a task it did not fail
    return out


def _task_events_of(outbox: SqliteOutbox) -> list[tuple[str, str | None, object]]:
    return [(str(e["eventType"]), e.get("taskId"), e["payload"]) for e in outbox_events(outbox)]  # type: ignore[misc]


def test_a_dead_lettered_notification_wake_is_recorded_but_changes_no_task(
    outbox: SqliteOutbox, tmp_path: Path
) -> None:
    # The router's resource-overlap and canonical wakes name the agent's smallest in-flight
    # task only to place the command; the task is not theirs to block or fail.
    commands = _router_commands(tmp_path)
    wakes = [c for name, c in sorted(commands.items()) if name.startswith("wake:")]
    p = Pipeline(outbox)
    p.world.send(*wakes)
    p.run(40)
    assert sorted(d.command_id or "" for d in p.store.list()) == sorted(c.command_id for c in wakes)
    assert all(d.status == LetterStatus.OPEN for d in p.store.list())  # shown to operators
    assert _task_events_of(outbox) == []


def test_a_dead_lettered_dispatch_and_task_ready_wake_block_and_fail_their_task(
    outbox: SqliteOutbox, tmp_path: Path
) -> None:
    dispatch = _router_commands(tmp_path)["dispatch"]
    assert dispatch.task_id == "t3"
    p = Pipeline(outbox)
    ready = p.world.command("cmd_t1_ready", agentId="agent-7")
    assert ready.task_id == "t1"
    p.world.send(dispatch, ready)
    p.run(40)
    assert len(p.store.list()) == 2
    events = _task_events_of(outbox)
    assert sorted((kind, task) for kind, task, _ in events) == [
        ("task.blocked", "t1"),
        ("task.blocked", "t3"),
        ("task.failed", "t1"),
        ("task.failed", "t3"),
    ]


def test_a_dead_lettered_ready_wake_the_agent_never_took_leaves_its_agent_count_right(
    outbox: SqliteOutbox,
) -> None:
    # The wake failed, so the agent never started t1; the task.failed still names the agent
    # the wake was for. The view must not count that as the agent ending a task it never had.
    p = Pipeline(outbox)
    p.world.send(p.world.command("cmd_t1_ready", agentId="agent-7"))
    p.run(40)
    with sqlite3.connect(outbox.path) as conn:
        rows = conn.execute("SELECT envelope FROM outbox ORDER BY slot").fetchall()
    written = [decode_event(bytes(r[0]), max_bytes=MAX) for r in rows]
    assert [e.event_type for e in written] == ["task.blocked", "task.failed"]
    assert written[1].payload["agentId"] == "agent-7"

    def event(slot: int, event_type: str, task: str, payload: dict[str, object]) -> Event:
        return build(
            Event,
            event_id=new_event_id(),
            event_type=event_type,
            tenant_id="tenant-x",
            project_id="p1",
            change_id="chg1",
            task_id=task,
            actor="test",
            timestamp=written[0].timestamp,
            payload=payload,
            slot=slot,
        )

    events = [
        event(1, "task.created", "t1", {"dependsOn": [], "resources": []}),
        event(2, "task.created", "t2", {"dependsOn": [], "resources": []}),
        event(3, "task.ready", "t1", {}),
        *(e.model_copy(update={"slot": 4 + n}) for n, e in enumerate(written)),
        event(6, "task.ready", "t2", {}),
        event(7, "task.started", "t2", {"agentId": "agent-7"}),
    ]
    world = RuntimeWorld()
    for e in events:
        world.publish(e)
    world.drain(world.runner(ProjectViewProjector(feed_length=50, missing_cap=1000)))
    v = memory_view(world.store, world.tp_of("p1"), "p1")
    assert v is not None and v["activeAgents"] == {"agent-7": 1}
    assert v == expected_view("p1", world.tp_of("p1"), events)
