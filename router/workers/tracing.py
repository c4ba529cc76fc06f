"""The command worker's spans, after OpenTelemetry's messaging conventions (streams.tracing).

Handling one record of a queue (or of its retry topic) is a CONSUMER span ``process <topic>``
*parented* on the trace context the record carries (``traceparent``/``tracestate``, under the
propagator's own names), so a command stays in the trace of the event that caused it. Each record
the worker sends on for it — its retry, its next delivery, its dead letter — is a PRODUCER span
``publish <topic>``, a child of the handling, whose context replaces the trace headers the record
came with: the next handling (the retry's, the dead-letter consumer's, the one after an
operator's retry, which sends the letter's headers back) continues the same trace. The spans end
when the worker's transaction settles; a failed attempt records its error, status ERROR with the
text its retry or dead letter carries.

Tracing off (no SDK provider installed: :func:`streams.tracing.active`) the worker asks once per
chunk and nothing here runs: no span, no context extraction, no header rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from consumers.runtime.types import OutRecord, Record
from router.workers.model import WorkerPolicy
from streams import tracing as t
from streams.envelopes import Command

TRACER = "rhumbatron.worker"

QUEUE = "rhumbatron.queue"
ATTEMPT = "rhumbatron.attempt"
COMMAND_ID = "rhumbatron.command_id"
COMMAND_TYPE = "rhumbatron.command_type"


def tracer() -> trace.Tracer | None:
    """The worker's tracer when tracing is on, else None (asked once per chunk)."""
    return t.tracer(TRACER) if t.active() else None


def process_span(
    tracer: trace.Tracer, record: Record, policy: WorkerPolicy, group: str | None, attempt: int
) -> Span:
    """The CONSUMER span of one record's handling (started, not current)."""
    span = tracer.start_span(
        f"process {record.topic}",
        context=t.context_of(record.headers),
        kind=SpanKind.CONSUMER,
        attributes={
            t.MESSAGING_SYSTEM: t.KAFKA,
            t.OPERATION_TYPE: t.PROCESS,
            t.DESTINATION: record.topic,
            t.PARTITION: str(record.partition),
            t.OFFSET: record.offset,
            QUEUE: policy.purpose,
            ATTEMPT: attempt,
        },
    )
    if record.key is not None:
        span.set_attribute(t.MESSAGE_KEY, record.key.decode("utf-8", "replace"))
    if group is not None:
        span.set_attribute(t.CONSUMER_GROUP, group)
    return span


def describe(span: Span, command: Command) -> None:
    span.set_attributes(
        {
            COMMAND_ID: command.command_id,
            COMMAND_TYPE: command.command_type,
            t.PROJECT: command.project_id,
        }
    )


def settle(
    tracer: trace.Tracer,
    span: Span,
    outcome: str,
    sends: list[OutRecord],
    error: BaseException | None,
    error_text: str | None,
) -> tuple[list[OutRecord], list[Span]]:
    """Record the handling's outcome (and its error) on ``span``; the records it sends, each
    carrying the context of its own PRODUCER span, and those spans (started)."""
    span.set_attribute(t.OUTCOME, outcome)
    if error is not None:
        failed(span, error, error_text or str(error))
    traced: list[OutRecord] = []
    spans: list[Span] = []
    for out in sends:
        send = tracer.start_span(
            f"publish {out.topic}",
            context=t.span_in(span),
            kind=SpanKind.PRODUCER,
            attributes={
                t.MESSAGING_SYSTEM: t.KAFKA,
                t.OPERATION_TYPE: t.SEND,
                t.DESTINATION: out.topic,
                t.MESSAGE_KEY: out.key,
            },
        )
        traced.append(replace(out, headers=t.with_context(out.headers, t.span_in(send))))
        spans.append(send)
    return traced, spans


def failed(span: Span, error: BaseException, text: str) -> None:
    span.record_exception(error)
    span.set_status(StatusCode.ERROR, text)


def end(spans: Iterable[Span], *, committed: bool) -> None:
    """End a settled chunk's spans; when its transaction aborted each says so (its records are
    read again, each in a span of its own)."""
    for span in spans:
        if not committed:
            span.set_status(StatusCode.ERROR, "the transaction aborted; the record is read again")
        span.end()
