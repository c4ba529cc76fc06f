"""The publisher's PRODUCER spans on the simulated broker: a sampled writer's row is sent under a
``publish <stream>`` span of the writer's trace; an unsampled writer's row, or any row when the
publisher has no provider, gets no span and carries the writer's stored context as it came."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from streams import tracing as t
from streams.outbox.publisher import Publisher
from streams.outbox.sqlite import SqliteOutbox
from streams.producer import DeliveryCallback, Headers
from tests.support.outbox import SimulatedKafka, append_all, drafts, policy, sqlite_outbox
from tests.support.tracing import installed_provider, no_provider

STREAM = "rhumbatron_events_00_t"


class Recording(SimulatedKafka):
    """The simulated broker, keeping each record's headers."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[Headers] = []

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        self.headers.append(list(headers))
        super().produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteOutbox]:
    opened = sqlite_outbox(tmp_path / "outbox.db")
    yield opened
    opened.close()


def _write(store: SqliteOutbox) -> trace.SpanContext:
    with trace.get_tracer("writer").start_as_current_span("service write") as span:
        append_all(store, drafts("proj-a", 2))
    return span.get_span_context()


def _publish(store: SqliteOutbox) -> Recording:
    kafka = Recording()
    with Publisher(store, lambda: kafka, stream_for=lambda p: STREAM, policy=policy()) as p:
        p.run(until_empty=True)
    return kafka


def _traceparents(kafka: Recording) -> list[str]:
    return [dict(h)[t.TRACEPARENT].decode() for h in kafka.headers]


def test_a_sampled_writers_rows_are_sent_under_producer_spans_of_its_trace(
    store: SqliteOutbox,
) -> None:
    with installed_provider() as spans:
        writer = _write(store)
        kafka = _publish(store)
        publishes = [s for s in spans.get_finished_spans() if s.name == f"publish {STREAM}"]
    assert len(publishes) == 2
    assert all(
        s.kind is SpanKind.PRODUCER and s.context.trace_id == writer.trace_id for s in publishes
    )
    ids = {format(s.context.span_id, "016x") for s in publishes}
    assert {tp.split("-")[2] for tp in _traceparents(kafka)} == ids


def test_an_unsampled_writers_rows_get_no_span_and_carry_its_context_as_it_came(
    store: SqliteOutbox,
) -> None:
    with installed_provider(ParentBased(TraceIdRatioBased(0.0))) as spans:
        _write(store)
        stored = [r.trace_context[t.TRACEPARENT] for r in store.sendable(10, 10, None)]
        assert all(t.unsampled(v) for v in stored)
        kafka = _publish(store)
        assert not [s for s in spans.get_finished_spans() if s.name.startswith("publish ")]
    assert _traceparents(kafka) == stored


def test_an_untraced_publisher_sends_the_writers_context_on(store: SqliteOutbox) -> None:
    with installed_provider():
        writer = _write(store)
    with no_provider():
        kafka = _publish(store)
    assert {tp.split("-")[1] for tp in _traceparents(kafka)} == {format(writer.trace_id, "032x")}
