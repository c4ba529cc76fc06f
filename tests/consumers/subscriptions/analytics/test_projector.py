"""analytics-projector on the in-memory runtime: the metric table, the point, and exactly one point
per event with a metric under duplicates and a crash at every boundary."""

from __future__ import annotations

from collections import Counter as Tally
from datetime import UTC, datetime

import orjson
import pytest

from consumers.runtime.memory_transport import cuts_from
from consumers.runtime.types import TP, Delivery, Phase
from consumers.subscriptions.analytics.projector import (
    METRICS,
    POINT_FIELDS,
    AnalyticsProjector,
    metric_of,
    point_record_id,
)
from streams.envelopes import Event, build
from streams.ids import stable_event_id
from streams.workload import slotted_events, workload
from tests.support.runtime_harness import Crash, World

TOPIC = "rhumbatron_event_metrics_unit"

# The catalog's metrics (docs/analytics.md), written out here independently of the module under test.
CATALOG = {
    "project.created": "project_created",
    "change.created": "change_created",
    "task.created": "task_created",
    "task.ready": "task_ready",
    "task.started": "task_started",
    "task.completed": "task_completed",
    "task.failed": "task_failed",
    "task.blocked": "task_blocked",
    "verification.started": "candidate_verification_started",
    "candidate.created": "candidate_created",
    "candidate.verified": "candidate_verified",
    "candidate.rejected": "candidate_rejected",
    "candidate.stale": "candidate_stale",
    "artifact.promoted": "promotion_completed",
    "canonical.advanced": "promotion_canonical_advanced",
    "release.completed": "release_completed",
    "agent.woken": "agent_wakeup",
    "model.routed": "model_route",
}
WITHOUT_METRIC = [
    "intent.declared",
    "challenge.raised",
    "changeset.proposed",
    "claim.acquired",
    "claim.released",
    "some.future_type",
]

BOUNDARIES = [
    "runtime.before_store_commit",
    "runtime.after_store_commit",
    "runtime.before_transaction_commit",
    "runtime.after_transaction_commit",
    "runtime.after_offsets_commit",
]


def _event(event_type: str, *, task: str | None = "task-1", n: int = 0) -> Event:
    return build(
        Event,
        event_id=stable_event_id("chg-1", event_type, task, str(n)),
        event_type=event_type,
        tenant_id="tenant",
        project_id="proj-a",
        change_id="chg-1",
        task_id=task,
        actor="test",
        timestamp=datetime(2026, 3, 1, 12, 30, 15, 123000, tzinfo=UTC),
        slot=n + 1,
    )


def _delivery(offset: int, revision: int = 0) -> Delivery:
    return Delivery(TP("s0", 0), offset, Phase.LIVE, True, revision)


def _world() -> World:
    world = World()
    world.log.create(TOPIC, 3)
    return world


def _points(world: World) -> list[dict[str, object]]:
    return [
        orjson.loads(r.value or b"") | {"_id": (r.header("record_id") or b"").decode()}
        for r in world.log.all(TOPIC)
    ]


def _events(run: str = "u", projects: int = 4, count: int = 120) -> list[Event]:
    return slotted_events(
        workload(run, projects, count),
        tenant_id="tenant",
        start=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    )


def test_every_catalog_type_maps_to_its_metric() -> None:
    assert dict(METRICS) == CATALOG
    for event_type, metric in CATALOG.items():
        assert metric_of(event_type) == metric
    assert AnalyticsProjector.consumes == frozenset(CATALOG)


@pytest.mark.parametrize("event_type", WITHOUT_METRIC)
def test_types_without_a_metric_are_not_consumed(event_type: str) -> None:
    assert metric_of(event_type) is None
    assert AnalyticsProjector.consumes is not None
    assert event_type not in AnalyticsProjector.consumes


def test_a_type_without_a_metric_reaching_process_fails_loudly() -> None:
    with pytest.raises(ValueError, match=r"type 'intent.declared' has no metric"):
        AnalyticsProjector(TOPIC).process(_event("intent.declared"), None, _delivery(3))


def test_the_point_has_the_documented_shape() -> None:
    ev = _event("task.completed")
    effects = AnalyticsProjector(TOPIC).process(ev, None, _delivery(7))
    assert effects.redis == []
    (record,) = effects.records
    assert record.topic == TOPIC
    assert record.key == "proj-a"
    point = orjson.loads(record.value)
    assert list(point) == list(POINT_FIELDS)
    assert point == {
        "metric": "task_completed",
        "projectId": "proj-a",
        "changeId": "chg-1",
        "taskId": "task-1",
        "eventId": ev.event_id,
        "time": "2026-03-01T12:30:15.123Z",
        "value": 1,
    }


def test_a_point_without_change_or_task_carries_nulls() -> None:
    ev = _event("canonical.advanced", task=None)
    (record,) = AnalyticsProjector(TOPIC).process(ev, None, _delivery(1)).records
    point = orjson.loads(record.value)
    assert point["metric"] == "promotion_canonical_advanced"
    assert point["taskId"] is None


def test_the_record_id_is_stable_for_the_event() -> None:
    ev = _event("task.started")
    projector = AnalyticsProjector(TOPIC)
    first = projector.process(ev, None, _delivery(5)).records[0]
    again = projector.process(ev, None, _delivery(90, revision=2)).records[0]
    other = projector.process(_event("task.started", n=1), None, _delivery(6)).records[0]
    assert first.record_id == again.record_id == point_record_id(ev.event_id, "task_started")
    assert other.record_id != first.record_id


def test_each_event_with_a_metric_gets_one_point_under_duplicates() -> None:
    world = _world()
    events = _events()
    for ev in events:
        world.publish(ev)
    for ev in events[::2]:  # a re-sent half, later in the log
        world.publish(ev)
    runner = world.runner(AnalyticsProjector(TOPIC), cuts=cuts_from([7] * 1000))
    world.drain(runner)

    points = _points(world)
    expected = {e.event_id: CATALOG[e.event_type] for e in events if e.event_type in CATALOG}
    assert len(expected) < len(events), "the workload must include types without a metric"
    assert Tally(p["eventId"] for p in points) == dict.fromkeys(expected, 1)
    assert {p["eventId"]: p["metric"] for p in points} == expected
    assert runner.stats.duplicates == len([e for e in events[::2] if e.event_type in CATALOG])
    by_id = {e.event_id: e for e in events}
    for p in points:
        ev = by_id[str(p["eventId"])]
        assert p["projectId"] == ev.project_id
        assert p["_id"] == point_record_id(ev.event_id, str(p["metric"]))


@pytest.mark.parametrize("nth", [1, 2, 5])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_crash_at_a_boundary_neither_loses_nor_doubles_a_point(boundary: str, nth: int) -> None:
    world = _world()
    events = _events("c", projects=3, count=60)
    for ev in events:
        world.publish(ev)
    hits = {"n": 0}

    def crash(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == nth:
                raise Crash(name)

    first = world.runner(AnalyticsProjector(TOPIC), cuts=cuts_from([4] * 1000), failpoint=crash)
    with pytest.raises(Crash):
        world.drain(first)
    for ev in events[:20]:  # the publisher re-sends after the crash, too
        world.publish(ev)
    world.drain(world.runner(AnalyticsProjector(TOPIC), cuts=cuts_from([3] * 1000)))

    expected = [e.event_id for e in events if e.event_type in CATALOG]
    assert Tally(p["eventId"] for p in _points(world)) == dict.fromkeys(expected, 1)
