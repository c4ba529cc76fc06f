"""The trace context on Kafka records, and the messaging attribute names every span uses.

Spans follow the OpenTelemetry messaging semantic conventions: a send is a PRODUCER span
``publish <topic>``, a consumed batch a CONSUMER span ``process <topic>``, with the attributes
named below (as in ``opentelemetry.semconv._incubating.attributes.messaging_attributes``: a test
holds them equal). The context travels in W3C ``traceparent``/``tracestate`` record headers,
written and read only through the global propagator (:func:`inject`, :func:`context_of`).

Tracing off — no SDK tracer provider installed (router/wiring/telemetry.py installs none unless
an exporter is configured) — every span is the API's no-op one; callers check :func:`active`
once per batch or pass and then build no attributes, extract no contexts and write no headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.trace.sampling import ParentBased

# -- messaging semantic conventions (opentelemetry-semantic-conventions, messaging) --------------
MESSAGING_SYSTEM = "messaging.system"
KAFKA = "kafka"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
MESSAGE_KEY = "messaging.kafka.message.key"
OFFSET = "messaging.kafka.offset"
MESSAGE_ID = "messaging.message.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
BATCH_COUNT = "messaging.batch.message_count"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
SEND = "send"  # messaging.operation.type of a publish span
PROCESS = "process"

# -- ours ------------------------------------------------------------------------------------------
SUBSCRIPTION = "rhumbatron.subscription"
EVENT_ID = "rhumbatron.event_id"
EVENT_TYPE = "rhumbatron.event_type"
PROJECT = "rhumbatron.project_id"
COMMAND_ID = "rhumbatron.command_id"
COMMAND_TYPE = "rhumbatron.command_type"
SLOT = "rhumbatron.slot"
OUTCOME = "rhumbatron.outcome"  # of one event's apply: one of the four below
APPLIED = "applied"
DUPLICATE = "duplicate"
FAILED = "failed"
DEAD_LETTERED = "dead-lettered"

# The header names the W3C trace-context propagator writes (the default global propagator's).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

Headers = Sequence[tuple[str, bytes]]


def active() -> bool:
    """Whether an SDK tracer provider is installed: without one every span is a no-op."""
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def parent_based() -> bool:
    """Whether the installed provider samples by the parent (the default, router/wiring/
    telemetry.py): a span under an unsampled parent then records nothing, and a caller may skip
    making it (:func:`unsampled`)."""
    return isinstance(getattr(trace.get_tracer_provider(), "sampler", None), ParentBased)


def unsampled(traceparent: bytes | str) -> bool:
    """A well-formed W3C traceparent (version-trace-span-flags) whose sampled flag is off."""
    raw = traceparent.encode("latin-1") if isinstance(traceparent, str) else traceparent
    if len(raw) != 55 or raw[52:53] != b"-":
        return False
    try:
        return not int(raw[53:55], 16) & 1
    except ValueError:
        return False


def tracer(name: str) -> trace.Tracer:
    """The tracer of ``name``, asked for at use (once per batch or pass), not at import: the
    provider installed then is the one used."""
    return trace.get_tracer(name)


class _HeaderGetter(Getter[Headers]):
    def get(self, carrier: Headers, key: str) -> list[str] | None:
        # Kafka allows a header with no value: it carries no context.
        found = [v.decode("latin-1") for k, v in carrier if k == key and v is not None]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _HeaderGetter()


def context_of(headers: Headers) -> Context | None:
    """The producer's context a record's headers carry; None when they carry none."""
    if not any(k == TRACEPARENT for k, _ in headers):
        return None
    return propagate.extract(headers, getter=_GETTER)


def carrier(context: Context | None = None) -> list[tuple[str, bytes]]:
    """The trace-context headers of ``context`` (default: the current one); none when it holds no
    valid span (tracing off, or no span open)."""
    found: dict[str, str] = {}
    propagate.inject(found, context=context)
    return [(k, v.encode()) for k, v in found.items()]


def with_context(
    headers: Iterable[tuple[str, bytes]], context: Context | None = None
) -> tuple[tuple[str, bytes], ...]:
    """``headers`` with their trace context replaced by ``context``'s (default: the current one).
    Unchanged when that holds no valid span."""
    fresh = carrier(context)
    if not fresh:
        return tuple(headers)
    names = {k for k, _ in fresh} | set(propagate.get_global_textmap().fields)
    return (*((k, v) for k, v in headers if k not in names), *fresh)


def span_in(span: trace.Span) -> Context:
    return trace.set_span_in_context(span)
