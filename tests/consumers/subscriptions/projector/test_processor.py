"""project-view-projector through rhumbatron.testing, as a team tests a processor of its own:
gaps, late slots, duplicates, unslotted events, the feed, the state machines, and exactness under
any batching, copies, a crash at every fail-point and an operator's moves."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.types import TP, Delivery, Phase
from consumers.subscriptions.projector.processor import (
    ProjectViewProjector,
    decode_state,
    encode_state,
    metrics_key,
)
from consumers.subscriptions.projector.view import view_from_parts
from rhumbatron.testing import Result, assert_exactly_once, run
from streams.envelopes import Event, build
from streams.errors import ProjectorInputError
from streams.ids import new_event_id
from streams.workload import project_events, slotted_events, workload
from tests.support.projector_oracle import expected_feed, expected_view, memory_feed, memory_view

START = datetime(2026, 3, 1, tzinfo=UTC)
PROJECTS = ["alpha", "beta", "gamma", "delta"]


def projector(*, feed_length: int = 50, missing_cap: int = 1000) -> ProjectViewProjector:
    return ProjectViewProjector(feed_length=feed_length, missing_cap=missing_cap)


def lifecycle(project: str, count: int) -> list[Event]:
    return slotted_events(project_events(project, count), tenant_id="t", start=START)


def view(result: Result, project: str) -> dict[str, Any]:
    v = memory_view(result, result.partition_of(project), project)
    assert v is not None, f"{project} has no view"
    return v


def feed(result: Result, project: str) -> list[dict[str, Any]]:
    return memory_feed(result, result.partition_of(project), project)


def expected(result: Result, project: str, arrived: list[Event]) -> dict[str, Any]:
    return expected_view(project, result.partition_of(project), arrived)


def gaps_metric(result: Result) -> int:
    return sum(
        int(data.get(metrics_key(), {}).get("gaps_recorded", "0")) for data in result.redis.values()
    )


def consume(events: list[Event], **kw: Any) -> Result:
    return run(projector(**kw), events)


def installments(*parts: list[Event]) -> list[Result]:
    """What the projector left after each installment of events, each installment coming in a
    poll of its own (as when they are published while it runs)."""
    results: list[Result] = []
    log: list[Event] = []
    for n, part in enumerate(parts):
        log += part
        results.append(run(projector(), log, shape=[len(p) for p in parts[: n + 1]]))
    return results


def test_a_slot_beyond_a_gap_is_applied_and_the_gap_recorded() -> None:
    events = lifecycle("alpha", 8)
    arrived = [events[0], events[1], events[2], events[5]]  # slots 1, 2, 3, 6
    result = consume(arrived)
    v = view(result, "alpha")
    assert v["highSlot"] == 6 and v["missingSlots"] == [4, 5]
    assert v["gap"] is True and v["gapsRecorded"] == 1 and gaps_metric(result) == 1
    assert v["counts"] == {"change.created": 1, "project.created": 1, "task.created": 2}
    assert v == expected(result, "alpha", arrived)


def test_a_late_slot_inside_a_recorded_gap_is_applied_and_closes_it() -> None:
    events = lifecycle("alpha", 12)
    # Slot 8 is task t0's start, slot 10 its completion: the completion comes first.
    assert events[7].event_type == "task.started" and events[9].event_type == "task.completed"
    task = events[7].task_id
    assert task is not None
    # The late start (slot 8) comes in a poll after the completion's: it must not roll the task
    # back.
    first, late, rest = installments(
        events[:7] + [events[9]], [events[7]], [events[8], *events[10:]]
    )
    v = view(first, "alpha")
    assert v["missingSlots"] == [8, 9] and v["gap"] is True and v["gapsRecorded"] == 1
    assert v["tasks"][task]["state"] == "completed" and v["tasks"][task]["agent"] is None

    v = view(late, "alpha")
    assert v["missingSlots"] == [9] and v["gap"] is True
    assert v["tasks"][task] == {
        "state": "completed",
        "agent": "agent-0",
        "changeId": events[7].change_id,
        "blockedLimit": None,
    }
    assert v["activeAgents"] == {}  # the completion's slot wins, in either order

    v = view(rest, "alpha")
    assert v["missingSlots"] == [] and v["gap"] is False and v["gapsRecorded"] == 1
    assert gaps_metric(rest) == 1
    in_order = view(consume(events), "alpha")
    assert {**v, "gapsRecorded": 0} == in_order


def test_a_duplicate_is_skipped_by_its_claim_not_by_its_slot() -> None:
    events = lifecycle("alpha", 20)
    # The publisher's crash window: a copy right behind each, and late copies, batches later.
    arrived = [e for e in events for _ in range(2)] + events[:5]
    result = run(projector(), arrived, shape=[3, 7, 2, 5])
    # Every record handled, each event applied once: the 25 copies were duplicates.
    assert [a.event_id for a in result.applied] == [e.event_id for e in events]
    assert result.cursors[result.partition_of("alpha")].acked_through == len(arrived) - 1
    v = view(result, "alpha")
    assert v == expected(result, "alpha", events) and v["events"] == 20
    assert feed(result, "alpha") == expected_feed("alpha", events, 50)

    # A different event that reuses slot 3: produced directly (no outbox identity), the claim
    # by event id decides, and it is applied.
    other = events[2].model_copy(
        update={"event_id": new_event_id(), "event_type": "model.routed", "task_id": None}
    )
    v = view(run(projector(), [*arrived, other], shape=[3, 7, 2, 5], from_outbox=False), "alpha")
    assert v["counts"]["model.routed"] == 1 and v["events"] == 21
    assert v["highSlot"] == 20 and v["missingSlots"] == [] and v["gapsRecorded"] == 0
    # From an outbox, whose UNIQUE constraint allows one event a slot, slot 3 is claimed (below
    # the project's base slot): a copy there is a duplicate, whatever its id.
    v = view(run(projector(), [*arrived, other], shape=[3, 7, 2, 5]), "alpha")
    assert "model.routed" not in v["counts"] and v["events"] == 20


def test_events_without_a_slot_are_applied_without_slot_checks() -> None:
    drafts = project_events("pump", 12)
    unslotted = [
        d.to_event(tenant_id="t", timestamp=START + timedelta(seconds=n), slot=None)
        for n, d in enumerate(drafts)
    ]
    result = consume(unslotted)
    v = view(result, "pump")
    assert v["highSlot"] is None and v["missingSlots"] == [] and v["gap"] is False
    assert v["events"] == 12 and v["gapsRecorded"] == 0 and gaps_metric(result) == 0
    assert v == expected(result, "pump", unslotted)

    # Mixed: an unslotted event between slotted ones opens no gap and is counted.
    slotted = lifecycle("mixed", 4)
    arrived = [slotted[0], slotted[1], unslotted[5].model_copy(update={"project_id": "mixed"})]
    arrived += [slotted[2], slotted[3]]
    result = consume(arrived)
    v = view(result, "mixed")
    assert v["highSlot"] == 4 and v["missingSlots"] == [] and v["gapsRecorded"] == 0
    assert v == expected(result, "mixed", arrived)


def test_the_feed_is_bounded_and_newest_first() -> None:
    events = lifecycle("alpha", 12)
    newest = feed(consume(events, feed_length=5), "alpha")
    assert [e["slot"] for e in newest] == [12, 11, 10, 9, 8]
    assert newest == expected_feed("alpha", events, 5)
    assert newest[0] == {
        "eventId": events[11].event_id,
        "eventType": events[11].event_type,
        "time": "2026-03-01T00:00:00.011Z",
        "actor": events[11].actor,
        "slot": 12,
        "changeId": events[11].change_id,
        "taskId": events[11].task_id,
    }


def test_task_agent_and_change_states_through_a_realistic_lifecycle() -> None:
    events = lifecycle("alpha", 55)  # project.created, then two changes to release
    chg1, chg2 = "alpha-chg1", "alpha-chg2"
    started, declared, released, done = installments(
        events[:9],  # ... t0 ready, t0 started by agent-0, its intent
        events[9:20],  # t1 done; t2 and t3 (both after t1) started and declared at once
        events[20:28],  # t2, t3 done; verification, candidate, promotion, canonical, release
        events[28:],
    )
    v = view(started, "alpha")
    assert v["changes"] == {chg1: "in_progress"}
    assert v["tasks"][f"{chg1}-t0"] == {
        "state": "started",
        "agent": "agent-0",
        "changeId": chg1,
        "blockedLimit": None,
    }
    assert {t["state"] for k, t in v["tasks"].items() if k != f"{chg1}-t0"} == {"created"}
    assert v["activeAgents"] == {"agent-0": 1} and v["generation"] is None

    v = view(declared, "alpha")
    assert [v["tasks"][f"{chg1}-t{i}"]["state"] for i in range(4)] == [
        "completed",
        "completed",
        "started",
        "started",
    ]
    assert v["activeAgents"] == {"agent-2": 1, "agent-0": 1}  # t3 runs on agent-0 (3 % 3)

    v = view(released, "alpha")
    assert v["changes"] == {chg1: "released"} and v["generation"] == 1

    v = view(done, "alpha")
    assert v["changes"] == {chg1: "released", chg2: "released"}
    assert {t: (s["state"], s["agent"]) for t, s in v["tasks"].items()} == {
        f"{c}-t{i}": ("completed", f"agent-{i % 3}") for c in (chg1, chg2) for i in range(4)
    }
    assert v["activeAgents"] == {} and v["generation"] == 2
    assert v["highSlot"] == 55 and v["gap"] is False
    assert v["counts"]["task.completed"] == 8 and v["counts"]["canonical.advanced"] == 2
    assert v["lastEventTime"] == "2026-03-01T00:00:00.054Z"
    assert v == expected(done, "alpha", events)


def test_a_failed_task_frees_its_agent_and_a_rejected_candidate_shows_on_the_change() -> None:
    base = lifecycle("alpha", 9)  # t0 started by agent-0 at slot 8, intent at 9
    t0, change = base[7].task_id, base[7].change_id

    def more(slot: int, etype: str, payload: dict[str, Any], task: str | None) -> Event:
        return build(
            Event,
            event_id=new_event_id(),
            event_type=etype,
            tenant_id="t",
            project_id="alpha",
            change_id=change,
            task_id=task,
            actor="test",
            timestamp=START + timedelta(seconds=slot),
            payload=payload,
            slot=slot,
        )

    events = [
        *base,
        more(10, "task.failed", {"agentId": "agent-0", "reason": "tests"}, t0),
        more(11, "task.blocked", {"blockedLimit": "dead_letter", "commandId": "cmd_x"}, t0),
        more(12, "candidate.rejected", {"candidateId": "cand-1"}, None),
    ]
    result = consume(events)
    v = view(result, "alpha")
    assert v["tasks"][t0] == {
        "state": "blocked",
        "agent": "agent-0",
        "changeId": change,
        "blockedLimit": "dead_letter",
    }
    assert v["activeAgents"] == {} and v["changes"] == {change: "rejected"}
    assert v == expected(result, "alpha", events)


def _dead_letter_pair(t0: str, change: str | None, first: int) -> list[Event]:
    """What the dead-letter path writes for a dead-lettered ``cmd_<t0>_ready`` wake: the block
    (slot ``first``) and the failure that follows it (slot ``first + 1``)."""
    command = f"cmd_{t0}_ready"
    payloads = [
        ("task.blocked", {"blockedLimit": "dead_letter", "commandId": command}),
        (
            "task.failed",
            {
                "reason": "dead_letter: failed: agent down",
                "commandId": command,
                "blockedLimit": "dead_letter",
                "agentId": "agent-0",
            },
        ),
    ]
    return [
        build(
            Event,
            event_id=new_event_id(),
            event_type=etype,
            tenant_id="t",
            project_id="alpha",
            change_id=change,
            task_id=t0,
            actor="service:dead-letter-consumer",
            timestamp=START + timedelta(seconds=first + n),
            payload=payload,
            slot=first + n,
        )
        for n, (etype, payload) in enumerate(payloads)
    ]


@pytest.mark.parametrize("failed_first", [False, True])
def test_a_task_blocked_then_failed_by_the_dead_letter_path_shows_blocked_with_its_limit(
    failed_first: bool,
) -> None:
    base = lifecycle("alpha", 9)  # t0 started by agent-0 at slot 8, intent at 9
    t0, change = base[7].task_id, base[7].change_id
    assert t0 is not None
    pair = _dead_letter_pair(t0, change, 10)
    events = [*base, *(reversed(pair) if failed_first else pair)]
    result = consume(events)
    v = view(result, "alpha")
    assert v["tasks"][t0] == {
        "state": "blocked",
        "agent": "agent-0",
        "changeId": change,
        "blockedLimit": "dead_letter",
    }
    assert v["activeAgents"] == {}
    assert v == expected(result, "alpha", events)


def test_several_tasks_on_one_agent_keep_it_active_until_the_last_ends() -> None:
    events = lifecycle("alpha", 28)
    # agent-0 runs t0 and t3: start t3 before t0 completes (slots renumbered to stay dense).
    assert events[18].event_type == "task.started" and events[18].payload["agentId"] == "agent-0"
    t3_start = events[18].model_copy(update={"slot": 9})
    both, one = installments(
        [*events[:8], t3_start],  # t0 started by agent-0, then t3 by agent-0 too
        [events[9].model_copy(update={"slot": 10})],  # t0 completed
    )
    assert view(both, "alpha")["activeAgents"] == {"agent-0": 2}
    assert view(one, "alpha")["activeAgents"] == {"agent-0": 1}


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"event_type": "task.started", "payload": {}}, "payload.agentId"),
        ({"event_type": "task.completed", "payload": {"agentId": ""}}, "payload.agentId"),
        ({"event_type": "task.failed", "payload": {"agentId": 7}}, "payload.agentId"),
        ({"event_type": "task.ready", "task_id": None}, "taskId"),
        ({"event_type": "change.created", "change_id": None}, "changeId"),
        ({"event_type": "canonical.advanced", "payload": {}}, "canonicalGeneration"),
        (
            {"event_type": "canonical.advanced", "payload": {"generation": "2"}},
            "payload.generation",
        ),
        (
            {
                "event_type": "canonical.advanced",
                "payload": {"generation": 2},
                "canonical_generation": 3,
            },
            "payload.generation",
        ),
    ],
)
def test_bad_input_is_dead_lettered_naming_the_field_and_the_rest_applied(
    update: dict[str, Any], field: str
) -> None:
    events = lifecycle("alpha", 10)
    bad = events[4].model_copy(update={**update, "event_id": new_event_id()})
    arrived = [*events[:4], bad, *events[5:]]
    result = consume(arrived)
    (letter,) = result.dead_letters
    assert letter.event_id == bad.event_id and letter.attempts == 5
    assert letter.reason.startswith("ProjectorInputError: ")
    assert f"field '{field}'" in letter.reason and bad.event_id in letter.reason
    v = view(result, "alpha")
    assert v["events"] == 9 and v["missingSlots"] == [5] and v["gap"] is True
    with pytest.raises(ProjectorInputError, match=field.replace(".", r"\.")):
        projector().process(bad, None, _delivery())


def _delivery() -> Delivery:
    return Delivery(TP("s0", 0), 0, Phase.LIVE, True, 0)


def test_missing_slots_past_the_cap_flag_an_overflow_that_stays() -> None:
    events = lifecycle("alpha", 10)
    first = [events[0], events[9]]  # slots 2..9 missing, only 3 recorded
    log = [*first, *events[1:9]]
    v = view(run(projector(missing_cap=3), first), "alpha")
    assert v["missingSlots"] == [2, 3, 4] and v["missingOverflow"] is True and v["gap"] is True
    v = view(run(projector(missing_cap=3), log, shape=[len(first), len(log)]), "alpha")
    # Every recorded slot closed, but slots past the cap were never recorded: the view cannot
    # tell them from ones still missing, so it keeps saying so.
    assert v["missingSlots"] == [] and v["missingOverflow"] is True and v["gap"] is True


def test_states_are_stored_as_order_and_code() -> None:
    assert decode_state(encode_state(41, 3), {"a": 3}) == (41, "a")
    with pytest.raises(ValueError, match="unknown code"):
        decode_state(encode_state(1, 9), {"a": 3})
    with pytest.raises(ValueError, match="feed_length"):
        ProjectViewProjector(feed_length=0, missing_cap=1)
    assert view_from_parts("nobody", _delivery().tp, {}) is None


def _mixed_log(seed: int) -> list[Event]:
    """Four projects interleaved; about one event in five published twice, and per project one
    slot arriving two events late (a gap recorded, then closed)."""
    rng = random.Random(seed)
    per: dict[str, list[Event]] = {}
    for p in PROJECTS:
        evs = lifecycle(p, 14)
        late = rng.randrange(2, 11)
        order = [e for n, e in enumerate(evs) if n != late]
        order.insert(late + 2, evs[late])
        per[p] = order
    interleaved: list[Event] = []
    while any(per.values()):
        p = rng.choice([p for p in PROJECTS if per[p]])
        interleaved.append(per[p].pop(0))
        if rng.random() < 0.2:
            interleaved.append(interleaved[-1])
    return interleaved


def test_the_views_are_exactly_once_under_any_batching_copies_crashes_and_moves() -> None:
    """The same log split into polls every way up to six records and 50 random ways, with more
    copies, a crash at every fail-point (every pass in polls of one record, sampled past 100),
    and a re-reduce and a reprocess halfway: the views, feeds and gap counts of one clean run,
    and those are the oracle's."""
    arrived = _mixed_log(seed=3)
    clean = assert_exactly_once(lambda: projector(feed_length=6), arrived)
    for p in PROJECTS:
        assert view(clean, p) == expected(clean, p, arrived)
        assert feed(clean, p) == expected_feed(p, arrived, 6)
    expected_gaps = sum(expected(clean, p, arrived)["gapsRecorded"] for p in PROJECTS)
    assert expected_gaps == len(PROJECTS)  # one late slot each: one gap each
    assert gaps_metric(clean) == expected_gaps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(list(range(30))))
def test_any_arrival_order_of_slots_ends_in_the_in_order_view(order: list[int]) -> None:
    events = lifecycle("alpha", 30)
    arrived = [events[i] for i in order]
    result = consume(arrived)
    in_order = view(consume(events), "alpha")
    v = view(result, "alpha")
    assert v["gapsRecorded"] == expected(result, "alpha", arrived)["gapsRecorded"]
    assert {**v, "gapsRecorded": 0} == in_order


def test_a_workload_over_many_projects() -> None:
    events = slotted_events(workload("w", 12, 300), tenant_id="t", start=START)
    result = consume(events)
    for p in sorted({e.project_id for e in events}):
        assert view(result, p) == expected(result, p, events)
