"""The chaos matrix's checks of the outbox and the streams (tests/chaos/matrix/outbox_checks.py)
are not vacuous: a clean record passes each of them, and a record with one thing wrong (a slot
ahead of its predecessor on a stream, a row missing, a slot gap, a slot used twice, a counter
behind, a row left failed, an outage charged to a row, a copy where no publisher crashed) fails
the invariant it belongs to. In memory: no server is needed to feed them a bad record."""

from __future__ import annotations

import dataclasses

from router.settings import Settings
from streams.envelopes import Draft, Event
from streams.workload import slotted_events, workload
from tests.chaos.matrix.outbox_checks import (
    check,
    ladder_s,
    outage_charged,
    outbox_slots,
    stream_order,
)
from tests.chaos.matrix.outboxes import StoredRow
from tests.chaos.matrix.scenarios import (
    AfterApplied,
    LongOutage,
    Outbox,
    OutboxServerKill,
    Scenario,
    SecondPublisher,
    ServerKill,
)

SETTINGS = Settings(
    env="checks",
    outbox_backoff_initial_s=0.25,
    outbox_backoff_max_s=2.0,
    outbox_max_row_attempts=3,
)


def _record() -> tuple[list[Draft], list[Event], list[StoredRow], dict[str, int]]:
    drafts = workload("checks", 3, 60)
    events = slotted_events(drafts, tenant_id="t")
    rows = [
        StoredRow(e.event_id, e.project_id, e.slot or 0, "published", 0, 0, None) for e in events
    ]
    counters: dict[str, int] = {}
    for e in events:
        counters[e.project_id] = max(counters.get(e.project_id, 0), e.slot or 0)
    return drafts, events, rows, counters


def _scenario(fault: object) -> Scenario:
    return Scenario(
        row=0,
        name="checks",
        fault=fault,  # type: ignore[arg-type]
        when=AfterApplied(0.1),
        proves="-",
        outbox=Outbox.SQLITE,
    )


def test_a_clean_record_passes() -> None:
    drafts, events, rows, counters = _record()
    copy = [*events, events[3]]  # a re-sent record after its original: allowed in order
    assert stream_order(copy) == []
    assert outbox_slots(drafts, rows, counters) == []
    found = check(
        _scenario(ServerKill("kafka", 1)), drafts, copy, rows, counters, SETTINGS, write_retries=0
    )
    assert not any(found.values()), found


def test_a_slot_ahead_of_its_predecessor_on_a_stream_fails_i4() -> None:
    drafts, events, rows, counters = _record()
    project = events[0].project_id
    mine = [e for e in events if e.project_id == project]
    swapped = [e for e in events if e.project_id != project] + [mine[1], mine[0], *mine[2:]]
    found = stream_order(swapped)
    assert found == [f"{project}: slot 2 on the stream before slot 1"], found
    assert check(
        _scenario(SecondPublisher(1)), drafts, swapped, rows, counters, SETTINGS, write_retries=0
    )["I4"]


def test_a_lost_row_a_gap_a_slot_twice_a_counter_behind_and_a_failed_row_fail_i1() -> None:
    drafts, _, rows, counters = _record()
    project = rows[0].project_id

    lost = rows[1:]
    assert any("not in the outbox" in p for p in outbox_slots(drafts, lost, counters))

    gap = [
        dataclasses.replace(r, slot=r.slot + 1) if r.event_id == rows[-1].event_id else r
        for r in rows
    ]
    assert any("are not 1.." in p for p in outbox_slots(drafts, gap, counters))

    first, second = [r for r in rows if r.project_id == project][:2]
    twice = [dataclasses.replace(r, slot=first.slot) if r is second else r for r in rows]
    found = outbox_slots(drafts, twice, counters)
    assert any("are not 1.." in p for p in found) and any("write order" in p for p in found)

    behind = {**counters, project: counters[project] - 1}
    assert any("slot counter" in p for p in outbox_slots(drafts, rows, behind))

    failed = [dataclasses.replace(rows[0], state="failed"), *rows[1:]]
    assert any("ended failed" in p for p in outbox_slots(drafts, failed, counters))

    stray = [*rows, dataclasses.replace(rows[0], event_id="evt_" + "0" * 32, slot=99)]
    assert any("never written" in p for p in outbox_slots(drafts, stray, counters))


def test_an_outage_charged_to_a_row_or_shorter_than_its_claim_fails() -> None:
    _, _, rows, _ = _record()
    assert ladder_s(0.25, 2.0) == 3.75
    assert ladder_s(1.0, 300.0) == 511.0 + 300.0
    deferred = [dataclasses.replace(r, deferrals=5) for r in rows]
    assert outage_charged(deferred, max_row_attempts=3, down_s=30, ladder=3.75) == {
        "I1": [],
        "fault": [],
    }
    charged = [dataclasses.replace(deferred[0], attempts=1), *deferred[1:]]
    assert outage_charged(charged, max_row_attempts=3, down_s=30, ladder=3.75)["I1"]
    short = outage_charged(deferred, max_row_attempts=3, down_s=10, ladder=3.75)["fault"]
    assert short and "did not outlast" in short[0]
    barely = outage_charged(rows, max_row_attempts=3, down_s=30, ladder=3.75)["fault"]
    assert barely and "deferred more than" in barely[0]
    drafts, events, _, counters = _record()
    found = check(
        _scenario(LongOutage(30.0)), drafts, events, charged, counters, SETTINGS, write_retries=0
    )
    assert found["I1"] and not found["fault"], found


def test_a_copy_without_a_crash_fails_i2() -> None:
    drafts, events, rows, counters = _record()
    copy = [*events, events[0]]
    found = check(
        _scenario(SecondPublisher(1)), drafts, copy, rows, counters, SETTINGS, write_retries=0
    )
    assert found["I2"] == ["1 records on the streams are copies, though no publisher crashed"]


def test_a_kill_mid_publish_that_struck_no_write_or_left_no_copy_fails() -> None:
    drafts, events, rows, counters = _record()
    kill = _scenario(OutboxServerKill(1))
    copy = [*events, events[0]]
    found = check(kill, drafts, copy, rows, counters, SETTINGS, write_retries=0)
    assert found["fault"] == [
        "no writer's transaction was interrupted: the kill struck no write"
    ], found
    found = check(kill, drafts, events, rows, counters, SETTINGS, write_retries=2)
    assert found["fault"] == ["the publisher's pass under way at the kill was not sent again"], (
        found
    )
    found = check(kill, drafts, copy, rows, counters, SETTINGS, write_retries=2)
    assert not any(found.values()), found
