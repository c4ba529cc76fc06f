"""The processor contract's two newer hooks on the in-memory runner: ``validate`` (bad input is
dead-lettered at once, its project goes on) and the eventless caught-up call (made at most once
per partition, acked offset and cursor revision, recorded with the cursor)."""

from __future__ import annotations

from typing import Any, ClassVar

from consumers.runtime.dead_letters import LetterKind
from consumers.runtime.types import (
    JSON,
    TP,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    RedisOp,
)
from streams.envelopes import Event
from tests.support.runtime_harness import OUT, World, event


class Reconciler(BaseProcessor):
    """Counts events per project; on the eventless call, records the folds it was given and the
    idempotency key of the call."""

    slug: ClassVar[str] = "reconciler"
    reducer_version: ClassVar[str] = "1"
    caught_up_call: ClassVar[bool] = True

    def __init__(self, *, fail_calls: int = 0) -> None:
        self.calls: list[tuple[int, int, dict[str, Any]]] = []
        self.fail_calls = fail_calls

    def validate(self, event: Event) -> None:
        if event.payload.get("bad"):
            raise ValueError("payload says bad")

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        return {"n": (state or {}).get("n", 0) + 1}

    def process(self, event: Event | None, state: Any, delivery: Delivery) -> Effects:
        if event is not None:
            return Effects(redis=[RedisOp("HINCRBY", "counts", (event.project_id, 1))])
        assert delivery.caught_up
        if self.fail_calls:
            self.fail_calls -= 1
            raise RuntimeError("reconciliation failed")
        self.calls.append((delivery.offset, delivery.cursor_revision, dict(state)))
        key = delivery.idempotency_key("reconcile")
        return Effects(redis=[RedisOp("RPUSH", "reconciled", (key,))])


def bad(project: str, n: int) -> Event:
    return event(project, n).model_copy(update={"payload": {"bad": True}})


def reconciled(w: World, tp: TP) -> list[str]:
    found = w.store.read(tp, "reconciled") or []
    assert isinstance(found, list)
    return [str(key) for key in found]


def test_a_partition_read_to_its_end_with_no_event_for_the_processor_gets_one_call() -> None:
    w = World()
    tp = w.tp_of("alpha")
    for n in (1, 2):
        w.publish(event("alpha", n))
    w.publish(bad("alpha", 3))  # the scan's last record: refused, so no event was caught up
    proc = Reconciler()
    w.drain(w.runner(proc))
    assert proc.calls == [(2, 0, {"alpha": {"n": 2}})]  # the folds without the refused event
    assert len(reconciled(w, tp)) == 1
    # A restart, and more polls: the call is recorded with the cursor, never made again.
    again = Reconciler()
    w.drain(w.runner(again))
    assert again.calls == [] and len(reconciled(w, tp)) == 1


def test_no_call_follows_an_event_delivered_caught_up() -> None:
    w = World()
    w.publish(event("alpha", 1))
    proc = Reconciler()
    w.drain(w.runner(proc))
    assert proc.calls == []
    w.publish(event("alpha", 2).model_copy(update={"event_type": "other.type"}))
    proc.__class__ = type("Narrow", (Reconciler,), {"consumes": frozenset({"task.completed"})})
    w.drain(w.runner(proc))
    assert [offset for offset, _, _ in proc.calls] == [1]  # the unconsumed record ended the scan


def test_a_reprocess_makes_the_call_again_with_a_new_key() -> None:
    w = World()
    tp = w.tp_of("alpha")
    w.publish(event("alpha", 1))
    w.publish(bad("alpha", 2))
    proc = Reconciler()
    runner = w.runner(proc)
    w.drain(runner)
    w.controls(proc).reprocess_from(tp, 0, 0, who="test", why="test")
    w.drain(runner)
    assert [(o, rev) for o, rev, _ in proc.calls] == [(1, 0), (1, 1)]
    keys = reconciled(w, tp)
    assert len(keys) == 2 and keys[0] != keys[1]


def test_a_failed_call_is_tried_again_after_the_backoff_and_commits_once() -> None:
    w = World()
    tp = w.tp_of("alpha")
    w.publish(event("alpha", 1))
    w.publish(bad("alpha", 2))
    proc = Reconciler(fail_calls=2)
    w.drain(w.runner(proc))
    assert len(proc.calls) == 1 and len(reconciled(w, tp)) == 1


def test_a_kafka_effect_call_sends_its_records_in_a_transaction() -> None:
    class Emitter(Reconciler):
        slug: ClassVar[str] = "emitter"
        effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

        def process(self, event: Event | None, state: Any, delivery: Delivery) -> Effects:
            if event is not None:
                return Effects()
            key = delivery.idempotency_key("sweep")
            return Effects(records=[OutRecord(OUT, "alpha", b'{"sweep": 1}', key)])

    w = World()
    w.publish(event("alpha", 1))
    w.publish(bad("alpha", 2))
    w.drain(w.runner(Emitter()))
    w.drain(w.runner(Emitter()))
    assert [r["sweep"] for r in w.out_records()] == [1]


def test_a_refused_event_is_dead_lettered_at_once_and_its_project_goes_on() -> None:
    w = World()
    tp = w.tp_of("alpha")
    w.publish(event("alpha", 1))
    refused = bad("alpha", 2)
    w.publish(refused)
    w.publish(event("alpha", 3))
    proc = Reconciler()
    runner = w.runner(proc)
    w.drain(runner)
    letters = w.dead.list()
    assert len(letters) == 1
    letter = letters[0]
    assert letter.kind == LetterKind.EVENT_BATCH and letter.attempts == 1
    assert letter.error == "validate: ValueError: payload says bad"
    assert [e.event_id for e in letter.entries] == [refused.event_id]
    assert runner.stats.failures == 0 and runner.stats.poison_dead_lettered == 0
    assert w.store.read(tp, "counts") == {"alpha": "2"}
    assert w.states() == {"alpha": {"n": 2}}  # the fold leaves it out
    # A later copy is a duplicate of the letter; an operator's retry runs validate again.
    w.publish(refused)
    w.drain(runner)
    assert len(w.dead.list()) == 1 and w.store.read(tp, "counts") == {"alpha": "2"}
    w.actions().retry(letter.id, who="t", why="t")
    w.drain(runner)
    assert len(w.dead.list()) == 2  # refused again, under a letter of its own
    assert w.store.read(tp, "counts") == {"alpha": "2"}


def test_copies_of_a_refused_event_get_one_letter_however_the_polls_cut_them() -> None:
    for batch_size in (1, 2, 50):
        w = World()
        refused = bad("alpha", 1)
        w.publish(refused)
        w.publish(refused)
        w.publish(event("alpha", 2))
        w.drain(w.runner(Reconciler(), batch_size=batch_size))
        assert len(w.dead.list()) == 1, batch_size
        assert w.states() == {"alpha": {"n": 1}}, batch_size


def test_a_dead_letter_at_the_head_keeps_the_fold_current_with_the_cursor() -> None:
    class Failing(Reconciler):
        slug: ClassVar[str] = "failing"
        caught_up_call: ClassVar[bool] = False

        def process(self, event: Event | None, state: Any, delivery: Delivery) -> Effects:
            raise RuntimeError("always")

    w = World()
    tp = w.tp_of("alpha")
    for n in (1, 2):
        w.publish(event("alpha", n))
    w.drain(w.runner(Failing(), batch_size=1))
    progress = w.store.load(tp)
    assert len(w.dead.list()) == 2
    assert progress.acked_through == progress.reduced_through == 1
