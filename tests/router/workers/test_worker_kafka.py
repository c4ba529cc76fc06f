"""Command workers and the dead-letter consumer on the real broker and Redis, as processes
(``rhumbatron worker`` / ``rhumbatron dead-letter-consumer``), with short retry delays."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from consumers.redis_conn import connect
from consumers.runtime.dead_letters import LetterStatus, command_letter_id
from consumers.subscriptions.causal_router.commands import task_ready_command_id
from router.settings import Settings
from router.wiring.subscription import dead_letters
from router.wiring.workers import provision_queues, worker_slug
from router.workers.drills import read_drill
from streams.envelopes import decode_command
from streams.headers import ATTEMPTS, DEAD_LETTER_REASON, ERROR, ORIGIN_QUEUE
from streams.producer import Producer
from streams.topology import group_id, queue_name
from tests.support.kafka import events_of, group_assignments, read_all
from tests.support.waiting import wait_until
from tests.support.workers import (
    QUEUE,
    cli,
    commands,
    finish,
    send,
    settings_factory,
    short_queues,
    start_worker,
)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


def test_ten_percent_failing_once_each_command_succeeds_once_after_exactly_one_retry(
    make: Any,
) -> None:
    s = make(queues=short_queues(1.0))
    provision_queues(s, [QUEUE])
    flaky = commands(20, "f", drill="fail-once")
    fine = commands(180, "k")
    send(s, flaky[:10] + fine + flaky[10:])
    stats = finish(
        start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "4")
    )
    drill = read_drill(connect(s.redis_url, timeout=5), s.env, QUEUE)
    assert drill["ok"] == {
        **{c.command_id: 2 for c in flaky},
        **{c.command_id: 1 for c in fine},
    }
    assert drill["runs"] == drill["ok"]  # no attempt ran twice
    assert stats["retried"] == 20 and stats.get("dead_lettered", 0) == 0
    assert (
        read_all(s.kafka_bootstrap, [queue_name("dead-letter", s.env)], expect=1, timeout=3) == []
    )


def test_a_command_failing_always_lands_on_the_dead_letter_queue_after_exactly_its_attempts(
    make: Any,
) -> None:
    s = make(queues=short_queues(0.5, retries=3))
    provision_queues(s, [QUEUE])
    bad = commands(3, "b", drill="fail")
    send(s, bad + commands(5, "g"))
    stats = finish(
        start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "3")
    )
    drill = read_drill(connect(s.redis_url, timeout=5), s.env, QUEUE)
    assert all(drill["runs"][c.command_id] == 4 for c in bad)
    letters = read_all(s.kafka_bootstrap, [queue_name("dead-letter", s.env)], expect=3, timeout=20)
    assert sorted(
        decode_command(m.value(), max_bytes=s.max_envelope_bytes).command_id for m in letters
    ) == [c.command_id for c in bad]
    for m in letters:
        headers = {k: bytes(v or b"").decode() for k, v in cast(list[Any], m.headers() or [])}
        assert headers[ATTEMPTS] == "4"
        assert headers[ORIGIN_QUEUE] == QUEUE
        assert headers[DEAD_LETTER_REASON] == "failed"
        assert "fails on every attempt" in headers[ERROR]
    assert stats["dead_lettered"] == 3 and stats["failed"] == 12


def test_a_retry_waiting_while_its_worker_leaves_is_run_by_the_next_exactly_as_configured(
    make: Any,
) -> None:
    s = make(queues=short_queues(8.0), queue_partitions=2)
    provision_queues(s, [QUEUE])
    client = connect(s.redis_url, timeout=5)
    [waiting] = commands(1, "w", drill="fail-once")
    first = start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill")
    second = None
    try:
        send(s, [waiting])
        wait_until(
            lambda: read_drill(client, s.env, QUEUE)["runs"].get(waiting.command_id) == 1,
            60,
            "the waiting command ran once",
        )
        # The retry now waits (8 s) in the first worker, its partition paused. A second worker
        # joins (a rebalance), then the first leaves while the retry is still not due. Until the
        # first has left, the second may own nothing: its idle limit must outlast that.
        second = start_worker(
            s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "15"
        )
        group = group_id(worker_slug(QUEUE), s.env)
        wait_until(
            lambda: (
                [bool(held) for held in group_assignments(s.kafka_bootstrap, group)] == [True] * 2
            ),
            60,
            "the second worker joined the group and both hold partitions",
        )
        first.terminate()
        first_stats = finish(first)
        wait_until(
            lambda: read_drill(client, s.env, QUEUE)["ok"].get(waiting.command_id) == 2,
            60,
            "the waiting command succeeded on its retry",
        )
        later = commands(10, "l")
        send(s, later)  # nothing was left paused: new work on every partition flows
        stats = finish(second)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    drill = read_drill(client, s.env, QUEUE)
    assert drill["runs"][waiting.command_id] == 2
    assert all(drill["ok"][c.command_id] == 1 for c in later)
    # The first worker only failed it; the second ran the retry (and the later commands).
    assert first_stats["retried"] == 1 and first_stats.get("ok", 0) == 0
    assert stats["ok"] == 1 + len(later)


def test_dead_letter_consumer_records_once_blocks_the_task_and_the_operator_retries_once(
    make: Any,
) -> None:
    s = make(queues=short_queues(0.5, retries=1))
    # The streams too: the dead-letter consumer's task events go out to them (it creates none).
    provision_queues(s, [QUEUE, "dead-letter"], streams=True)
    # Task-ready wakes: a task's own work, so their dead letters block and fail the task (a
    # notification wake's letter changes no task).
    bad, dismissed = (
        c.model_copy(update={"command_id": task_ready_command_id(c.task_id or "")})
        for c in commands(2, "d", drill="fail")
    )
    send(s, [bad, dismissed])
    finish(start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "3"))
    dlq = queue_name("dead-letter", s.env)
    letters = read_all(s.kafka_bootstrap, [dlq], expect=2, timeout=20)
    assert len(letters) == 2
    producer = Producer(s.kafka_config())  # the same dead letters, delivered a second time
    for m in letters:
        producer.produce(
            dlq,
            m.value() or b"",
            key=bytes(m.key() or b"").decode(),
            headers=cast(list[tuple[str, bytes]], m.headers()),
        )
    producer.flush(30)

    stats = finish(start_worker(s, "dead-letter-consumer", "--until-idle", "4"))
    assert stats["recorded"] == 2 and stats["duplicate"] == 2
    store = dead_letters(s, connect(s.redis_url, timeout=5))
    commands_letters = [d for d in store.list() if d.kind == "command"]
    letter_ids = sorted([bad.command_id, dismissed.command_id])
    assert sorted(d.command_id or "" for d in commands_letters) == letter_ids
    letter = store.get(command_letter_id(bad.command_id))
    assert letter is not None and letter.origin_queue == QUEUE and letter.attempts == 2

    events = [
        e
        for e in events_of(read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=4))
        if e.payload.get("commandId") in letter_ids
    ]
    by_type = sorted((e.event_type, e.payload["commandId"]) for e in events)
    assert by_type == [(t, i) for t in ("task.blocked", "task.failed") for i in letter_ids]
    blocked = next(e for e in events if e.event_type == "task.blocked" and e.task_id == bad.task_id)
    assert blocked.payload["blockedLimit"] == "dead_letter"

    # The operator's retry lands on the origin queue once; a second click is refused.
    cli(s, "dead-letters", "retry", letter.id, "--who", "alice", "--reason", "agent fixed")
    again = cli(s, "dead-letters", "retry", letter.id, "--who", "bob", check=False)
    assert again.returncode == 2 and "not open" in again.stderr
    on_queue = read_all(s.kafka_bootstrap, [queue_name(QUEUE, s.env)], expect=3, timeout=15)
    ids = [decode_command(m.value(), max_bytes=s.max_envelope_bytes).command_id for m in on_queue]
    assert ids.count(bad.command_id) == 2  # the original and the one retry
    retried = store.get(letter.id)
    assert retried is not None and retried.status == LetterStatus.RETRIED
    assert retried.audit[-1]["who"] == "alice"

    other = command_letter_id(dismissed.command_id)
    cli(s, "dead-letters", "dismiss", other, "--who", "alice", "--reason", "obsolete task")
    closed = store.get(other)
    assert closed is not None and closed.status == LetterStatus.DISMISSED
    assert closed.audit[-1]["why"] == "obsolete task"
