"""The ledger, through rhumbatron.testing as any processor's author tests one: each applied event
once in its project's list and counts, a re-run after a reprocess also under its cursor revision
(so a witness tells one application per revision from a doubled one), and the drill's failing
event dead-lettered after its five attempts."""

from __future__ import annotations

from consumers.subscriptions.ledger import Ledger
from rhumbatron.testing import assert_exactly_once, event, run
from streams.envelopes import Event


def test_a_reprocess_records_its_reruns_under_their_revision() -> None:
    events = [event("task.completed", "alpha", slot=n) for n in range(1, 5)]
    # Once all four are applied, an operator reprocesses from the middle: offsets 2 and 3.
    result = run(Ledger, events, operator_move=("reprocess", 4))
    ledger = result.redis_of("alpha")
    assert ledger["ledger:project:alpha"] == ["1", "2", "3", "4", "3", "4"]
    assert ledger["ledger:counts"] == {e.event_id: "2" if e.slot in (3, 4) else "1" for e in events}
    assert ledger["ledger:revisions"] == {f"{e.event_id}@1": "1" for e in events[2:]}
    assert [(a.event_id, a.cursor_revision) for a in result.applied] == [
        *((e.event_id, 0) for e in events),
        *((e.event_id, 1) for e in events[2:]),
    ]
    tp = result.partition_of("alpha")
    assert (result.cursors[tp].acked_through, result.cursors[tp].cursor_revision) == (3, 1)


def test_every_event_once_whatever_the_batches_crashes_copies_and_moves() -> None:
    drill = event("task.completed", "beta", slot=3, payload={"drill": "fail"})
    events: list[Event | bytes] = [
        *(event("task.completed", p, slot=n) for p in ("alpha", "beta", "gamma") for n in (1, 2)),
        drill,
        b"not an event",  # poison, beside beta's events
        event("task.completed", "beta", slot=4),
    ]
    clean = assert_exactly_once(Ledger, events)
    assert clean.redis_of("alpha")["ledger:project:alpha"] == ["1", "2"]
    assert clean.redis_of("beta")["ledger:project:beta"] == ["1", "2", "4"]
    assert clean.redis_of("gamma")["ledger:project:gamma"] == ["1", "2"]
    assert [(d.event_id, d.attempts) for d in clean.dead_letters] == [
        (drill.event_id, 5),
        (None, 1),
    ]
    assert clean.dead_letters[1].value == b"not an event"
