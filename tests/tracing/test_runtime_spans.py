"""The subscription runtime's spans on the memory twin: a CONSUMER ``process <topic>`` span per
partition slice, linked to every record's producer; an ``apply`` span per event, parented on its
producer and current while the processor runs; the trace context of that apply in the headers of
every Kafka record the event caused; duplicates, failures and dead letters with their outcome."""

from __future__ import annotations

from typing import ClassVar

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from consumers.runtime.types import JSON, Record
from streams import tracing as t
from streams.envelopes import Event, encode
from tests.support.runtime_harness import LIMIT, OUT, Counter, World, event
from tests.support.tracing import by_name, hex_id, installed_provider, no_provider


def _producer() -> trace.Tracer:
    return trace.get_tracer("test-producer")  # at use: each test installs its own provider


def _send(world: World, ev: Event) -> tuple[trace.SpanContext, int]:
    """The event published under a PRODUCER span of the test's own, as the publisher does."""
    tp = world.tp_of(ev.project_id)
    with _producer().start_as_current_span(f"publish {tp.topic}", kind=SpanKind.PRODUCER) as span:
        headers = tuple(t.carrier())
    offset = world.log.append(
        tp.topic, tp.partition, encode(ev, max_bytes=LIMIT), ev.project_id.encode(), headers
    )
    return span.get_span_context(), offset


def _traceparent(record: Record) -> str | None:
    raw = record.header(t.TRACEPARENT)
    return raw.decode() if raw is not None else None


def test_a_batch_links_its_producers_and_each_apply_continues_its_events_trace(
    spans: InMemorySpanExporter,
) -> None:
    world = World()
    events = [event("alpha", 1), event("alpha", 2)]
    sent = [_send(world, ev) for ev in events]
    runner = world.runner(Counter())
    world.drain(runner)

    finished = spans.get_finished_spans()
    [batch] = [s for s in finished if s.name.startswith("process ")]
    tp = world.tp_of("alpha")
    assert batch.name == f"process {tp.topic}" and batch.kind is SpanKind.CONSUMER
    assert batch.parent is None
    assert {link.context.span_id for link in batch.links} == {c.span_id for c, _ in sent}
    attrs = dict(batch.attributes or {})
    assert attrs[t.MESSAGING_SYSTEM] == "kafka"
    assert attrs[t.DESTINATION] == tp.topic
    assert attrs[t.PARTITION] == str(tp.partition)
    assert attrs[t.BATCH_COUNT] == 2
    assert attrs[t.CONSUMER_GROUP] == "group-counter"
    assert attrs[t.SUBSCRIPTION] == "counter"

    applies = by_name(finished, "apply task.completed")
    assert len(applies) == 2
    for (producer, offset), ev, apply in zip(sent, events, applies, strict=True):
        assert apply.kind is SpanKind.CONSUMER
        assert apply.parent is not None and apply.parent.span_id == producer.span_id
        assert apply.context.trace_id == producer.trace_id
        a = dict(apply.attributes or {})
        assert a[t.OUTCOME] == "applied"
        assert a[t.EVENT_ID] == ev.event_id and a[t.EVENT_TYPE] == ev.event_type
        assert a[t.PROJECT] == "alpha" and a[t.SUBSCRIPTION] == "counter"
        assert a[t.OFFSET] == offset and a[t.PARTITION] == str(tp.partition)

    # The records the events caused carry their apply's context: the trace goes on.
    out = world.log.all(OUT)
    assert len(out) == 2
    for record, apply in zip(out, applies, strict=True):
        trace_id, span_id = hex_id(apply.context.trace_id, 32), hex_id(apply.context.span_id, 16)
        _version, in_trace, parent, flags = (_traceparent(record) or "").split("-")
        assert (in_trace, parent) == (trace_id, span_id)
        assert int(flags, 16) & 1  # sampled, as its root was
        assert record.header("record_id") is not None  # the runtime's own header is still there


def test_a_duplicate_gets_its_span_with_that_outcome(spans: InMemorySpanExporter) -> None:
    world = World()
    ev = event("alpha", 1)
    _send(world, ev)
    _send(world, ev)  # the same event twice on the stream
    world.drain(world.runner(Counter()))
    outcomes = [
        str(dict(s.attributes or {})[t.OUTCOME])
        for s in by_name(spans.get_finished_spans(), "apply task.completed")
    ]
    assert sorted(outcomes) == ["applied", "duplicate"]
    assert len(world.log.all(OUT)) == 1


class Refusing(Counter):
    slug: ClassVar[str] = "refusing"

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        if event.payload.get("drill") == "fail":
            raise ValueError(f"no, not {event.event_id}")
        return super().reduce(state, event)


def test_failures_are_recorded_and_the_last_attempt_is_dead_lettered_with_the_letters_reason(
    spans: InMemorySpanExporter,
) -> None:
    world = World()
    bad = event("alpha", 1, fail=True)
    producer, _ = _send(world, bad)
    world.drain(world.runner(Refusing(), max_batch_failures=3))
    [letter] = world.dead.list()
    applies = by_name(spans.get_finished_spans(), "apply task.completed")
    assert len(applies) == 3  # one per attempt
    assert all(s.context.trace_id == producer.trace_id for s in applies)
    outcomes = [dict(s.attributes or {})[t.OUTCOME] for s in applies]
    assert outcomes == ["failed", "failed", "dead-lettered"]
    for span in applies:
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == letter.error
        [exception] = [e for e in span.events if e.name == "exception"]
        assert dict(exception.attributes or {})["exception.type"] == "ValueError"
    assert [e.name for e in applies[-1].events][-1] == "dead-lettered"


def test_a_poison_record_is_dead_lettered_on_its_producers_trace(
    spans: InMemorySpanExporter,
) -> None:
    world = World()
    tp = world.tp_of("alpha")
    with _producer().start_as_current_span("publish", kind=SpanKind.PRODUCER) as producer:
        headers = tuple(t.carrier())
    world.log.append(tp.topic, tp.partition, b"not json", b"alpha", headers)
    world.drain(world.runner(Counter()))
    [poison] = by_name(spans.get_finished_spans(), "apply undecodable")
    assert poison.context.trace_id == producer.get_span_context().trace_id
    assert dict(poison.attributes or {})[t.OUTCOME] == "dead-lettered"
    assert poison.status.status_code is StatusCode.ERROR
    [letter] = world.dead.list()
    assert poison.status.description == letter.error
    assert [e.name for e in poison.events] == ["exception"]


def test_with_tracing_off_no_trace_context_is_written_and_nothing_breaks() -> None:
    with no_provider():
        assert not t.active()
        world = World()
        ev = event("alpha", 1)
        tp = world.tp_of("alpha")
        world.log.append(tp.topic, tp.partition, encode(ev, max_bytes=LIMIT), b"alpha", ())
        world.drain(world.runner(Counter()))
        [record] = world.log.all(OUT)
        assert _traceparent(record) is None and record.header(t.TRACESTATE) is None


def test_an_unsampled_trace_gets_no_spans_but_its_context_goes_on_into_the_commands() -> None:
    # Sampling is decided at the root: a trace its producer did not sample stays unsampled.
    with installed_provider(ParentBased(TraceIdRatioBased(0.0))) as spans:
        world = World()
        sent = [_send(world, event("alpha", n)) for n in (1, 2)]
        assert not any(c.trace_flags.sampled for c, _ in sent)
        world.drain(world.runner(Counter()))
        assert not [s for s in spans.get_finished_spans() if s.name.startswith("apply ")]
        out = world.log.all(OUT)
        assert len(out) == 2
        for record, (producer, _) in zip(out, sent, strict=True):
            trace_id, span_id = hex_id(producer.trace_id, 32), hex_id(producer.span_id, 16)
            assert (
                _traceparent(record) == f"00-{trace_id}-{span_id}-{int(producer.trace_flags):02x}"
            )
