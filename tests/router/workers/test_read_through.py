"""The worker's committed offsets past transaction markers, on the in-memory log: a partition
whose records are all settled and none waits in a buffer commits the consumer's position, past
the markers the producers' transactions end with, so a caught-up group reads lag 0; a retry
waiting for its due time keeps the committed offset at it."""

from __future__ import annotations

from consumers.runtime.memory_transport import MemoryOutput
from consumers.runtime.types import TP
from router.workers.worker import Worker
from streams.envelopes import Command
from tests.support.worker_harness import Scripted, World, fail_for, policy


def send_in_transaction(world: World, partition: int, *commands: Command) -> None:
    """Commands as the causal router sends them: one transaction, its marker after them."""
    world.send(*commands, partition=partition)
    world.log.unreadable(world.policy.queue_topic, partition)


def committed(world: World) -> dict[TP, int]:
    return {tp: c.offset for tp, c in world.log.offsets.get("group", {}).items()}


def read_partitions(world: World) -> list[TP]:
    """The partitions of the worker's topics that hold records."""
    return [
        tp
        for topic in (world.policy.queue_topic, world.policy.retry_topic)
        for p in range(world.log.partitions[topic])
        if world.log.read(tp := TP(topic, p), 0, 1)
    ]


def last_record(world: World, tp: TP) -> int:
    return max(r.offset for r in world.log.read(tp, 0, world.log.end(tp)))


def test_a_caught_up_worker_commits_past_the_markers_of_its_queue_and_retry_topic() -> None:
    world = World(policy(retries=1))
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    worker = world.worker(handler)
    send_in_transaction(world, 0, world.command("cmd_a"), world.command("cmd_bad"))
    send_in_transaction(world, 1, world.command("cmd_b"))
    send_in_transaction(world, 1, world.command("cmd_c"))
    world.run_for(worker, 100)

    assert handler.attempts_of("cmd_bad") == [1, 2]  # the retry ran: the retry topic was read
    assert [len(handler.attempts_of(c)) for c in ("cmd_a", "cmd_b", "cmd_c")] == [1, 1, 1]
    tps = read_partitions(world)
    assert {tp.topic for tp in tps} == {world.policy.queue_topic, world.policy.retry_topic}
    for tp in tps:
        end = world.log.end(tp)
        # Markers behind the last record: the old rule (last record + 1) would show lag 1.
        assert end > last_record(world, tp) + 1, tp
        assert committed(world)[tp] == end, tp


def test_a_retry_waiting_for_its_due_time_keeps_the_committed_offset_at_it() -> None:
    world = World(policy(retries=1, retry_delay_s=30))
    handler = Scripted(fail_for("cmd_bad"), world.clock)
    worker = world.worker(handler)
    send_in_transaction(world, 0, world.command("cmd_bad"))
    world.run_for(worker, 10)
    [retry] = world.log.all(world.policy.retry_topic)
    assert worker.waiting() == 1
    # The worker read the retry partition past the record and its marker; the record waits.
    assert committed(world).get(retry.tp, 0) <= retry.offset
    assert world.log.end(retry.tp) == retry.offset + 2
    world.run_for(worker, 40)
    assert handler.attempts_of("cmd_bad") == [1, 2] and worker.waiting() == 0
    assert committed(world)[retry.tp] == world.log.end(retry.tp)


def test_a_partition_read_in_several_batches_commits_past_its_marker_with_the_last() -> None:
    world = World(policy(batch=2, transaction_max_commands=2))  # one batch a step
    handler = Scripted(fail_for(), world.clock)
    worker = world.worker(handler)
    commands = [world.command(f"cmd_{i}") for i in range(5)]
    send_in_transaction(world, 0, *commands)
    tp = TP(world.policy.queue_topic, 0)
    seen = []
    for _ in range(4):
        worker.step()
        seen.append(committed(world)[tp])
    # Batches of two: 0-1, 2-3 (full: each stops after its last record), then 4, read on to
    # the end: past its marker. Nothing more after that.
    assert seen == [2, 4, 6, 6] and world.log.end(tp) == 6, seen
    assert [len(handler.attempts_of(c.command_id)) for c in commands] == [1] * 5


def test_an_aborted_chunk_is_read_again_and_its_partition_then_commits_past_the_marker() -> None:
    world = World(policy())
    handler = Scripted(fail_for(), world.clock)
    worker = world.worker(handler)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    fails = [True]
    output.fail_commit = lambda: bool(fails) and fails.pop()
    send_in_transaction(world, 0, world.command("cmd_x"), world.command("cmd_y"))
    tp = TP(world.policy.queue_topic, 0)
    worker.step()
    assert committed(world).get(tp) is None  # nothing committed: read again from the start
    world.run_for(worker, 5)
    assert committed(world)[tp] == world.log.end(tp) == 3
    assert handler.attempts_of("cmd_x") == [1]  # read again, found done in the ledger


def test_an_idle_worker_commits_the_markers_it_reads_after_its_last_batch_once() -> None:
    world = World(policy(batch=1, transaction_max_commands=1))  # one batch a step
    handler = Scripted(fail_for(), world.clock)
    worker: Worker = world.worker(handler)
    send_in_transaction(world, 0, world.command("cmd_1"))
    tp = TP(world.policy.queue_topic, 0)
    worker.step()  # a full batch of one: its position stops before the marker
    assert committed(world)[tp] == 1
    worker.step()  # reads the marker, finds the end: one transaction of offsets only
    assert committed(world)[tp] == 2 == world.log.end(tp)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    commits = output.commits
    worker.step()
    assert output.commits == commits, "committed again with nothing new"
    assert handler.attempts_of("cmd_1") == [1]
