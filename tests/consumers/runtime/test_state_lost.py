"""A store that lost every partition's state (Redis came back empty), or was restored from an
older copy, while the durable copies (the dead-letter index and the audit logs, rebuilt from the
audit topic; the group's committed offsets) kept theirs: each partition's first fold takes what
they say before reading again, so the subscription ends where it would have without the loss.

The loss is a fresh store under the same log, dead letters and audit log (their rebuild from the
audit topic is tests/consumers/runtime/test_state_rebuild.py's); the restore, a snapshot of the
store taken earlier (``MemoryStore.snapshot``)."""

from __future__ import annotations

from consumers.runtime.dead_letters import LetterStatus
from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.transport import Committed
from consumers.runtime.types import JSON, TP, Delivery, Effects, Progress
from consumers.subscriptions.ledger import Ledger
from streams.envelopes import Event
from tests.support.runtime_harness import Counter, World, event


class CountingLedger(Ledger):
    """The ledger, counting the events it was handed (a failing one's tries too)."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[str] = []

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        self.handed.append(event.event_id)
        return super().process(event, state, delivery)


def _lose_the_store(world: World) -> None:
    world.store = MemoryStore()


def _publish(world: World, projects: list[str], upto: int, *, failing: str | None = None) -> None:
    for n in range(1, upto + 1):
        for p in projects:
            world.publish(event(p, n, fail=(p == failing and n == 2)))


def _publish_from(world: World, project: str, first: int, last: int, *, failing: int) -> None:
    for n in range(first, last + 1):
        world.publish(event(project, n, fail=(n == failing)))


def test_an_event_dead_lettered_before_the_loss_is_neither_tried_nor_lettered_again() -> None:
    world = World()
    _publish(world, ["alpha", "beta"], 4, failing="alpha")
    world.drain(world.runner())
    before = world.ledger()
    [letter] = world.dead.list()
    assert before == {"alpha": [1, 3, 4], "beta": [1, 2, 3, 4]}

    _lose_the_store(world)
    ledger = CountingLedger()
    runner = world.runner(ledger)
    world.drain(runner)
    assert world.ledger() == before  # every effect again, once; the letter's event not applied
    assert letter.entries[0].event_id not in ledger.handed  # not tried again, not even once
    assert runner.stats.failures == 0
    assert [d.id for d in world.dead.list()] == [letter.id]
    assert world.dead.writes == 1
    tp = world.tp_of("alpha")
    assert set(letter.offsets) <= world.store.excluded(tp)  # a refold leaves it out too
    [entry] = [e for e in world.audit.entries() if e["action"] == "first_fold"]
    assert entry["letters"] == [letter.id] and entry["partition"] == tp.partition


def test_a_letter_retried_before_the_loss_is_judged_again() -> None:
    world = World()
    _publish(world, ["alpha"], 3, failing="alpha")
    world.drain(world.runner())
    [letter] = world.dead.list()
    assert world.dead.transition(
        letter.id, to=LetterStatus.RETRYING, who="oncall", why="fixed", now=world.clock.now()
    )
    assert world.dead.transition(
        letter.id,
        to=LetterStatus.RETRIED,
        who="oncall",
        why="sent",
        now=world.clock.now(),
        frm=LetterStatus.RETRYING,
    )
    _lose_the_store(world)
    runner = world.runner()
    world.drain(runner)
    # Still failing (the drill fails every time), it is tried and lettered again: the same
    # letter (its id names the partition and offset), so the index holds one.
    assert runner.stats.failures == 5
    assert [d.id for d in world.dead.list()] == [letter.id]


def _skip_events_3_and_4(world: World) -> TP:
    """alpha's slots 1 and 2 applied, then 3 and 4 skipped by an operator (offsets 2 and 3)."""
    _publish(world, ["alpha"], 2)
    world.drain(world.runner())
    for n in (3, 4, 5):
        world.publish(event("alpha", n))
    tp = world.tp_of("alpha")
    world.controls(Ledger()).skip_through(tp, 3, who="oncall", why="bad data")
    return tp


def test_a_skip_before_the_loss_stays_skipped() -> None:
    world = World()
    _skip_events_3_and_4(world)
    world.drain(world.runner())
    before = world.ledger()
    assert before == {"alpha": [1, 2, 5]}

    _lose_the_store(world)
    world.drain(world.runner())
    assert world.ledger() == before
    [entry] = [e for e in world.audit.entries() if e["action"] == "first_fold"]
    assert entry["skipped"] == [[2, 3]]


def test_a_reprocess_back_past_a_skip_undoes_the_skip_in_the_rebuild() -> None:
    world = World()
    tp = _skip_events_3_and_4(world)
    revision = world.store.load(tp).cursor_revision
    world.controls(Ledger()).reprocess_from(tp, 2, revision, who="oncall", why="data fixed")
    world.drain(world.runner())
    assert world.ledger() == {"alpha": [1, 2, 3, 4, 5]}

    _lose_the_store(world)
    world.drain(world.runner())
    assert world.ledger() == {"alpha": [1, 2, 3, 4, 5]}
    assert not [e for e in world.audit.entries() if e["action"] == "first_fold"]


def test_kafka_effects_are_not_sent_again_for_what_the_group_committed() -> None:
    lost = World()
    for n in (1, 2, 3):
        lost.publish(event("alpha", n))
        lost.publish(event("beta", n))
    lost.drain(lost.runner(Counter()))
    sent = len(lost.out_records())
    assert sent == 6

    _lose_the_store(lost)
    for n in (4, 5):
        lost.publish(event("alpha", n))
    lost.drain(lost.runner(Counter()))
    out = lost.out_records()
    # Only the new events' effects, with the counts of a fold that saw everything before.
    assert len(out) == sent + 2
    assert [(r["n"], r["count"]) for r in out[sent:]] == [(4, 4), (5, 5)]
    assert lost.states()["alpha"] == {"count": 5, "seen": [1, 2, 3, 4, 5]}
    assert lost.states()["beta"] == {"count": 3, "seen": [1, 2, 3]}


def test_a_new_subscription_takes_nothing_and_writes_no_audit_entry() -> None:
    world = World()
    _publish(world, ["alpha", "beta"], 3)
    world.drain(world.runner())
    assert world.ledger() == {"alpha": [1, 2, 3], "beta": [1, 2, 3]}
    assert not [e for e in world.audit.entries() if e["action"] == "first_fold"]
    assert all(world.store.load(tp).fold_generation == 0 for tp in world.stream_partitions())


# -- restored from an older copy -------------------------------------------------------------------
def test_a_store_restored_from_an_older_copy_reapplies_into_it_and_keeps_later_letters() -> None:
    """The ledger (effects in Redis): the copy is taken after slot 1; slot 2's event (poison)
    is dead-lettered and slots 3 and 4 applied after it. Restored, the ledger reads on from the
    copy's cursor into the copy's state: each event once, and the poison not tried again."""
    world = World()
    _publish(world, ["alpha"], 1)
    world.drain(world.runner())
    copy = world.store.snapshot()
    _publish_from(world, "alpha", 2, 4, failing=2)
    world.drain(world.runner())
    before = world.ledger()
    assert before == {"alpha": [1, 3, 4]}

    world.store = copy
    ledger = CountingLedger()
    runner = world.runner(ledger)
    world.drain(runner)
    assert world.ledger() == before
    [letter] = world.dead.list()
    assert letter.entries[0].event_id not in ledger.handed
    assert runner.stats.failures == 0 and world.dead.writes == 1
    [entry] = [e for e in world.audit.entries() if e["action"] == "first_fold"]
    assert entry["after"] == 0 and len(entry["letters"]) == 1


def test_kafka_effects_restored_from_an_older_copy_refold_to_the_committed_offset() -> None:
    world = World()
    for n in (1, 2):
        world.publish(event("alpha", n))
    world.drain(world.runner(Counter()))
    copy = world.store.snapshot()
    for n in (3, 4):
        world.publish(event("alpha", n))
    world.drain(world.runner(Counter()))
    sent = [(r["n"], r["count"]) for r in world.out_records()]
    assert sent == [(1, 1), (2, 2), (3, 3), (4, 4)]

    world.store = copy
    world.publish(event("alpha", 5))
    world.drain(world.runner(Counter()))
    # Nothing of 3 and 4 sent again; 5's effect counts them (the fold went through them).
    assert [(r["n"], r["count"]) for r in world.out_records()] == [*sent, (5, 5)]
    assert world.states()["alpha"] == {"count": 5, "seen": [1, 2, 3, 4, 5]}


def test_a_store_in_step_with_its_group_takes_nothing() -> None:
    world = World()
    _publish(world, ["alpha"], 2)
    world.drain(world.runner(Counter()))
    world.drain(world.runner(Counter()))  # a second owner, after a clean hand-over
    _publish(world, ["beta"], 2)
    world.drain(world.runner())
    world.drain(world.runner())
    assert not [e for e in world.audit.entries() if e["action"] == "first_fold"]


def test_behind_reads_the_marks_the_runtime_commits_never_the_offset_alone() -> None:
    """Past transaction markers (a transactional producer's, such as the pump's, on the
    stream), the group's offset is ahead of the cursor by the markers alone: not behind."""
    world = World()
    ledger = world.controls(Ledger())
    counter = world.controls(Counter())
    at = Progress(acked_through=9, txn_seq=4)
    assert not ledger.behind(at, Committed(12, at.cursor_marker()))  # markers after the cursor
    assert not ledger.behind(at, Committed(12, ""))  # not ours: says nothing
    assert not ledger.behind(at, None) and not ledger.behind(Progress(), Committed(5, ""))
    assert ledger.behind(at, Committed(15, "rhumbatron.cursor=14"))
    assert not counter.behind(at, Committed(12, at.txn_marker()))
    assert counter.behind(at, Committed(12, "rhumbatron.txn=5"))
