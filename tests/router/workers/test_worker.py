"""The command worker runtime on the in-memory log with a manual clock: exact attempts and gaps,
no blocking, expiry, the delivery limit, dedupe, the indexer's failure record, workflow starts,
false wakeups, a failed transaction, and a revoke while a retry waits."""

from __future__ import annotations

import itertools
import logging

import pytest

from consumers.runtime.memory_transport import MemoryOutput
from consumers.runtime.types import TP, Record
from router.workers.helpers import (
    AgentWakeHandler,
    IndexingHandler,
    MemoryIndexStates,
    MemoryWorkflowRegistry,
    WorkflowInstance,
    WorkflowStartHandler,
)
from router.workers.model import Context
from streams.envelopes import Command, decode_command, encode
from streams.errors import MoreWork
from streams.headers import (
    ATTEMPTS,
    DEAD_LETTER_REASON,
    ERROR,
    LEGACY,
    OPERATOR_RETRY,
    ORIGIN_QUEUE,
    RECORD_ID,
)
from tests.support.worker_harness import MAX, Scripted, World, fail_for, policy


def headers(record: Record) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def test_a_failing_command_runs_exactly_1_plus_retries_times_each_gap_at_least_the_delay() -> None:
    world = World(policy())
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    worker = world.worker(handler)
    bad = world.command("cmd_bad")
    world.send(bad, *(world.command(f"cmd_ok{i}") for i in range(5)))
    world.run_for(worker, 200)

    assert handler.attempts_of("cmd_bad") == [1, 2, 3, 4]
    times = handler.times_of("cmd_bad")
    assert all(b - a >= 30 for a, b in itertools.pairwise(times))
    for i in range(5):
        assert handler.attempts_of(f"cmd_ok{i}") == [1]
    [letter] = world.dead_letters()
    h = headers(letter)
    assert h[ATTEMPTS] == "4" and h[ORIGIN_QUEUE] == "agent-wakeups"
    assert h[DEAD_LETTER_REASON] == "failed"
    assert "boom on cmd_bad" in h[ERROR]
    assert letter.value == encode(bad, max_bytes=MAX)  # the original bytes
    assert worker.waiting() == 0 and worker.paused() == set()
    assert world.metrics.counts["agent-wakeups"]["dead_lettered"] == 1
    assert world.metrics.counts["agent-wakeups"]["failed"] == 4


def test_a_record_sent_on_carries_only_the_current_names_once_each() -> None:
    world = World(policy(retries=1))
    worker = world.worker(Scripted(fail_for("cmd_bad"), world.clock))
    bad = world.command("cmd_bad")
    stale = (
        ("traceparent", b"00-abc-def-01"),
        (ERROR, b"an earlier life"),
        ("dlq.attempts", b"9"),
        (RECORD_ID, b"an earlier effect"),
        (OPERATOR_RETRY, b"dl_earlier"),
    )
    world.log.append(world.policy.queue_topic, 0, encode(bad, max_bytes=MAX), b"p1", stale)
    world.run_for(worker, 100)

    [retry] = world.log.all(world.policy.retry_topic)
    [letter] = world.dead_letters()
    for record in (retry, letter):
        names = [k for k, _ in record.headers]
        assert len(names) == len(set(names)), names
        assert not any(k in LEGACY for k in names)
        assert record.header(RECORD_ID) != b"an earlier effect"
        assert record.header(OPERATOR_RETRY) == b"dl_earlier"  # the dead-letter consumer needs it
        assert record.header("traceparent") == b"00-abc-def-01"
        assert b"boom on cmd_bad" in (record.header(ERROR) or b"")
    assert headers(letter)[ATTEMPTS] == "2"


def test_zero_retries_dead_letters_after_the_first_attempt() -> None:
    world = World(policy(retries=0))
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    world.send(world.command("cmd_bad"))
    world.run_for(world.worker(handler), 100)
    assert handler.attempts_of("cmd_bad") == [1]
    assert len(world.dead_letters()) == 1


def test_a_command_waiting_for_its_retry_does_not_hold_back_the_others() -> None:
    world = World(policy())
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    worker = world.worker(handler)
    world.send(world.command("cmd_bad"))
    worker.step()
    world.send(*(world.command(f"cmd_later{i}") for i in range(25)))  # same partition, behind it
    for _ in range(5):
        worker.step()  # the clock does not move: the retry is not due
    assert all(handler.attempts_of(f"cmd_later{i}") == [1] for i in range(25))
    assert handler.attempts_of("cmd_bad") == [1]
    assert worker.waiting() == 1 and len(worker.paused()) == 1  # only its retry partition
    world.clock.advance(30)
    worker.step()
    assert handler.attempts_of("cmd_bad") == [1, 2]


def test_an_expired_command_is_dead_lettered_as_expired_and_not_run() -> None:
    world = World(policy())
    handler = Scripted(fail_for(), world.clock)
    world.send(world.command("cmd_late", deadline_s=5))
    world.clock.advance(10)
    world.run_for(world.worker(handler), 2)
    assert handler.runs == []
    [letter] = world.dead_letters()
    assert headers(letter)[DEAD_LETTER_REASON] == "expired"
    assert "expired" in headers(letter)[ERROR]


def test_more_work_is_delivered_at_most_max_deliveries_times_and_the_last_is_acknowledged() -> None:
    world = World(policy())

    def always_more(command: Command, ctx: Context) -> str | None:
        raise MoreWork()

    handler = Scripted(always_more, world.clock)
    worker = world.worker(handler)
    world.send(world.command("cmd_big"))
    world.run_for(worker, 10)
    assert handler.attempts_of("cmd_big") == [1, 2, 3, 4]
    assert world.dead_letters() == []
    assert worker.stats.outcomes["more_work"] == 3
    assert worker.stats.outcomes["more_work_last_delivery"] == 1


def test_failures_and_more_work_share_one_delivery_count() -> None:
    world = World(policy())

    def fail_then_more(command: Command, ctx: Context) -> str | None:
        if ctx.attempt == 1:
            raise RuntimeError("first fails")
        raise MoreWork()

    handler = Scripted(fail_then_more, world.clock)
    world.send(world.command("cmd_mixed"))
    world.run_for(world.worker(handler), 100)
    assert handler.attempts_of("cmd_mixed") == [1, 2, 3, 4]
    assert world.dead_letters() == []


def test_a_completed_command_id_is_not_run_again() -> None:
    world = World(policy())
    handler = Scripted(fail_for(), world.clock)
    worker = world.worker(handler)
    world.send(world.command("cmd_once"), world.command("cmd_once"))
    world.run_for(worker, 2)
    world.send(world.command("cmd_once"), partition=1)  # a late copy on another partition
    world.run_for(worker, 2)
    assert handler.attempts_of("cmd_once") == [1]
    assert worker.stats.outcomes["duplicate"] == 2


def test_indexing_records_its_last_failure_with_the_project_index_state() -> None:
    world = World(policy("indexing", batch=1, dead_letter=None))
    states = MemoryIndexStates()

    def build_index(command: Command, ctx: Context) -> None:
        if command.payload.get("broken"):
            raise OSError("index store unavailable")

    worker = world.worker(IndexingHandler(build_index, states))
    world.send(world.command("cmd_idx_bad", project="p-bad", broken=True))
    world.send(world.command("cmd_idx_ok", project="p-ok"))
    world.run_for(worker, 200)
    bad = states.get("p-bad")
    assert bad["status"] == "failed" and bad["command_id"] == "cmd_idx_bad"
    assert bad["attempts"] == "4" and "index store unavailable" in bad["error"]
    assert states.get("p-ok")["status"] == "ok"
    assert world.dead_letters() == []
    assert worker.stats.outcomes["exhausted_recorded"] == 1


def test_a_queue_without_dead_letters_drops_loudly(caplog: pytest.LogCaptureFixture) -> None:
    world = World(policy("dead-letter", retries=0, dead_letter=None))
    handler = Scripted(fail_for("cmd_x"), world.clock)
    world.log.append(world.policy.queue_topic, 0, b"not json", b"k")
    world.send(world.command("cmd_x"))
    with caplog.at_level(logging.ERROR, logger="rhumbatron.worker"):
        world.run_for(world.worker(handler), 2)
    dropped = [r.getMessage() for r in caplog.records if "DROPPED" in r.getMessage()]
    assert len(dropped) == 2
    assert any("cmd_x" in m and "@1" in m for m in dropped)
    assert any("not a command" in m and "@0" in m for m in dropped)


def test_an_undecodable_record_is_dead_lettered_as_undecodable() -> None:
    world = World(policy())
    world.log.append(world.policy.queue_topic, 0, b'{"commandId": 3}', b"k")
    world.run_for(world.worker(Scripted(fail_for(), world.clock)), 2)
    [letter] = world.dead_letters()
    assert headers(letter)[DEAD_LETTER_REASON] == "undecodable"
    assert "commandId" in headers(letter)[ERROR]


def test_workflow_start_uses_the_idempotency_key_and_a_redelivery_finds_it_running() -> None:
    world = World(policy("verification", batch=5))
    registry = MemoryWorkflowRegistry()
    started: list[str] = []
    fail_first = {"n": 1}

    def start(instance: WorkflowInstance, command: Command) -> None:
        if fail_first["n"]:
            fail_first["n"] -= 1
            raise ConnectionError("workflow engine busy")
        started.append(instance.instance_id)

    handler = WorkflowStartHandler(registry, start)
    worker = world.worker(handler)
    first = world.command("cmd_cand1_verify", candidateId="cand1").model_copy(
        update={"command_type": "verification.start"}
    )
    other = world.command("cmd_cand1_verify_again", candidateId="cand1").model_copy(
        update={"command_type": "verification.start"}
    )
    world.send(first)
    world.run_for(worker, 40)  # first start fails, its retry starts it
    world.send(other)
    world.run_for(worker, 2)
    assert started == ["cand1"]
    instance = registry.get("verification", "cand1")
    assert instance is not None and instance.status == "running"
    assert instance.command_id == "cmd_cand1_verify"
    assert worker.stats.outcomes["started"] == 1
    assert worker.stats.outcomes["already_running"] == 1
    ctx = Context(
        "verification", 1, 4, 4, world.log.all(world.policy.queue_topic)[0], world.clock.now()
    )
    assert handler.handle(first, ctx) == "already_running"  # a redelivery of the first one


@pytest.mark.parametrize("payload", [{}, {"candidateId": " "}, {"candidateId": 7}])
def test_a_workflow_start_without_its_key_is_refused_naming_the_field(
    payload: dict[str, object],
) -> None:
    world = World(policy("verification", batch=5))
    handler = WorkflowStartHandler(MemoryWorkflowRegistry(), lambda instance, command: None)
    bad = world.command("cmd_nokey_verify").model_copy(
        update={"command_type": "verification.start", "payload": payload}
    )
    ctx = Context("verification", 1, 4, 4, None, world.clock.now())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"payload\.candidateId"):
        handler.handle(bad, ctx)


def test_stale_wakes_end_at_once_and_count_as_false_wakeups() -> None:
    world = World(policy())
    woken: list[str] = []
    handler = AgentWakeHandler(
        lambda c: c.payload.get("holds") is True, lambda c, ctx: woken.append(c.command_id)
    )
    worker = world.worker(handler)
    world.send(*(world.command(f"cmd_w{i}", holds=i % 3 == 0) for i in range(9)))
    world.run_for(worker, 2)
    assert woken == ["cmd_w0", "cmd_w3", "cmd_w6"]
    assert worker.stats.outcomes["false_wakeup"] == 6
    assert world.metrics.counts["agent-wakeups"]["false_wakeup"] == 6


def test_a_failed_transaction_is_read_again_with_the_same_attempt_numbers() -> None:
    world = World(policy())
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    fail = {"n": 1}

    def fail_once() -> bool:
        if fail["n"]:
            fail["n"] -= 1
            return True
        return False

    output.fail_commit = fail_once
    world.send(world.command("cmd_bad"), world.command("cmd_good"))
    world.run_for(worker, 200)
    # The first attempt ran twice (its transaction was lost); every later step counted once.
    assert handler.attempts_of("cmd_bad") == [1, 1, 2, 3, 4]
    assert handler.attempts_of("cmd_good") == [1]  # completed before the loss: not run again
    assert worker.stats.transaction_failures == 1
    [letter] = world.dead_letters()
    assert headers(letter)[ATTEMPTS] == "4"


def test_a_revoke_while_a_retry_waits_hands_it_over_and_leaves_nothing_paused() -> None:
    world = World(policy())
    once: set[str] = set()

    def fail_once(command: Command, ctx: Context) -> str | None:
        if command.command_id not in once:
            once.add(command.command_id)
            raise RuntimeError("first attempt fails")
        return None

    handler = Scripted(fail_once, world.clock)
    a = world.worker(handler)
    world.send(world.command("cmd_r"))
    a.step()
    a.step()  # its retry is fetched and waits, paused
    retry_tps = [TP(world.policy.retry_topic, p) for p in range(2)]
    assert a.waiting() == 1 and a.paused()
    a.transport.revoke(retry_tps)  # type: ignore[attr-defined]
    a.step()
    assert a.waiting() == 0 and a.paused() == set()
    b = world.worker(handler, auto_assign=False)
    b.transport.assign(retry_tps)  # type: ignore[attr-defined]
    b.step()
    assert handler.attempts_of("cmd_r") == [1]  # not due yet on the new owner either
    world.clock.advance(30)
    b.step()
    b.step()
    assert handler.attempts_of("cmd_r") == [1, 2]
    assert b.waiting() == 0 and b.paused() == set()
    a.transport.assign(retry_tps)  # type: ignore[attr-defined]  # and back: nothing runs twice
    world.run_for(a, 40)
    assert handler.attempts_of("cmd_r") == [1, 2]


def test_policies_come_from_settings_and_bad_names_are_refused_by_name() -> None:
    from router.settings import Settings
    from router.wiring.workers import worker_policy
    from streams.errors import ConfigurationError, TopologyError

    s = Settings(env="unit")
    wakes = worker_policy(s, "agent-wakeups")
    assert (wakes.batch, wakes.attempts, wakes.retry_delay_s) == (10, 4, 30)
    assert worker_policy(s, "indexing").dead_letter_topic is None
    assert worker_policy(s, "dead-letter").attempts == 6
    with pytest.raises(ConfigurationError, match="'nope'.*known: agent-wakeups"):
        worker_policy(s, "nope")
    with pytest.raises(TopologyError, match="unknown queue purpose 'nope'"):
        policy("nope")


def test_an_aborted_transaction_ends_the_step_so_no_command_starts_a_second_retry_chain() -> None:
    # Defect 7 of issue 9: a step settles its records in chunks of ``batch``; when one chunk's
    # transaction aborted, later chunks of the same step went on and committed offsets past the
    # rewound records, which were then read and retried a second time. Here each chunk has a
    # transaction of its own.
    world = World(policy(batch=3, transaction_max_commands=3))
    handler = Scripted(fail_for("cmd_a", "cmd_b", "cmd_c"), world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    world.send(*(world.command(c) for c in ("cmd_a", "cmd_b", "cmd_c")))
    worker.step()  # three first attempts fail: three retries, on one retry partition
    worker.step()  # the retries are fetched and wait
    assert worker.waiting() == 3
    world.send(world.command("cmd_q"))
    world.clock.advance(30)
    fail = {"n": 1}

    def fail_once() -> bool:
        if fail["n"]:
            fail["n"] -= 1
            return True
        return False

    output.fail_commit = fail_once
    worker.step()  # chunks [cmd_q, retry a, retry b] (aborted) and [retry c]
    world.run_for(worker, 300)

    assert worker.stats.transaction_failures == 1
    for command_id in ("cmd_a", "cmd_b"):  # their attempt 2 was in the aborted transaction
        assert handler.attempts_of(command_id) == [1, 2, 2, 3, 4]
    assert handler.attempts_of("cmd_c") == [1, 2, 3, 4]
    assert handler.attempts_of("cmd_q") == [1]  # completed before the loss: not run again
    lettered = sorted(
        decode_command(r.value, max_bytes=MAX).command_id for r in world.dead_letters()
    )
    assert lettered == ["cmd_a", "cmd_b", "cmd_c"]  # one dead letter each
    assert worker.waiting() == 0 and worker.paused() == set()


def test_due_retries_after_an_aborted_chunk_are_read_again_not_lost() -> None:
    world = World(policy(batch=2))
    once: set[str] = set()

    def fail_once(command: Command, ctx: Context) -> str | None:
        if command.command_id.startswith("cmd_r") and command.command_id not in once:
            once.add(command.command_id)
            raise RuntimeError("first attempt fails")
        return None

    handler = Scripted(fail_once, world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    world.send(world.command("cmd_r1"), world.command("cmd_r2"))
    worker.step()
    worker.step()  # both retries wait in the buffer
    world.send(world.command("cmd_n1"), world.command("cmd_n2"), partition=1)
    world.clock.advance(30)
    fail = {"n": 1}

    def fail_once_commit() -> bool:
        if fail["n"]:
            fail["n"] -= 1
            return True
        return False

    output.fail_commit = fail_once_commit
    worker.step()  # chunks [cmd_n1, cmd_n2] (aborted) and the two due retries, taken from the buffer
    world.run_for(worker, 100)
    assert handler.attempts_of("cmd_r1") == [1, 2]
    assert handler.attempts_of("cmd_r2") == [1, 2]
    assert handler.attempts_of("cmd_n1") == [1] and handler.attempts_of("cmd_n2") == [1]
    assert worker.waiting() == 0 and worker.paused() == set()


def test_a_raising_hook_in_a_threaded_chunk_still_records_what_completed_beside_it() -> None:
    # Found by the adversarial suite: with max_in_flight, results were collected in order and the
    # first failure stopped the collection, so a command completed in another thread after it
    # was not recorded done, and ran again when the chunk was read again.
    world = World(policy(max_in_flight=2, retries=0, batch=2))
    broken = {"n": 1}

    class Recording(Scripted):
        def on_exhausted(self, command: Command, ctx: Context, error: BaseException) -> bool:
            if broken["n"]:
                broken["n"] -= 1
                raise ConnectionError("the failure record's store is unreachable")
            return False

    handler = Recording(fail_for("cmd_x"), world.clock)
    first = world.worker(handler)
    world.send(world.command("cmd_x"), world.command("cmd_y"))
    with pytest.raises(ConnectionError):
        first.step()  # the worker process ends here; a new one takes over
    world.run_for(world.worker(handler), 2)
    assert handler.attempts_of("cmd_y") == [1]
    assert handler.attempts_of("cmd_x") == [1, 1]
    assert len(world.dead_letters()) == 1
