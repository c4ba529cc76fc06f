"""The chaos matrix's checks of garbage on a stream (row 9) and of operator moves (row 22) are not
vacuous: fed the record a passing run leaves, they hold; fed one with a fault of each kind they
guard against, each reports it. Pure: no servers."""

from __future__ import annotations

import dataclasses
from typing import Any

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, batch_letter_id
from streams.workload import workload
from tests.chaos.matrix import invariants, moves
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


# -- row 22: the ledger under an operator's moves ------------------------------------------------
# One project on one partition: its events at offsets 0..5, slots 1..6.
PROJECT = "p1"
DRAFTS = workload("moves", 1, 6)
IDS = [d.event_id for d in DRAFTS]
WHERE = {(TOPIC, 0, n): event_id for n, event_id in enumerate(IDS)}


def skip(offset: int) -> dict[str, object]:
    return {"action": "skip_through", "topic": TOPIC, "partition": 0, "skipped_from": offset}


def moved(*entries: dict[str, object]) -> moves.Audited:
    # The audit log reads newest first.
    return moves.from_entries(list(reversed(entries)), LEDGER, WHERE)


def record(slots: list[int], revisions: dict[str, dict[int, int]] | None = None) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for slot in slots:
        counts[IDS[slot - 1]] = counts.get(IDS[slot - 1], 0) + 1
    return {
        "projects": {DRAFTS[0].project_id: slots},
        "counts": counts,
        "revisions": revisions or {},
    }


def judged(
    ledger: dict[str, Any], audit: moves.Audited, poison: list[str] | None = None
) -> list[str]:
    e = invariants.Evidence(
        drafts=DRAFTS, poison=poison or [], arrived=[], drains={}, drained_in_s=1.0, drain_bound_s=9
    )
    found = invariants.judge_ledger(ledger, audit, e)
    return [f"{name}: {p}" for name, problems in found.items() for p in problems]


def test_an_audited_skip_accounts_for_the_event_it_covered_and_only_that() -> None:
    audit = moved({**skip(2), "offset": 2})
    assert judged(record([1, 2, 4, 5, 6]), audit) == []  # slot 3 (offset 2) skipped
    # Without the audit, or with the event missing elsewhere, it is lost.
    assert judged(record([1, 2, 4, 5, 6]), moved())[0].startswith("I1: ledger: 1 events never")
    lost = judged(record([1, 2, 4, 6]), audit)
    assert lost and lost[0].startswith("I1") and IDS[4] in lost[0]


def reprocess(offset: int, revision: int) -> dict[str, object]:
    return {
        "action": "reprocess_from",
        "topic": TOPIC,
        "partition": 0,
        "offset": offset,
        "revision": revision,
    }


def test_a_reprocess_reruns_each_event_once_at_its_revision_in_order() -> None:
    audit = moved(reprocess(3, 1))  # offsets 3..5: slots 4..6
    rerun = {IDS[n]: {1: 1} for n in (3, 4, 5)}
    assert judged(record([1, 2, 3, 4, 5, 4, 5, 6], rerun), audit) == []
    # An event still in flight at the move applied only at the new revision: fine too.
    assert judged(record([1, 2, 3, 4, 4, 5, 6], rerun), audit) == []


def test_the_reprocess_checks_see_a_rerun_missing_doubled_unasked_or_out_of_order() -> None:
    audit = moved(reprocess(3, 1))
    rerun = {IDS[n]: {1: 1} for n in (3, 4, 5)}
    missing = judged(record([1, 2, 3, 4, 5, 6, 4, 5], {**rerun, IDS[5]: {}}), audit)
    assert any("not applied once at its revision" in p for p in missing), missing
    doubled = judged(record([1, 2, 3, 4, 5, 4, 5, 6, 6], {**rerun, IDS[5]: {1: 2}}), audit)
    assert any("more than once a revision" in p for p in doubled), doubled
    unasked = judged(record([1, 2, 3, 4, 5, 4, 5, 6, 3], {**rerun, IDS[2]: {1: 1}}), audit)
    assert any("no audited move re-ran" in p for p in unasked), unasked
    reordered = judged(record([1, 2, 3, 4, 5, 5, 4, 6], rerun), audit)
    assert any(p.startswith("I4") for p in reordered), reordered
    # And without any move, a second application is a double, as before.
    assert any("more than once" in p for p in judged(record([1, 2, 2, 3, 4, 5, 6]), moved()))
