"""Ordered queues (``ordered = true``) on the in-memory log: each project's commands run in
arrival order; a failed attempt, or a request for more work, waits in the worker rather than on
a retry topic, and holds its project's later commands back while other projects go on; a held
project's backlog, and the projects held, are bounded (the partition pauses); what is held rides
in the group's offset metadata, so a worker that takes the partition over (a rebalance, a
crash) goes on at the same attempt, in order. Generated workloads, with crashes, aborts and
moves, are in test_adversarial.py."""

from __future__ import annotations

import logging

import pytest

from consumers.runtime.memory_transport import MemoryOutput
from consumers.runtime.transport import Committed
from consumers.runtime.types import TP
from rhumbatron import Command, Context, MoreWork, Retry
from router.workers.handlers import as_handler
from router.workers.worker import Worker
from streams.envelopes import decode_command
from streams.topology import queue_name
from tests.support.worker_harness import ENV, MAX, World, policy


class Crash(BaseException):
    """A worker process dying at a fail-point."""


def _world(**overrides: object) -> World:
    values: dict[str, object] = {"ordered": True, "retry_delay_s": 30.0, "retries": 3}
    values.update(overrides)
    return World(policy(**values))  # type: ignore[arg-type]


class Runs:
    """Every run: (command id, attempt, redelivered, clock time)."""

    def __init__(self, world: World, fails: dict[str, int] | None = None) -> None:
        self.world = world
        self.fails = fails or {}  # command id -> its attempts that fail, from the first
        self.seen: list[tuple[str, int, bool, float]] = []

    def __call__(self, command: Command, ctx: Context) -> None:
        self.seen.append(
            (command.command_id, ctx.attempt, ctx.redelivered, self.world.clock.monotonic())
        )
        if ctx.attempt <= self.fails.get(command.command_id, 0):
            raise RuntimeError(f"{command.command_id} fails attempt {ctx.attempt}")

    def order(self) -> list[tuple[str, int]]:
        return [(c, a) for c, a, _, _ in self.seen]

    def of(self, command_id: str) -> list[tuple[int, float]]:
        return [(a, t) for c, a, _, t in self.seen if c == command_id]


def _worker(world: World, runs: object) -> Worker:
    return world.worker(as_handler(runs, "tests:runs"))  # type: ignore[arg-type]


def _queue(world: World) -> TP:
    return TP(world.policy.queue_topic, 0)


def test_a_failed_attempt_waits_in_the_worker_and_holds_back_its_project_only() -> None:
    world = _world()
    runs = Runs(world, {"cmd_a1": 1})
    worker = _worker(world, runs)
    world.send(
        world.command("cmd_a1", project="pa"),
        world.command("cmd_b1", project="pb"),
        world.command("cmd_a2", project="pa"),
        world.command("cmd_b2", project="pb"),
    )
    world.run_for(worker, 5)
    # pa's second command waits behind its first; pb goes on.
    assert runs.order() == [("cmd_a1", 1), ("cmd_b1", 1), ("cmd_b2", 1)]
    assert worker.waiting() == 2  # cmd_a1 (attempt 2 due) and cmd_a2 behind it
    world.run_for(worker, 40)
    assert runs.order()[3:] == [("cmd_a1", 2), ("cmd_a2", 1)]
    (_, failed_at), (_, retried_at) = runs.of("cmd_a1")
    assert retried_at - failed_at >= 30  # the queue's own delay
    assert world.log.all(world.policy.retry_topic) == []  # nothing went to a retry topic
    assert worker.waiting() == 0 and worker.stats.outcomes["ok"] == 4
    assert world.log.offsets["group"][_queue(world)].metadata == ""  # nothing held any more


def test_retry_with_a_delay_waits_that_long_within_max_retry_delay() -> None:
    world = _world(max_retry_delay_s=100.0)
    seen: list[tuple[str, int, float]] = []
    asked = {"cmd_short": 5.0, "cmd_long": 3600.0}

    def handler(command: Command, ctx: Context) -> None:
        seen.append((command.command_id, ctx.attempt, world.clock.monotonic()))
        if ctx.attempt == 1:
            raise Retry(delay_s=asked[command.command_id])

    worker = _worker(world, handler)
    world.send(world.command("cmd_short", project="p1"), world.command("cmd_long", project="p2"))
    world.run_for(worker, 120)
    times = {(c, a): t for c, a, t in seen}
    assert 5 <= times[("cmd_short", 2)] - times[("cmd_short", 1)] < 7
    # Capped at max_retry_delay_s (no tier rounds it up: no topic holds it).
    assert 100 <= times[("cmd_long", 2)] - times[("cmd_long", 1)] < 102


def test_more_work_is_delivered_again_in_place_before_the_projects_next_command() -> None:
    world = _world()
    runs: list[tuple[str, int, bool]] = []

    def handler(command: Command, ctx: Context) -> None:
        runs.append((command.command_id, ctx.attempt, ctx.redelivered))
        if command.command_id == "cmd_1" and ctx.attempt < 3:
            raise MoreWork()

    worker = _worker(world, handler)
    world.send(world.command("cmd_1"), world.command("cmd_2"))
    world.run_for(worker, 5)
    assert runs == [
        ("cmd_1", 1, False),
        ("cmd_1", 2, True),
        ("cmd_1", 3, True),
        ("cmd_2", 1, False),
    ]
    assert world.log.all(world.policy.queue_topic)[2:] == []  # no further delivery record


def test_the_last_attempt_dead_letters_and_lets_the_project_go_on() -> None:
    world = _world(retries=1, retry_delay_s=10.0)
    runs = Runs(world, {"cmd_1": 9})
    worker = _worker(world, runs)
    world.send(world.command("cmd_1"), world.command("cmd_2"))
    world.run_for(worker, 15)
    assert runs.order() == [("cmd_1", 1), ("cmd_1", 2), ("cmd_2", 1)]
    (letter,) = world.dead_letters()
    assert decode_command(letter.value, max_bytes=MAX).command_id == "cmd_1"


def test_a_held_projects_backlog_past_its_bound_pauses_the_partition() -> None:
    world = _world(max_project_backlog=2, batch=1, transaction_max_commands=1)
    runs = Runs(world, {"cmd_0": 1})
    worker = _worker(world, runs)
    world.send(*(world.command(f"cmd_{n}") for n in range(6)), world.command("cmd_x", project="px"))
    world.run_for(worker, 10)
    # cmd_0 is held; two more are kept behind it, then the partition pauses: pb's command,
    # further on, waits too (the partition's commit cannot pass what was not read).
    assert runs.order() == [("cmd_0", 1)]
    assert _queue(world) in worker.paused()
    assert worker.waiting() == 3
    world.run_for(worker, 40)
    assert runs.order() == [
        ("cmd_0", 1),
        ("cmd_0", 2),
        *((f"cmd_{n}", 1) for n in range(1, 6)),
        ("cmd_x", 1),
    ]
    assert worker.paused() == set() and worker.waiting() == 0


def test_the_projects_held_at_once_are_bounded() -> None:
    world = _world(max_held_projects=2, batch=1, transaction_max_commands=1)
    runs = Runs(world, {"cmd_a": 1, "cmd_b": 1, "cmd_c": 1})
    worker = _worker(world, runs)
    world.send(*(world.command(f"cmd_{p}", project=f"p{p}") for p in "abcd"))
    world.run_for(worker, 10)
    assert runs.order() == [("cmd_a", 1), ("cmd_b", 1)]
    assert _queue(world) in worker.paused()
    world.run_for(worker, 80)
    assert sorted(runs.order()) == sorted(
        [*((f"cmd_{p}", a) for p in "abc" for a in (1, 2)), ("cmd_d", 1)]
    )


def _held_then_moved(world: World, runs: Runs) -> tuple[Worker, Worker]:
    """A worker holds pa (its first command failed, the second waits) when its partitions are
    revoked; another is assigned them."""
    first = world.worker(as_handler(runs, "h"), auto_assign=False)  # type: ignore[arg-type]
    tps = [TP(t, p) for t in (world.policy.queue_topic, *world.policy.retry_topics) for p in (0, 1)]
    first.transport.assign(tps)  # type: ignore[attr-defined]
    world.send(
        world.command("cmd_a1", project="pa"),
        world.command("cmd_b1", project="pb"),
        world.command("cmd_a2", project="pa"),
    )
    world.run_for(first, 3)
    assert runs.order() == [("cmd_a1", 1), ("cmd_b1", 1)]
    first.transport.revoke(tps)  # type: ignore[attr-defined]
    first.step()
    second = world.worker(as_handler(runs, "h"), auto_assign=False)  # type: ignore[arg-type]
    second.transport.assign(tps)  # type: ignore[attr-defined]
    return first, second


def test_a_project_waiting_when_its_partition_moves_goes_on_at_the_next_owner() -> None:
    world = _world()
    runs = Runs(world, {"cmd_a1": 1})
    _, second = _held_then_moved(world, runs)
    world.run_for(second, 10)
    assert runs.order() == [("cmd_a1", 1), ("cmd_b1", 1)]  # not due yet: still waiting
    world.run_for(second, 30)
    # Attempt 1 is not run again, pb's command is not either, pa's second waits for its first.
    assert runs.order() == [("cmd_a1", 1), ("cmd_b1", 1), ("cmd_a1", 2), ("cmd_a2", 1)]
    assert second.waiting() == 0


@pytest.mark.parametrize(
    "point", ["worker.before_transaction_commit", "worker.after_transaction_commit"]
)
def test_a_crash_around_the_commit_keeps_the_attempt_exact(point: str) -> None:
    world = _world()
    runs = Runs(world, {"cmd_1": 1})
    crashed: list[str] = []

    def failpoint(name: str) -> None:
        if name == point and not crashed:
            crashed.append(name)
            raise Crash(name)

    first = _worker(world, runs)
    first.failpoint = failpoint
    world.send(world.command("cmd_1"), world.command("cmd_2"))
    with pytest.raises(Crash):
        first.step()
    world.run_for(_worker(world, runs), 40)
    # Before the commit, attempt 1 was not counted: it runs again; after it, attempt 2 runs.
    again = [("cmd_1", 1)] if point == "worker.before_transaction_commit" else []
    assert runs.order() == [("cmd_1", 1), *again, ("cmd_1", 2), ("cmd_2", 1)]


def test_an_aborted_transaction_runs_the_held_command_again_at_the_same_attempt() -> None:
    world = _world()
    runs = Runs(world, {"cmd_1": 2})
    worker = _worker(world, runs)
    world.send(world.command("cmd_1"), world.command("cmd_2"))
    world.run_for(worker, 2)
    output = worker.output
    assert isinstance(output, MemoryOutput)
    fail = iter([True])
    output.fail_commit = lambda: next(fail, False)
    world.run_for(worker, 80)
    # Attempt 2's failure was aborted: attempt 2 runs again, then 3 completes.
    assert runs.order() == [("cmd_1", 1), ("cmd_1", 2), ("cmd_1", 2), ("cmd_1", 3), ("cmd_2", 1)]


def test_offset_metadata_that_is_not_ours_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = _world()
    runs = Runs(world)
    world.send(world.command("cmd_1"))
    world.log.offsets["group"] = {_queue(world): Committed(0, "someone else's")}
    with caplog.at_level(logging.WARNING, "rhumbatron.worker"):
        world.run_for(_worker(world, runs), 2)
    assert runs.order() == [("cmd_1", 1)]
    assert "offset metadata ignored" in caplog.text


def test_a_follow_up_goes_to_a_queue_of_the_settings() -> None:
    world = World(policy(queues=("agent-wakeups", "dead-letter", "payments")))
    world.log.create(queue_name("payments", ENV), 1)

    def handler(command: Command, ctx: Context) -> None:
        ctx.send(command.model_copy(update={"command_type": "payment.capture"}), queue="payments")

    world.send(world.command("cmd_1"))
    world.run_for(_worker(world, handler), 2)
    (sent,) = world.log.all(queue_name("payments", ENV))
    assert decode_command(sent.value, max_bytes=MAX).command_id == "cmd_1.a1.f0"
