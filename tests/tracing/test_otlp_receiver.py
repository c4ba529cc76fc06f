"""The tests' OTLP/HTTP receiver, fed by the real OTLP exporters: spans kept with their service,
ids, parent, links, kind, name and attributes, gzip or not; metrics accepted and kept; a body
that is not OTLP refused with a reason."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from tests.support.otlp import OtlpReceiver


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.NoCompression])
def test_spans_exported_over_otlp_http_arrive_whole(compression: Compression) -> None:
    with OtlpReceiver() as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "rhumbatron-test"}))
        exporter = OTLPSpanExporter(
            endpoint=f"{receiver.endpoint}/v1/traces", compression=compression
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("publish t", kind=SpanKind.PRODUCER) as producer:
            pass
        with (
            tracer.start_as_current_span(
                "process t",
                kind=SpanKind.CONSUMER,
                links=[Link(producer.get_span_context())],
                attributes={"messaging.kafka.offset": 7, "messaging.system": "kafka", "ok": True},
            ) as batch,
            tracer.start_as_current_span("apply task.ready") as child,
        ):
            child.set_attribute("ids", ["a", "b"])
        provider.shutdown()
        spans = {s.name: s for s in receiver.spans()}

    assert set(spans) == {"publish t", "process t", "apply task.ready"}
    published, processed, applied = (
        spans["publish t"],
        spans["process t"],
        spans["apply task.ready"],
    )
    assert {s.service for s in spans.values()} == {"rhumbatron-test"}
    assert published.kind is SpanKind.PRODUCER and processed.kind is SpanKind.CONSUMER
    assert applied.kind is SpanKind.INTERNAL
    assert processed.trace_id == format(batch.get_span_context().trace_id, "032x")
    assert processed.span_id == format(batch.get_span_context().span_id, "016x")
    assert processed.parent_id is None
    assert processed.links == ((published.trace_id, published.span_id),)
    assert processed.attributes == {
        "messaging.kafka.offset": 7,
        "messaging.system": "kafka",
        "ok": True,
    }
    assert applied.parent_id == processed.span_id and applied.trace_id == processed.trace_id
    assert applied.attributes == {"ids": ["a", "b"]}


def test_metrics_are_accepted_and_kept() -> None:
    with OtlpReceiver() as receiver:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{receiver.endpoint}/v1/metrics"),
            export_interval_millis=60_000,
        )
        provider = MeterProvider(metric_readers=[reader])
        provider.get_meter("test").create_counter("rhumbatron_test_total").add(3)
        provider.shutdown()  # exports what it holds
        [request] = receiver.metrics()

    [resource] = request.resource_metrics
    names = [m.name for s in resource.scope_metrics for m in s.metrics]
    assert names == ["rhumbatron_test_total"]


def test_a_body_that_is_not_otlp_is_refused_with_the_reason() -> None:
    with OtlpReceiver() as receiver:
        post = urllib.request.Request(
            f"{receiver.endpoint}/v1/traces",
            data=b"\xff\xff not protobuf",
            headers={"Content-Type": "application/x-protobuf"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 400
        assert b"not OTLP protobuf" in refused.value.read()
        assert receiver.spans() == []
