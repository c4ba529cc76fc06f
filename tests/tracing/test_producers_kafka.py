"""Where traces start: ``produce`` sends each event inside a span of its own with a PRODUCER span
per record, and ``produce --outbox`` writes each transaction inside a span of the writer's own;
tracing off, no record carries a trace context and nothing breaks."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import Message
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from router.settings import Settings
from router.wiring.outbox import build_publisher, open_outbox
from router.wiring.provisioning import provision_environment
from streams import tracing as t
from streams.headers import EVENT_ID, header
from streams.producer import Producer, send_to_streams
from streams.workload import slotted_events, workload, write_workload
from tests.support.kafka import read_all
from tests.support.tracing import by_name, hex_id, no_provider

pytestmark = pytest.mark.integration


def _headers(message: Message) -> list[tuple[str, bytes]]:
    return cast(list[tuple[str, bytes]], message.headers() or [])


def _mine(s: Settings, run: str, expect: int) -> list[Message]:
    found = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=expect)
    return [m for m in found if run.encode() in (m.key() or b"")]


def test_produce_starts_a_trace_per_event_with_a_producer_span_per_record(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    provision_environment(settings)
    run = uuid.uuid4().hex[:8]
    events = slotted_events(workload(run, 2, 4), tenant_id="tenant-t")
    send_to_streams(
        Producer(settings.kafka_config()),
        events,
        stream_for=settings.topology.stream_for,
        max_bytes=settings.max_envelope_bytes,
        flush_timeout=30,
    )
    finished = spans.get_finished_spans()
    roots = {x.context.span_id: x for x in finished if x.name.startswith("produce ")}
    publishes = {x.context.span_id: x for x in finished if x.name.startswith("publish ")}
    assert len(roots) == len(publishes) == len(events)
    assert all(r.parent is None for r in roots.values())
    assert len({r.context.trace_id for r in roots.values()}) == len(events)  # one per event
    for publish in publishes.values():
        assert publish.kind is SpanKind.PRODUCER
        assert publish.parent is not None and publish.parent.span_id in roots
        a = dict(publish.attributes or {})
        assert a[t.MESSAGING_SYSTEM] == "kafka"
        assert publish.name == f"publish {a[t.DESTINATION]}"
        assert isinstance(a[t.OFFSET], int) and a[t.PARTITION] is not None
    for message in _mine(settings, run, len(events)):
        raw = header(_headers(message), t.TRACEPARENT)
        assert raw is not None
        _, trace_id, parent, _ = raw.decode().split("-")
        span = publishes[int(parent, 16)]
        assert hex_id(span.context.trace_id, 32) == trace_id
        event_id = header(_headers(message), EVENT_ID)
        assert (
            event_id is not None and dict(span.attributes or {})[t.MESSAGE_ID] == event_id.decode()
        )


def test_produce_to_the_outbox_writes_each_transaction_in_a_span_of_its_own(
    settings: Settings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    store = open_outbox(settings, tmp_path / "outbox.sqlite", create=True)
    try:
        report = write_workload(store, workload("w", 3, 9), writers=2, events_per_write=2)
        rows = store.sendable(100, 100, None)
    finally:
        store.close()
    finished = spans.get_finished_spans()
    roots = {x.context.span_id: x for x in finished if x.name.startswith("write ")}
    assert len(roots) == report.writes
    assert all(r.parent is None for r in roots.values())
    writes = by_name(finished, "outbox.write")
    traced = [w for w in writes if w.parent is not None and w.parent.span_id in roots]
    assert len(traced) == report.writes  # the table's own set-up transaction is not a write
    # Each row keeps its writer's context: the publish continues that trace.
    contexts = {w.context.span_id: w.context.trace_id for w in traced}
    for row in rows:
        _, trace_id, parent, _ = row.trace_context["traceparent"].split("-")
        assert contexts[int(parent, 16)] == int(trace_id, 16)


def test_with_tracing_off_no_record_carries_a_trace_context(
    settings: Settings, tmp_path: Path
) -> None:
    provision_environment(settings)
    with no_provider():
        assert not t.active()
        run = uuid.uuid4().hex[:8]
        events = slotted_events(workload(run, 1, 3), tenant_id="tenant-t")
        send_to_streams(
            Producer(settings.kafka_config()),
            events,
            stream_for=settings.topology.stream_for,
            max_bytes=settings.max_envelope_bytes,
            flush_timeout=30,
        )
        store = open_outbox(settings, tmp_path / "outbox.sqlite", create=True)
        try:
            outboxed = f"{run}-outbox"
            write_workload(store, workload(outboxed, 1, 3), writers=1, events_per_write=3)
            assert all(not r.trace_context for r in store.sendable(100, 100, None))
            with build_publisher(settings, store) as publisher:
                publisher.run(until_empty=True)
        finally:
            store.close()
        found = _mine(settings, run, 6)
        assert len(found) == 6
        for message in found:
            names = {k for k, _ in _headers(message)}
            assert not names & {t.TRACEPARENT, t.TRACESTATE}, names
