"""Your code as a handler, on the in-memory log: each outcome (done, Retry with and without a
delay and across tiers, Fail, MoreWork, no handler, async), and how a handler is found and
refused (router.workers.handlers; the public names come from ``rhumbatron``)."""

from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.runtime.memory_transport import MemoryOutput
from rhumbatron import Command, Context, Fail, Handlers, MoreWork, QueueHandler, Retry, testing
from router.settings import Settings
from router.wiring.workers import worker_policy
from router.workers.handlers import as_handler, load_handler
from router.workers.outgoing import follow_up_records
from streams.envelopes import decode_command, encode
from streams.errors import ConfigurationError, HandlersAbandoned, TopologyError
from streams.headers import (
    ATTEMPTS,
    DEAD_LETTER_REASON,
    ERROR,
    ERROR_TYPE,
    OPERATOR_RETRY,
    header_dict,
)
from streams.topology import QUEUE_PURPOSES, queue_name
from tests.support.waiting import wait_until
from tests.support.worker_harness import ENV, MAX, World, policy


class Crash(BaseException):
    """A worker process dying at a fail-point."""


TIERS = (60, 600, 3600)


def _world(**overrides: object) -> World:
    values: dict[str, object] = {"retry_tiers_s": TIERS, "max_retry_delay_s": 3600.0}
    values.update(overrides)
    return World(policy(**values))  # type: ignore[arg-type]


class Runs:
    """A handler function's runs: (command id, attempt, clock time)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: list[tuple[str, int, float]] = []

    def note(self, command: Command, ctx: Context) -> None:
        self.seen.append((command.command_id, ctx.attempt, self.world.clock.monotonic()))

    def of(self, command_id: str) -> list[tuple[int, float]]:
        return [(a, t) for c, a, t in self.seen if c == command_id]


def test_a_function_that_returns_is_done_once() -> None:
    world = _world()
    runs = Runs(world)
    worker = world.worker(as_handler(runs.note, "tests:note"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"), world.command("cmd_c2"))
    world.run_for(worker, 3)
    assert [c for c, _, _ in runs.seen] == ["cmd_c1", "cmd_c2"]
    assert worker.stats.outcomes["ok"] == 2
    world.send(world.command("cmd_c1"))  # sent again after it completed: a duplicate
    world.run_for(worker, 3)
    assert len(runs.of("cmd_c1")) == 1


def test_an_async_handler_is_awaited() -> None:
    world = _world()
    done: list[str] = []

    async def handler(command: Command, ctx: Context) -> None:
        done.append(command.command_id)

    worker = world.worker(as_handler(handler, "tests:handler"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 2)
    assert done == ["cmd_c1"] and worker.stats.outcomes["ok"] == 1


def test_retry_without_a_delay_waits_the_queues_own_delay() -> None:
    world = _world(retry_delay_s=30.0)
    runs = Runs(world)

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        if ctx.attempt == 1:
            raise Retry(reason="not yet")

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 40)
    (a1, t1), (a2, t2) = runs.of("cmd_c1")
    assert (a1, a2) == (1, 2)
    assert 30 <= t2 - t1 < 32


def test_a_retry_delay_is_rounded_up_to_its_tier_and_a_long_one_never_holds_back_a_short_one() -> (
    None
):
    world = _world(retry_delay_s=1.0)
    runs = Runs(world)
    asked = {"cmd_long": 3000.0, "cmd_short": 1.0, "cmd_mid": 61.0}

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        if ctx.attempt == 1:
            raise Retry(delay_s=asked[command.command_id])

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    # The 1-hour retry is written first, on the same partition as the others.
    world.send(world.command("cmd_long"), world.command("cmd_short"), world.command("cmd_mid"))
    world.run_for(worker, 700)
    assert [a for a, _ in runs.of("cmd_short")] == [1, 2]
    assert [a for a, _ in runs.of("cmd_mid")] == [1, 2]
    assert [a for a, _ in runs.of("cmd_long")] == [1]  # still waiting its tier
    (_, s1), (_, s2) = runs.of("cmd_short")
    (_, m1), (_, m2) = runs.of("cmd_mid")
    assert 1 <= s2 - s1 < 3  # the queue's own delay, not behind the hour
    assert 600 <= m2 - m1 < 602  # 61 s rounds up to the 600 s tier
    world.run_for(worker, 3000)
    (_, l1), (_, l2) = runs.of("cmd_long")
    assert 3600 <= l2 - l1 < 3602
    tiers = {t for t in world.policy.retry_topics if world.log.all(t)}
    assert tiers == {
        "rhumbatron-agent-wakeups-retry-unit",
        "rhumbatron-agent-wakeups-retry-600s-unit",
        "rhumbatron-agent-wakeups-retry-3600s-unit",
    }


@pytest.mark.parametrize(
    ("asked", "cap", "deadline_s", "expected"),
    [
        (None, 3600.0, None, 30.0),  # the queue's own delay
        (0.0, 3600.0, None, 30.0),  # the queue's own delay is the lowest tier
        (45.0, 3600.0, None, 60.0),
        (60.0, 3600.0, None, 60.0),
        (5000.0, 3600.0, None, 3600.0),  # beyond every tier: the longest
        (5000.0, 600.0, None, 600.0),  # capped by max_retry_delay_s
        (3000.0, 3600.0, 700.0, 600.0),  # capped by the time left before the deadline
        (3000.0, 3600.0, 10.0, 30.0),  # no tier fits before the deadline: the queue's own
    ],
)
def test_the_tier_a_retry_waits_on(
    asked: float | None, cap: float, deadline_s: float | None, expected: float
) -> None:
    p = policy(retry_delay_s=30.0, retry_tiers_s=TIERS, max_retry_delay_s=cap)
    topic, wait_s = p.retry_wait(asked, deadline_s)
    assert wait_s == expected
    assert topic in p.retry_topics


def test_fail_dead_letters_at_once_with_its_reason() -> None:
    world = _world(retries=3)
    runs = Runs(world)

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        raise Fail("customer deleted")

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 100)
    assert [a for a, _ in runs.of("cmd_c1")] == [1]
    (letter,) = world.dead_letters()
    headers = header_dict(letter.headers)
    assert headers[ERROR] == b"customer deleted"
    assert headers[ERROR_TYPE] == b"Fail"
    assert headers[ATTEMPTS] == b"1"
    assert headers[DEAD_LETTER_REASON] == b"failed"
    assert worker.stats.outcomes["dead_lettered"] == 1


def test_fail_on_a_queue_without_a_dead_letter_queue_goes_to_on_exhausted() -> None:
    world = _world(purpose="indexing", dead_letter=None)
    exhausted: list[tuple[str, str]] = []

    class Indexer(QueueHandler):
        def handle(self, command: Command, ctx: Context) -> str | None:
            raise Fail("no such index")

        def on_exhausted(self, command: Command, ctx: Context, error: BaseException) -> bool:
            exhausted.append((command.command_id, str(error)))
            return True

    worker = world.worker(Indexer())
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 5)
    assert exhausted == [("cmd_c1", "no such index")]
    assert worker.stats.outcomes["exhausted_recorded"] == 1


def test_retry_on_the_last_attempt_dead_letters() -> None:
    world = _world(retries=1, retry_delay_s=1.0)

    def handler(command: Command, ctx: Context) -> None:
        raise Retry(delay_s=1, reason=f"try {ctx.attempt} of {ctx.max_attempts}")

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 10)
    (letter,) = world.dead_letters()
    assert header_dict(letter.headers)[ERROR] == b"try 2 of 2"


def test_more_work_asks_for_another_delivery() -> None:
    world = _world()
    runs = Runs(world)

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        if ctx.attempt < 3:
            raise MoreWork()

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 5)
    assert [a for a, _ in runs.of("cmd_c1")] == [1, 2, 3]
    assert worker.stats.outcomes["ok"] == 1


def test_handlers_serve_their_types_and_fail_a_type_with_none() -> None:
    world = _world()
    handlers = Handlers()
    woken: list[str] = []

    @handlers.command("agent.wake")
    def wake(command: Command, ctx: Context) -> None:
        woken.append(command.command_id)

    worker = world.worker(handlers)
    other = world.command("cmd_c2").model_copy(update={"command_type": "index.build"})
    world.send(world.command("cmd_c1"), other)
    world.run_for(worker, 5)
    assert woken == ["cmd_c1"]
    (letter,) = world.dead_letters()
    assert (header_dict(letter.headers)[ERROR] or b"").startswith(b"no_handler: index.build")
    with pytest.raises(ValueError, match="has a handler already"):
        handlers.command("agent.wake")(wake)


def test_the_context_says_where_the_command_stands() -> None:
    world = _world(retries=2)
    seen: list[Context] = []

    def handler(command: Command, ctx: Context) -> None:
        seen.append(ctx)

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1", deadline_s=90))
    world.run_for(worker, 2)
    (ctx,) = seen
    assert (ctx.command_id, ctx.queue, ctx.attempt, ctx.max_attempts) == (
        "cmd_c1",
        "agent-wakeups",
        1,
        3,
    )
    assert ctx.remaining_s is not None and 85 <= ctx.remaining_s <= 90


# -- finding a handler -----------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "teamhandlers"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "good.py").write_text(
        textwrap.dedent(
            """
            from rhumbatron import Handlers, QueueHandler

            handlers = Handlers()

            def plain(command, ctx):
                return None

            def wrong_shape(command):
                return None

            class Klass(QueueHandler):
                def handle(self, command, ctx):
                    return None

            class NeedsArgs(QueueHandler):
                def __init__(self, url):
                    self.url = url

            class NotAHandler:
                pass

            NUMBER = 42
            """
        )
    )
    (root / "broken.py").write_text("raise RuntimeError('cannot start without CONFIG')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "teamhandlers"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("teamhandlers")]:
            del sys.modules[name]


@pytest.mark.parametrize("attr", ["handlers", "plain", "Klass"])
def test_a_handler_is_loaded_by_its_path(package: str, attr: str) -> None:
    handler = load_handler(f"{package}.good:{attr}")
    assert callable(handler.handle)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("teamhandlers.missing:x", "cannot import 'teamhandlers.missing': ModuleNotFoundError"),
        ("teamhandlers.broken:x", "RuntimeError: cannot start without CONFIG"),
        ("teamhandlers.good:absent", "has no attribute 'absent'"),
        ("teamhandlers.good:NUMBER", "int 42 is not a handler"),
        ("teamhandlers.good:NotAHandler", "is no QueueHandler subclass"),
        ("teamhandlers.good:NeedsArgs", "takes arguments"),
        ("teamhandlers.good:wrong_shape", "cannot be called as handler(command, ctx)"),
        ("teamhandlers.good:", "not of the form package.module:attr"),
        ("no-such-name", "no handler of that name is installed"),
        ("  ", "name a package.module:attr"),
    ],
)
def test_a_wrong_handler_is_one_error_naming_the_path(package: str, spec: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_handler(spec)
    message = str(caught.value)
    assert says in message
    assert "\n" not in message
    assert spec.strip() in message


def test_the_built_in_drills_are_found_by_their_entry_points() -> None:
    for name in ("ok", "drill", "flaky"):
        assert load_handler(name).name == name


# -- follow-up commands (ctx.send) ---------------------------------------------------------------


def _follow_ups(world: World) -> list[Command]:
    topic = queue_name("integration", ENV)
    return [decode_command(r.value, max_bytes=MAX) for r in world.log.all(topic)]


def _sending(world: World) -> World:
    world.log.create(queue_name("integration", ENV), 1)
    return world


def sender(command: Command, ctx: Context) -> None:
    if command.payload.get("fail_first") and ctx.attempt == 1:
        ctx.send(command.model_copy(update={"command_type": "change.dispatch"}))
        raise Retry(reason="not yet")  # what it sent is dropped with the failed attempt
    for n in range(2):
        ctx.send(command.model_copy(update={"command_type": "change.dispatch", "task_id": f"t{n}"}))


def test_follow_ups_go_out_with_the_completion_under_derived_ids() -> None:
    world = _sending(_world(retry_delay_s=1.0))
    worker = world.worker(as_handler(sender, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"), world.command("cmd_c2", fail_first=True))
    world.run_for(worker, 5)
    sent = _follow_ups(world)
    assert sorted(c.command_id for c in sent) == [
        "cmd_c1.a1.f0",
        "cmd_c1.a1.f1",
        "cmd_c2.a2.f0",
        "cmd_c2.a2.f1",
    ]
    assert {c.command_type for c in sent} == {"change.dispatch"}
    assert {c.task_id for c in sent} == {"t0", "t1"}


@pytest.mark.parametrize("point", ["worker.before_transaction_commit", "abort"])
def test_follow_ups_lost_with_their_transaction_are_sent_again_once(point: str) -> None:
    world = _sending(_world())
    crashed: list[str] = []

    def failpoint(name: str) -> None:
        if name == point and not crashed:
            crashed.append(name)
            raise Crash(name)

    first = world.worker(as_handler(sender, "h"))  # type: ignore[arg-type]
    if point == "abort":
        output = first.output
        assert isinstance(output, MemoryOutput)
        fail = iter([True])
        output.fail_commit = lambda: next(fail, False)
        world.send(world.command("cmd_c1"))
        world.run_for(first, 3)
    else:
        first.failpoint = failpoint
        world.send(world.command("cmd_c1"))
        with pytest.raises(Crash):
            first.step()
        # The process is gone; the next one reads the command again and finds it done.
        world.run_for(world.worker(as_handler(sender, "h")), 3)  # type: ignore[arg-type]
    assert sorted(c.command_id for c in _follow_ups(world)) == ["cmd_c1.a1.f0", "cmd_c1.a1.f1"]


def test_a_follow_up_of_a_type_with_no_queue_is_a_failed_attempt_naming_it() -> None:
    world = _sending(_world(retries=0))

    def handler(command: Command, ctx: Context) -> None:
        ctx.send(command.model_copy(update={"command_type": "mystery.do"}))

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 3)
    (letter,) = world.dead_letters()
    assert b"'mystery.do' has no queue in the catalog" in (
        header_dict(letter.headers)[ERROR] or b""
    )
    assert _follow_ups(world) == []


def test_ctx_send_takes_the_settings_queues_and_refuses_any_other_naming_them() -> None:
    s = Settings(env=ENV, queues={"payments": {"retries": 5}})
    payments = worker_policy(s, "payments")
    assert payments.queues == s.topology.queues
    assert (payments.queue_topic, payments.attempts) == (f"rhumbatron-payments-{ENV}", 6)
    cmd = testing.command("change.dispatch")
    ctx = testing.context(cmd, queue="integration", queues=payments.queues)
    sent = ctx.send(cmd, queue="payments")
    assert ctx.sent == [("payments", sent)]
    assert [r.topic for r in follow_up_records(payments, ctx.sent)] == [
        f"rhumbatron-payments-{ENV}"
    ]
    with pytest.raises(ValueError) as refused:
        ctx.send(cmd, queue="paymnts")
    assert str(refused.value).startswith("ctx.send: unknown queue 'paymnts'; known: agent-wakeups")
    assert "dead-letter, payments (a queue of your own is [queues.<name>]" in str(refused.value)
    # A context knows the built-in queues alone unless it is given the settings'.
    with pytest.raises(ValueError, match="ctx.send: unknown queue 'payments'"):
        testing.context(cmd, queue="integration").send(cmd, queue="payments")
    assert testing.context(cmd, queue="payments").send(cmd, queue="payments")


def test_a_policy_refuses_a_queue_or_dead_letter_not_among_its_queues() -> None:
    queues = (*QUEUE_PURPOSES, "payments")
    assert policy("payments", queues=queues).queue_topic == f"rhumbatron-payments-{ENV}"
    assert policy("integration", dead_letter="payments", queues=queues).dead_letter_topic == (
        f"rhumbatron-payments-{ENV}"
    )
    with pytest.raises(TopologyError, match="unknown queue purpose 'payments'; known: agent-"):
        policy("payments")
    with pytest.raises(TopologyError, match="unknown queue purpose 'refunds'"):
        policy("payments", dead_letter="refunds", queues=queues)
    with pytest.raises(TopologyError, match="queue name 'payments-retry' is not allowed"):
        policy("payments-retry", queues=(*queues, "payments-retry"))


# -- handler_timeout_s -----------------------------------------------------------------------------


def test_a_handler_past_its_timeout_is_a_failed_attempt_and_its_late_sends_are_refused() -> None:
    world = _sending(_world(retries=1, retry_delay_s=1.0, handler_timeout_s=0.2))
    release = threading.Event()
    late: list[BaseException] = []

    def handler(command: Command, ctx: Context) -> None:
        if ctx.attempt == 1:
            release.wait(30)
            try:
                ctx.send(command.model_copy(update={"command_type": "change.dispatch"}))
            except RuntimeError as exc:
                late.append(exc)

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    worker.step()
    assert worker.stats.outcomes["retried"] == 1 and worker.abandoned() == 1
    release.set()
    wait_until(lambda: worker.abandoned() == 0, 10, "the abandoned run ended")
    assert "ran past the queue's handler_timeout_s" in str(late[0])
    world.run_for(worker, 3)  # the retry, done at once
    assert worker.stats.outcomes["ok"] == 1
    assert _follow_ups(world) == []
    (retry,) = world.log.all(world.policy.retry_topic)
    assert header_dict(retry.headers)[ERROR_TYPE] == b"HandlerTimeout"


def test_a_worker_with_too_many_abandoned_handlers_stops() -> None:
    world = _world(handler_timeout_s=0.1, max_abandoned_handlers=2, batch=1)
    release = threading.Event()

    def handler(command: Command, ctx: Context) -> None:
        release.wait(30)

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"), world.command("cmd_c2"), world.command("cmd_c3"))
    try:
        with pytest.raises(HandlersAbandoned, match="max_abandoned_handlers=2"):
            for _ in range(5):
                worker.step()
    finally:
        release.set()


def test_a_handler_timeout_at_or_past_the_poll_interval_is_refused() -> None:
    queues = Settings().queues
    queues["integration"] = queues["integration"].model_copy(update={"handler_timeout_s": 300.0})
    with pytest.raises(ValueError, match="HANDLER_TIMEOUT_S=300 is not below"):
        Settings(queues=queues, max_poll_interval_ms=300_000)


# -- one retry chain per command -------------------------------------------------------------------


def test_a_copy_sent_again_while_its_first_retries_is_a_duplicate() -> None:
    world = _world(retries=2, retry_delay_s=10.0)
    runs = Runs(world)

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        if ctx.attempt < 3:
            raise Retry()

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 2)
    world.send(world.command("cmd_c1"))  # the sender sent it again: a second copy
    world.run_for(worker, 40)
    assert [a for a, _ in runs.of("cmd_c1")] == [1, 2, 3]
    assert worker.stats.outcomes["duplicate"] == 1 and worker.stats.outcomes["retried"] == 2
    world.send(world.command("cmd_c1"))  # after it completed: the done mark says so
    world.run_for(worker, 3)
    assert [a for a, _ in runs.of("cmd_c1")] == [1, 2, 3]


def test_after_a_dead_letter_only_an_operators_retry_runs_the_command_again() -> None:
    world = _world(retries=1, retry_delay_s=1.0)
    runs = Runs(world)

    def handler(command: Command, ctx: Context) -> None:
        runs.note(command, ctx)
        raise RuntimeError("down")

    worker = world.worker(as_handler(handler, "h"))  # type: ignore[arg-type]
    world.send(world.command("cmd_c1"))
    world.run_for(worker, 5)
    assert len(world.dead_letters()) == 1 and len(runs.of("cmd_c1")) == 2
    world.send(world.command("cmd_c1"))  # a late re-send: not a new chain
    world.run_for(worker, 5)
    assert len(runs.of("cmd_c1")) == 2
    command = world.command("cmd_c1")
    world.log.append(
        world.policy.queue_topic,
        0,
        encode(command, max_bytes=MAX),
        command.project_id.encode(),
        headers=((OPERATOR_RETRY, b"letter-1"),),
    )
    world.run_for(worker, 5)
    assert [a for a, _ in runs.of("cmd_c1")] == [1, 2, 1, 2]
    assert len(world.dead_letters()) == 2
