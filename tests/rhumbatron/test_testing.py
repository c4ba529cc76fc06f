"""rhumbatron.testing, the harness for processor authors: ``run`` returns what a run left, and
``assert_exactly_once`` passes sound processors (the built-in ledger and projector, one with SQL
effects and a fold, one with an eventless caught-up call) and fails, naming a replay that shows
it, one whose effects depend on what it counted in memory or on the batch it came in."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import pytest

from consumers.runtime.harness.check import random_trials
from consumers.subscriptions.ledger import Ledger
from consumers.subscriptions.projector.processor import ProjectViewProjector
from rhumbatron import (
    Delivery,
    EffectKind,
    Effects,
    Event,
    OutRecord,
    Processor,
    RedisOp,
    Retry,
    SqlStatement,
)
from rhumbatron.testing import (
    EffectsDiverged,
    assert_exactly_once,
    command,
    context,
    event,
    handle,
    run,
)
from streams.workload import project_events, slotted_events

PROJECTS = ("alpha", "beta", "gamma")  # alpha and beta share a partition, gamma has its own


class Orders(Processor):
    """SQL effects and a fold: an insert per order, the project's running total."""

    slug: ClassVar[str] = "orders"
    consumes: ClassVar[frozenset[str] | None] = frozenset({"order.placed"})
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.SQL

    def reduce(self, state: dict[str, Any] | None, event: Event) -> dict[str, Any] | None:
        if event.payload.get("amount", 0) < 0:
            raise ValueError(f"order {event.event_id} has a negative amount")
        return {"total": (state or {"total": 0})["total"] + event.payload["amount"]}

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        assert state is not None
        insert = SqlStatement(
            "INSERT INTO orders (id, project, amount, total) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            (event.event_id, event.project_id, event.payload["amount"], state["total"]),
        )
        return Effects(sql=[insert])


class Reconciler(Processor):
    """Counts completions per project, and on the eventless caught-up call writes what the
    folds say."""

    slug: ClassVar[str] = "reconciler"
    consumes: ClassVar[frozenset[str] | None] = frozenset({"task.completed"})
    reducer_version: ClassVar[str] = "1"
    caught_up_call: ClassVar[bool] = True

    def reduce(self, state: dict[str, Any] | None, event: Event) -> dict[str, Any] | None:
        return {"n": (state or {"n": 0})["n"] + 1}

    def process(self, event: Event | None, state: Any, delivery: Delivery) -> Effects:
        if event is not None:
            return Effects(redis=[RedisOp("HINCRBY", "counts", (event.project_id, 1))])
        return Effects(redis=[RedisOp("HSET", "reconciled", (p, s["n"])) for p, s in state.items()])


class CountsItsCalls(Processor):
    """Not idempotent under a crash-retry: its effect numbers the calls it had, in memory."""

    slug: ClassVar[str] = "counts-its-calls"

    def __init__(self) -> None:
        self.calls = 0

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        self.calls += 1
        return Effects(redis=[RedisOp("HSET", "numbered", (event.event_id, self.calls))])


class CountsBatches(Processor):
    """Depends on the batch shape: one more batch counted per batch with records."""

    slug: ClassVar[str] = "counts-batches"
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        record_id = delivery.idempotency_key(event.event_id)
        return Effects(records=[OutRecord("orders", event.project_id, b"{}", record_id)])

    def finish_batch(
        self, records: list[OutRecord], ops: list[RedisOp], check_owner: Any
    ) -> list[OutRecord]:
        ops.append(RedisOp("INCRBY", "batches", (1,)))
        return records


def orders(*amounts: int, project: str = "alpha") -> list[Event]:
    return [
        event("order.placed", project, slot=n, payload={"amount": amount})
        for n, amount in enumerate(amounts, start=1)
    ]


def completions(per_project: int = 3) -> list[Event]:
    return [event("task.completed", p, slot=n) for n in range(1, per_project + 1) for p in PROJECTS]


def test_run_returns_the_effects_folds_dead_letters_and_cursors() -> None:
    log: list[Event | bytes] = [*orders(5, 7), b"\x00 not an event", *orders(11, project="gamma")]
    result = run(Orders, log)
    assert [s.params for s in result.sql] == [
        (log[0].event_id, "alpha", 5, 5),  # type: ignore[union-attr]
        (log[1].event_id, "alpha", 7, 12),  # type: ignore[union-attr]
        (log[3].event_id, "gamma", 11, 11),  # type: ignore[union-attr]
    ]
    assert [a.project_id for a in result.applied] == ["alpha", "alpha", "gamma"]
    assert result.folds == {"alpha": {"total": 12}, "gamma": {"total": 11}}
    (poison,) = result.dead_letters
    assert (poison.event_id, poison.value, poison.attempts) == (None, b"\x00 not an event", 1)
    assert poison.partition == result.partition_of("alpha") and "not valid JSON" in poison.reason
    alpha, gamma = result.partition_of("alpha"), result.partition_of("gamma")
    assert result.cursors[alpha].acked_through == 2 and result.cursors[gamma].acked_through == 0
    assert result.cursors[alpha].reduced_through == 2
    assert result.redis == {} and result.records == [] and result.caught_up_calls == []
    assert result.failpoints["runtime.before_store_commit"] >= 1


def test_a_failing_event_is_dead_lettered_after_five_tries_and_its_project_goes_on() -> None:
    log = orders(5, -1, 7)
    result = run(Orders, log)
    (letter,) = result.dead_letters
    assert (letter.event_id, letter.attempts) == (log[1].event_id, 5)
    assert letter.reason == f"ValueError: order {log[1].event_id} has a negative amount"
    assert result.folds == {"alpha": {"total": 12}}  # held back, then applied past the letter
    assert [a.event_id for a in result.applied] == [log[0].event_id, log[2].event_id]
    assert len(run(Orders, log, max_batch_failures=2).dead_letters[0].reason) > 0
    assert run(Orders, log, max_batch_failures=2).dead_letters[0].attempts == 2


def test_a_crash_changes_nothing_for_a_sound_processor_and_must_be_reached() -> None:
    log = orders(5, 7, 9)
    clean = run(Orders, log)
    crashed = run(Orders, log, shape=[1], crash_at=("runtime.after_store_commit", 2))
    assert (crashed.sql, crashed.folds, crashed.cursors) == (clean.sql, clean.folds, clean.cursors)
    with pytest.raises(ValueError, match=r"passed runtime.after_store_commit 1 times"):
        run(Orders, log, crash_at=("runtime.after_store_commit", 2))


def test_the_checker_passes_the_built_in_ledger_and_projector() -> None:
    ledger = assert_exactly_once(Ledger, completions(), random_shapes=20)
    assert ledger.redis_of("gamma")["ledger:project:gamma"] == ["1", "2", "3"]
    lifecycle = slotted_events(project_events("alpha", 10), tenant_id="t")
    projector = assert_exactly_once(
        lambda: ProjectViewProjector(feed_length=5, missing_cap=100), lifecycle, random_shapes=20
    )
    assert projector.redis_of("alpha")["view:alpha:counts"]["task.created"] == "4"


def test_the_checker_passes_sql_effects_with_a_fold_and_an_eventless_caught_up_call() -> None:
    assert_exactly_once(Orders, [*orders(5, -1, 7), *orders(3, 4, project="gamma")])
    other = event("task.started", "alpha", slot=9)  # not a type it reads
    reconciled = assert_exactly_once(Reconciler, [*completions(2), other])
    alpha = reconciled.partition_of("alpha")
    # alpha's partition ends in a record it does not read: one eventless call there.
    assert [c.partition for c in reconciled.caught_up_calls] == [alpha]
    assert reconciled.redis_of("alpha")["reconciled"] == {"alpha": "2", "beta": "2"}


def test_the_checker_catches_an_effect_that_a_crash_retry_changes() -> None:
    with pytest.raises(EffectsDiverged) as caught:
        assert_exactly_once(CountsItsCalls, completions())
    assert caught.value.trial.crash_at is not None and caught.value.aspect == "redis"
    message = str(caught.value)
    assert message.startswith("counts-its-calls: not exactly once with polls of 1 record, a crash")
    assert "redis[" in message and "['numbered']" in message
    assert (
        f"replay: run(processor, events, shape=(1,), crash_at={caught.value.trial.crash_at})"
        in (message)
    )
    replayed = run(CountsItsCalls, completions(), shape=[1], crash_at=caught.value.trial.crash_at)
    assert replayed.redis != run(CountsItsCalls, completions()).redis


def test_the_checker_catches_an_effect_that_depends_on_the_batch() -> None:
    with pytest.raises(EffectsDiverged, match=r"redis\['s0\[0\]'\]\['batches'\]: got '\d+'"):
        assert_exactly_once(CountsBatches, completions())


def test_the_checker_is_deterministic_for_a_seed() -> None:
    # Without crashes only copies published again make the counting processor process an event
    # twice (a commit meets the copy's claim, and the batch is processed again): the random
    # trials, drawn from the seed, are what catches it.
    def failure(seed: int) -> str:
        with pytest.raises(EffectsDiverged) as caught:
            assert_exactly_once(CountsItsCalls, completions(), crash_points=0, seed=seed)
        assert caught.value.trial.order is not None
        return str(caught.value)

    assert failure(1) == failure(1)
    log = completions()
    drawn = [list(random_trials(log, 10, random.Random(seed))) for seed in (7, 7, 8)]
    assert drawn[0] == drawn[1] != drawn[2]


def test_the_checker_takes_a_factory_not_an_instance() -> None:
    with pytest.raises(TypeError, match="class or a function making one"):
        assert_exactly_once(Ledger(), completions())  # type: ignore[arg-type]


def test_event_ids_follow_the_fields() -> None:
    one = event("task.completed", "alpha", slot=1)
    assert event("task.completed", "alpha", slot=1) == one
    assert event("task.completed", "alpha", slot=2).event_id != one.event_id
    assert event("task.completed", "alpha", slot=1, payload={"n": 1}).event_id != one.event_id
    assert one.tenant_id == "tenant-1" and one.timestamp.isoformat() == "2026-01-01T00:00:01+00:00"


def test_handle_runs_a_handler_as_the_worker_does() -> None:
    def waits(cmd: Any, ctx: Any) -> None:
        raise Retry(delay_s=5, reason="not yet")

    c = command("index.build")
    with pytest.raises(Retry):
        handle(waits, c, context(c, queue="indexing"))
