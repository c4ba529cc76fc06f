"""``analytics-projector``: one metric point per fresh lifecycle event, on its own dataset — the
topic ``rhumbatron_event_metrics_<env>``, kept apart from every other stream.

The event types that carry a metric, and the metric's name, are the catalog's;
every other type is filtered out by ``consumes`` before it is claimed, so it produces nothing.
A point is the JSON object

    {"metric", "projectId", "changeId", "taskId", "eventId", "time", "value": 1}

with ``time`` the event's own timestamp in the canonical form (``YYYY-MM-DDTHH:MM:SS.mmmZ``),
keyed by the project id (so a project's points keep their order, and a rollup can keep per-project
state on the partition that holds the project).

Exactness is the runtime's (Kafka effects, docs/guarantees.md): the claim, a pending copy of the
point and the cursor commit in Redis first, then the point and the consumed offsets in one Kafka
transaction. A duplicate event finds its claim and writes nothing; a crash re-sends the pending
copy with the same record id. ``read_committed`` readers see each event's point once.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar

import orjson

from consumers.runtime.types import JSON, BaseProcessor, Delivery, EffectKind, Effects, OutRecord
from streams.envelopes import Event, format_time
from streams.headers import METRIC

# The catalog's metrics (docs/analytics.md): event type -> metric name.
METRICS: MappingProxyType[str, str] = MappingProxyType(
    {
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
)

METRIC_NAMES: frozenset[str] = frozenset(METRICS.values())

# Each metric's record headers, made once rather than per point.
_HEADERS: dict[str, tuple[tuple[str, bytes], ...]] = {
    metric: ((METRIC, metric.encode()),) for metric in METRIC_NAMES
}

# The point's fields, in the order they are written.
POINT_FIELDS = ("metric", "projectId", "changeId", "taskId", "eventId", "time", "value")


def metric_of(event_type: str) -> str | None:
    """The metric an event type counts under, or None when it has none."""
    return METRICS.get(event_type)


def point_of(event: Event, metric: str) -> dict[str, Any]:
    return {
        "metric": metric,
        "projectId": event.project_id,
        "changeId": event.change_id,
        "taskId": event.task_id,
        "eventId": event.event_id,
        "time": format_time(event.timestamp),
        "value": 1,
    }


def point_record_id(event_id: str, metric: str) -> str:
    """Stable for the event, so a re-sent point (after a crash, or a deliberate reprocess) is
    recognisably the same point: a reader can count distinct ids."""
    return f"pt_{event_id}_{metric}"


class AnalyticsProjector(BaseProcessor):
    slug: ClassVar[str] = "analytics-projector"
    consumes: ClassVar[frozenset[str] | None] = frozenset(METRICS)
    reducer_version: ClassVar[str] = ""  # no fold: a point depends on its event alone
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        metric = metric_of(event.event_type)
        if metric is None:
            # ``consumes`` keeps such events away; reaching here means the table and the filter
            # disagree, which must fail loudly rather than drop the event.
            raise ValueError(
                f"event {event.event_id} of type {event.event_type!r} has no metric; "
                f"known types: {', '.join(sorted(METRICS))}"
            )
        return Effects(
            records=[
                OutRecord(
                    self.topic,
                    event.project_id,
                    orjson.dumps(point_of(event, metric)),
                    point_record_id(event.event_id, metric),
                    _HEADERS[metric],
                )
            ]
        )
