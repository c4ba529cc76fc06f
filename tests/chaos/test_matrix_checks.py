"""The chaos matrix's checks of garbage on a stream (row 9) and of operator moves (row 22) are not
vacuous: fed the record a passing run leaves, they hold; fed one with a fault of each kind they
guard against, each reports it. Pure: no servers."""

from __future__ import annotations

import dataclasses

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, batch_letter_id
from tests.chaos.matrix import invariants
from tests.chaos.matrix.scenarios import LEDGER, PROJECTOR, SUBSCRIPTIONS
from tests.support import hostile

TOPIC = "rhumbatron_events_00_x"
RECORDS = hostile.catalog("hostile", 4096)[:3]
GARBAGE = {(TOPIC, 1, 10 + n): record for n, record in enumerate(RECORDS)}


def evidence() -> invariants.Evidence:
    return invariants.Evidence(
        drafts=[],
        poison=[],
        arrived=[],
        drains={},
        drained_in_s=1.0,
        drain_bound_s=9,
        garbage=GARBAGE,
    )


def letter(slug: str, where: tuple[str, int, int], record: hostile.Hostile) -> DeadLetter:
    topic, partition, offset = where
    return DeadLetter(
        id=batch_letter_id(slug, topic, partition, offset, "poison"),
        kind=LetterKind.POISON,
        source_topic=topic,
        source_partition=partition,
        error="invalid Event: not valid JSON",
        error_type="streams.errors.EnvelopeError",
        attempts=1,
        created_at="2026-01-01T00:00:00.000Z",
        entries=[Entry(offset, record.value, b"hostile", list(record.headers))],
        subscription=slug,
    )


def passing() -> list[DeadLetter]:
    return [letter(slug, w, r) for slug in SUBSCRIPTIONS for w, r in GARBAGE.items()]


def test_the_garbage_check_holds_for_a_passing_run() -> None:
    assert invariants.garbage_letters(evidence(), passing()) == []


def test_the_garbage_check_sees_a_record_a_subscription_never_dead_lettered() -> None:
    found = passing()
    dropped = next(d for d in found if d.subscription == PROJECTOR)
    found.remove(dropped)
    (problem,) = invariants.garbage_letters(evidence(), found)
    assert problem.startswith(f"{PROJECTOR}: poison letters 2, not 3: missing")


def test_the_garbage_check_sees_a_real_event_dead_lettered_as_poison() -> None:
    found = passing() + [letter(LEDGER, (TOPIC, 0, 99), RECORDS[0])]
    (problem,) = invariants.garbage_letters(evidence(), found)
    assert "not garbage" in problem and "99" in problem


def test_the_garbage_check_sees_a_second_letter_a_retry_and_a_changed_record() -> None:
    found = passing()
    first = found[0]
    found.append(dataclasses.replace(first, id=first.id + "-again"))
    found[1] = dataclasses.replace(found[1], attempts=5)
    entry = found[2].entries[0]
    found[2] = dataclasses.replace(found[2], entries=[dataclasses.replace(entry, value=b"other")])
    problems = invariants.garbage_letters(evidence(), found)
    assert any("twice 1" in p for p in problems), problems
    assert any("after 5 attempts" in p for p in problems), problems
    assert any("is not as it came" in p for p in problems), problems


def test_the_garbage_check_sees_a_letter_that_says_nothing() -> None:
    found = passing()
    found[0] = dataclasses.replace(found[0], error=" ")
    (problem,) = invariants.garbage_letters(evidence(), found)
    assert "dead-lettered at once, saying why" in problem
