"""Several chunks of a queue's batch in one transaction, on the in-memory log: the bounds of a
transaction (commands, time, a poll bringing nothing), an abort of a transaction holding several
chunks, and a revoke while one is open."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from consumers.runtime.memory_transport import MemoryOutput, MemoryTransport
from consumers.runtime.types import TP
from router.workers.model import Context
from router.workers.worker import Worker
from streams.envelopes import Command, decode_command
from tests.support.worker_harness import MAX, Scripted, World, fail_for, policy


def committed(world: World, tp: TP) -> int | None:
    found = world.log.offsets.get("group", {}).get(tp)
    return None if found is None else found.offset


def settle(world: World, *workers: Worker, rounds: int = 200) -> None:
    for _ in range(rounds):
        for w in workers:
            w.step()
        world.clock.advance(1.0)


def lettered(world: World) -> list[str]:
    return sorted(decode_command(r.value, max_bytes=MAX).command_id for r in world.dead_letters())


@pytest.mark.parametrize(
    ("batch", "max_commands", "transactions"),
    [
        (2, 6, [6, 6, 1]),  # three chunks a transaction; the last ends when a poll brings nothing
        (3, 4, [4, 4, 4, 1]),  # a chunk of 3 and one of 1: never past the bound
        (2, 1, [2] * 6 + [1]),  # at least one whole chunk
    ],
)
def test_a_transaction_holds_chunks_up_to_its_bound_of_commands(
    batch: int, max_commands: int, transactions: list[int]
) -> None:
    world = World(policy(batch=batch, transaction_max_commands=max_commands))
    handler = Scripted(fail_for(), world.clock)
    worker = world.worker(handler)
    sizes: list[int] = []  # the commands of each transaction, as its counters are added
    add = world.metrics.add

    def counted(queue: str, counts: Mapping[str, int]) -> None:
        sizes.append(counts["ok"])
        add(queue, counts)

    world.metrics.add = counted  # type: ignore[method-assign]
    world.send(*(world.command(f"cmd_{i:02d}") for i in range(13)))
    settle(world, worker, rounds=len(transactions) + 1)
    assert worker.stats.transactions == len(transactions) and sizes == transactions
    assert sorted(c for c, _, _ in handler.runs) == [f"cmd_{i:02d}" for i in range(13)]
    assert committed(world, TP(world.policy.queue_topic, 0)) == 13


def test_a_transaction_commits_once_it_is_open_for_its_bound_of_time() -> None:
    world = World(policy(batch=1, transaction_max_commands=100, transaction_max_ms=100))

    def slow(command: Command, ctx: Context) -> str | None:
        world.clock.advance(0.06)
        return None

    worker = world.worker(Scripted(slow, world.clock))
    world.send(*(world.command(f"cmd_{i}") for i in range(5)))
    worker.step()  # one poll: 60 ms a command, so two in each, then the last alone
    assert worker.stats.transactions == 3 and worker.stats.records == 5


def test_a_second_copy_after_a_commit_of_the_same_step_is_a_duplicate_not_a_second_run() -> None:
    world = World(policy(batch=1, transaction_max_commands=100, transaction_max_ms=100))

    def slow(command: Command, ctx: Context) -> str | None:
        world.clock.advance(0.06)
        return None

    handler = Scripted(slow, world.clock)
    worker = world.worker(handler)
    world.send(*(world.command(c) for c in ("cmd_x", "cmd_y", "cmd_z", "cmd_x")))
    worker.step()  # [cmd_x, cmd_y] commit at the time bound, then [cmd_z, cmd_x], one poll
    assert worker.stats.transactions == 2
    assert handler.attempts_of("cmd_x") == [1] and worker.stats.outcomes["duplicate"] == 1


def test_an_abort_of_a_transaction_of_several_chunks_rewinds_them_all_nothing_lost_or_doubled() -> (
    None
):
    world = World(policy(batch=2, retries=1))
    handler = Scripted(fail_for("cmd_f1", "cmd_f2"), world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    ok = [f"cmd_ok{i}" for i in range(4)]
    world.send(*(world.command(c) for c in [ok[0], "cmd_f1", ok[1]]), partition=0)
    world.send(*(world.command(c) for c in [ok[2], "cmd_f2", ok[3]]), partition=1)
    fail = iter([True])
    output.fail_commit = lambda: next(fail, False)
    worker.step()  # three chunks over both partitions in one transaction: aborted
    assert worker.stats.transaction_failures == 1 and worker.stats.transactions == 0
    settle(world, worker)

    for c in ok:  # completed before the loss: recorded done, not run again
        assert handler.attempts_of(c) == [1]
    for c in ("cmd_f1", "cmd_f2"):  # its first attempt ran again; one retry, one dead letter
        assert handler.attempts_of(c) == [1, 1, 2]
    assert lettered(world) == ["cmd_f1", "cmd_f2"]
    assert worker.stats.outcomes["duplicate"] == 4 and worker.stats.outcomes["retried"] == 2
    for p in (0, 1):
        assert committed(world, TP(world.policy.queue_topic, p)) == 3
    assert worker.waiting() == 0 and worker.paused() == set()


def test_an_abort_of_a_shared_transaction_reads_its_due_retries_again_each_once() -> None:
    # The retries of three commands come due beside a new command: all four in one transaction
    # of two chunks, which aborts. Each retry runs again at the same attempt, none is lost.
    world = World(policy(batch=3))
    handler = Scripted(fail_for("cmd_a", "cmd_b", "cmd_c"), world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    world.send(*(world.command(c) for c in ("cmd_a", "cmd_b", "cmd_c")))
    worker.step()
    worker.step()
    assert worker.waiting() == 3
    world.send(world.command("cmd_q"))
    world.clock.advance(30)
    fail = iter([True])
    output.fail_commit = lambda: next(fail, False)
    worker.step()  # chunks [cmd_q, retry a, retry b] and [retry c], one transaction: aborted
    world.run_for(worker, 300)

    assert worker.stats.transaction_failures == 1
    for command_id in ("cmd_a", "cmd_b", "cmd_c"):
        assert handler.attempts_of(command_id) == [1, 2, 2, 3, 4]
    assert handler.attempts_of("cmd_q") == [1]
    assert lettered(world) == ["cmd_a", "cmd_b", "cmd_c"]
    assert worker.waiting() == 0 and worker.paused() == set()


@pytest.mark.parametrize("failing", [None, "at the revoke", "after the revoke"])
def test_a_revoke_inside_an_open_transaction_commits_it_or_hands_its_records_over(
    failing: str | None,
) -> None:
    # The revoke of partition 1 comes in the step's second poll, with the first chunks settled
    # and not committed: they commit there, before the partition goes, and what comes after
    # (cmd_n, sent meanwhile) is a transaction of its own. If the commit at the revoke fails,
    # the next owner reads partition 1 again and this worker reads partition 0 again.
    world = World(policy(batch=2, retries=1))
    gone = TP(world.policy.queue_topic, 1)
    revoked: list[bool] = []

    def behaviour(command: Command, ctx: Context) -> str | None:
        if not revoked:
            revoked.append(True)
            transport = a.transport
            assert isinstance(transport, MemoryTransport)
            transport.revoke([gone])  # runs in the next poll
            world.send(world.command("cmd_n"))  # which brings this too
        return fail_for("cmd_f0", "cmd_f1")(command, ctx)

    handler = Scripted(behaviour, world.clock)
    a = world.worker(handler)
    b = world.worker(handler, auto_assign=False)
    output = a.output
    assert isinstance(output, MemoryOutput)
    world.send(*(world.command(f"cmd_{i}") for i in range(3)), world.command("cmd_f0"))
    world.send(
        *(world.command(f"cmd_x{i}") for i in range(3)), world.command("cmd_f1"), partition=1
    )
    commits = iter([failing == "at the revoke", failing == "after the revoke"])
    output.fail_commit = lambda: next(commits, False)
    a.step()  # one poll brings all eight (four chunks); the revoke comes in the next one
    assert revoked and a.stats.transaction_failures == int(failing is not None)
    if failing == "at the revoke":
        assert committed(world, gone) is None
    else:  # all eight went in the transaction committed at the revoke
        assert committed(world, gone) == 4
        assert a.stats.transactions == 1 + (failing is None) and a.stats.records >= 8
    b_transport = b.transport
    assert isinstance(b_transport, MemoryTransport)
    b_transport.assign([gone])
    settle(world, a, b)

    completing = [f"cmd_{i}" for i in range(3)] + [f"cmd_x{i}" for i in range(3)] + ["cmd_n"]
    for c in completing:  # recorded done before the transaction: never run twice
        assert handler.attempts_of(c) == [1]
    expected = [1, 1, 2] if failing == "at the revoke" else [1, 2]
    for c in ("cmd_f0", "cmd_f1"):
        assert handler.attempts_of(c) == expected
    assert lettered(world) == ["cmd_f0", "cmd_f1"]
    assert committed(world, TP(world.policy.queue_topic, 0)) == 5
    assert committed(world, gone) == 4
