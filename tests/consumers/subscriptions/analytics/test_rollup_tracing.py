"""The rollup's span of one point: a CONSUMER span parented on the context the point carries,
naming the points topic, partition, offset, key and the app's group; none when tracing is off."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from faust.types import EventT
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from consumers.subscriptions.analytics.rollup import point_span
from tests.support.tracing import installed_provider, no_provider


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class _Event:
    message: _Message


def _point(headers: list[tuple[str, bytes]]) -> EventT[Any]:
    return cast(
        EventT[Any], _Event(_Message("rhumbatron_event_metrics_unit", 3, 41, b"p1", headers))
    )


def test_a_points_fold_continues_the_trace_the_point_carries() -> None:
    with installed_provider() as exporter:
        with trace.get_tracer("test").start_as_current_span("apply task.started") as cause:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
        event = _point(
            [("metric", b"task_started"), *((k, v.encode()) for k, v in carrier.items())]
        )
        with point_span(event, "rhumbatron-analytics-unit") as span:
            assert span is not None and trace.get_current_span() is span
        [done] = [s for s in exporter.get_finished_spans() if s.name != "apply task.started"]

    assert done.name == "process rhumbatron_event_metrics_unit"
    assert done.kind is SpanKind.CONSUMER
    assert done.parent is not None
    assert done.parent.span_id == cause.get_span_context().span_id
    assert done.context.trace_id == cause.get_span_context().trace_id
    assert dict(done.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": "rhumbatron_event_metrics_unit",
        "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 41,
        "messaging.kafka.message.key": "p1",
        "messaging.consumer.group.name": "rhumbatron-analytics-unit",
    }


def test_untraced_a_fold_has_no_span() -> None:
    with no_provider(), point_span(_point([]), "g") as span:
        assert span is None
