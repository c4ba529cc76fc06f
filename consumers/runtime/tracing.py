"""The runtime's spans (OpenTelemetry messaging conventions, streams/tracing.py).

- each partition's slice of a polled batch is a CONSUMER span ``process <topic>``, *linked* to
  every record's producer context (a batch has many parents, so none is its parent);
- each fresh event's apply (``reduce`` + ``process``) is a CONSUMER span ``apply <event type>``
  *parented on its producer's context*, so the event's own trace goes on through this
  subscription; it is current while the processor runs, and the runtime writes its context into
  the headers of every Kafka record the event causes (a router's command), so whoever handles
  that record continues the same trace. Its ``rhumbatron.outcome``: ``applied``, ``duplicate``,
  ``failed`` (the error recorded, status ERROR with the text the dead letter would carry) or
  ``dead-lettered`` (the failure that exhausted the batch's attempts; a poison record too).

Per partition rather than one span per poll: a poll spans several streams and partitions, and a
span per partition names its destination and partition as the conventions ask.

Tracing off (no SDK provider, :func:`streams.tracing.active`), :meth:`TracingMixin._traces`
returns None once per partition slice and nothing below runs: no attributes, no context
extraction, no headers. Tracing on under the default parent-based sampler, a record whose
producer's trace is unsampled gets no span either (it would record nothing): its context is
current while it applies and goes on as it came into the records it causes, so its trace stays
unsampled all the way down; a batch links only the sampled producers (the others are never
exported).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass, field, replace

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags

from consumers.runtime.runner_base import RunnerBase
from consumers.runtime.types import TP, EffectKind, OutRecord, Record
from streams import tracing as t
from streams.envelopes import Event

TRACER = "rhumbatron.runtime"


@dataclass
class BatchTraces:
    """One partition slice's tracing: the tracer, each record's producer context (by ``id``)
    and the apply spans of failed events, ended once the batch's failure handling has decided
    (failed, or dead-lettered)."""

    tracer: trace.Tracer
    contexts: dict[int, Context | None]
    # Records whose producer's trace is not sampled, under a parent-based sampler: their applies
    # would record nothing, so they get no span, only their trace context passed on as it came
    # (the cost of a 1 % sample is then close to that of none).
    unsampled: dict[int, tuple[tuple[str, bytes], ...]] = field(default_factory=dict)
    failing: dict[int, trace.Span] = field(default_factory=dict)
    _current: tuple[trace.Span, Token[Context]] | None = None
    _passing: tuple[tuple[str, bytes], ...] | None = None  # an unsampled apply's own headers
    _token: Token[Context] | None = None

    def apply_span(self, slug: str, record: Record, event: Event, *, offset: int) -> trace.Span:
        return self.tracer.start_span(
            f"apply {event.event_type}",
            context=self.contexts.get(id(record)),
            kind=SpanKind.CONSUMER,
            attributes={
                t.MESSAGING_SYSTEM: t.KAFKA,
                t.OPERATION_TYPE: t.PROCESS,
                t.OPERATION_NAME: "apply",
                t.DESTINATION: record.topic,
                t.PARTITION: str(record.partition),
                t.OFFSET: offset,
                t.MESSAGE_ID: event.event_id,
                t.MESSAGE_KEY: event.project_id,
                t.SUBSCRIPTION: slug,
                t.EVENT_ID: event.event_id,
                t.EVENT_TYPE: event.event_type,
                t.PROJECT: event.project_id,
            },
        )

    def start(self, slug: str, record: Record, event: Event, *, offset: int) -> None:
        """An event's apply begins: its span, current until :meth:`applied` or :meth:`fail`
        (for an unsampled trace, its producer's context)."""
        passing = self.unsampled.get(id(record))
        if passing is not None:
            self._passing = passing
            remote = _remote(passing)
            if remote is not None:
                self._token = context.attach(remote)
            return
        span = self.apply_span(slug, record, event, offset=offset)
        self._current = (span, context.attach(trace.set_span_in_context(span)))

    def _leave(self) -> trace.Span | None:
        self._passing = None
        if self._token is not None:
            token, self._token = self._token, None
            context.detach(token)
        if self._current is None:
            return None
        span, token = self._current
        self._current = None
        context.detach(token)
        return span

    def effects(self, records: list[OutRecord]) -> list[OutRecord]:
        """The records the current apply produced, with its trace context in their headers."""
        if self._current is not None:
            return with_trace(records, self._current[0])
        if self._passing is not None:
            names = _FIELDS | {k for k, _ in self._passing}
            passing = self._passing
            return [
                replace(r, headers=(*((k, v) for k, v in r.headers if k not in names), *passing))
                for r in records
            ]
        return records

    def applied(self) -> None:
        span = self._leave()
        if span is not None:
            span.set_attribute(t.OUTCOME, t.APPLIED)
            span.end()

    def interrupted(self) -> None:
        """The batch stopped inside an apply (this process lost the partition)."""
        span = self._leave()
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, "interrupted: the partition was lost"))
            span.end()

    def skipped(
        self,
        slug: str,
        record: Record,
        event: Event | None,
        outcome: str,
        *,
        offset: int,
        error: BaseException | None = None,
    ) -> None:
        """A span for an event not applied: a duplicate, or a poison record dead-lettered."""
        if id(record) in self.unsampled:
            return
        if event is not None:
            span = self.apply_span(slug, record, event, offset=offset)
        else:
            span = self.tracer.start_span(
                "apply undecodable",
                context=self.contexts.get(id(record)),
                kind=SpanKind.CONSUMER,
                attributes={
                    t.MESSAGING_SYSTEM: t.KAFKA,
                    t.DESTINATION: record.topic,
                    t.PARTITION: str(record.partition),
                    t.OFFSET: offset,
                    t.SUBSCRIPTION: slug,
                },
            )
        span.set_attribute(t.OUTCOME, outcome)
        if error is not None:  # a poison record: the text its dead letter carries
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

    def fail(self, record: Record, error: BaseException) -> None:
        """An apply that raised: recorded, kept open until the failure is handled."""
        span = self._leave()
        if span is None:
            return
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, reason(error)))
        span.set_attribute(t.OUTCOME, t.FAILED)
        self.failing[id(record)] = span

    def dead_lettered(self, records: Sequence[Record], letter_id: str) -> None:
        for record in records:
            span = self.failing.pop(id(record), None)
            if span is not None:
                span.set_attribute(t.OUTCOME, t.DEAD_LETTERED)
                span.add_event("dead-lettered", {"rhumbatron.dead_letter_id": letter_id})
                span.end()

    def close(self) -> None:
        for span in self.failing.values():
            span.end()
        self.failing.clear()


_FIELDS = frozenset({t.TRACEPARENT, t.TRACESTATE})


def _remote(headers: tuple[tuple[str, bytes], ...]) -> Context | None:
    """An unsampled producer's context, made current while its event applies (so what the
    processor writes itself, an outbox row, carries it), without the propagator's full parse."""
    for k, v in headers:
        if k == t.TRACEPARENT:
            try:
                trace_id, span_id = int(v[3:35], 16), int(v[36:52], 16)
            except ValueError:
                return None
            span = trace.NonRecordingSpan(
                trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(0))
            )
            return trace.set_span_in_context(span)
    return None


def reason(error: BaseException) -> str:
    """The error as a batch's dead letter states it (consumers.runtime.failures)."""
    return f"{type(error).__name__}: {error}"


def with_trace(records: Sequence[OutRecord], span: trace.Span) -> list[OutRecord]:
    """The records an event's apply produced, carrying that apply's trace context."""
    context = trace.set_span_in_context(span)
    return [replace(r, headers=t.with_context(r.headers, context)) for r in records]


class TracingMixin(RunnerBase):
    _batch_traces: list[BatchTraces]

    def _traces(self, records: Sequence[Record]) -> BatchTraces | None:
        """The tracing of one partition slice: None when tracing is off."""
        if not t.active():
            return None
        parent_based = t.parent_based()
        found = BatchTraces(t.tracer(TRACER), {})
        for r in records:
            if parent_based:
                raw = r.header(t.TRACEPARENT)
                if raw is not None and t.unsampled(raw):
                    found.unsampled[id(r)] = tuple((k, v) for k, v in r.headers if k in _FIELDS)
                    continue
            found.contexts[id(r)] = t.context_of(r.headers)
        if not hasattr(self, "_batch_traces"):
            self._batch_traces = []
        self._batch_traces.append(found)
        return found

    @contextmanager
    def _batch_span(self, tp: TP, traces: BatchTraces | None, count: int) -> Iterator[None]:
        if traces is None:
            yield
            return
        links = []
        for ctx in traces.contexts.values():
            if ctx is not None:
                linked = trace.get_current_span(ctx).get_span_context()
                if linked.is_valid:
                    links.append(Link(linked))
        group = getattr(self.transport, "group_id", None)
        attributes: dict[str, str | int] = {
            t.MESSAGING_SYSTEM: t.KAFKA,
            t.OPERATION_TYPE: t.PROCESS,
            t.OPERATION_NAME: t.PROCESS,
            t.DESTINATION: tp.topic,
            t.PARTITION: str(tp.partition),
            t.BATCH_COUNT: count,
            t.SUBSCRIPTION: self.processor.slug,
        }
        if group:
            attributes[t.CONSUMER_GROUP] = group
        with traces.tracer.start_as_current_span(
            f"process {tp.topic}",
            context=Context(),  # a root of its own: its records' producers are its links
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ):
            try:
                yield
            finally:
                traces.interrupted()  # before the batch span's own context is left

    def _traced_effects(
        self, traces: BatchTraces | None, records: list[OutRecord]
    ) -> list[OutRecord]:
        """An applied event's Kafka records, with its apply's trace context in their headers."""
        if traces is None or not records or self.processor.effect_kind != EffectKind.KAFKA:
            return records
        return traces.effects(records)

    def _traces_dead_lettered(self, records: Sequence[Record], letter_id: str) -> None:
        for traces in getattr(self, "_batch_traces", ()):
            traces.dead_lettered(records, letter_id)

    def _close_traces(self) -> None:
        for traces in getattr(self, "_batch_traces", ()):
            traces.close()
        self._batch_traces = []
