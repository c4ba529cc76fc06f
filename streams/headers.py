"""Every Kafka record header Rhumbatron writes or reads, and the one way to read them.

A header name is written here once and imported everywhere else (tests/streams/test_headers.py
fails on an ``rh.``/``dlq.`` literal anywhere else in the code). docs/events.md has the table: each
header, what it carries, who writes it, who reads it.

Every header of ours that is not an identity header starts with ``rh.`` (:data:`PREFIX`): a record
sent on — a retry, a dead letter, an operator's retry — drops the ones of ours it had and is given
fresh ones, while the headers it came with from elsewhere travel untouched.

The dead-letter store's topic once wrote the same facts under ``dlq.*`` names; those are still
read (:data:`LEGACY`), always through :func:`header`, so no reader has to know them.
"""

from __future__ import annotations

from collections.abc import Iterable

# -- identity: on every event and command the producers write ---------------------------------
# Written by streams.producer (event_headers, command_headers) and the outbox dispatcher, so a
# reader can route or filter on a record without decoding its value. The trace context
# (``traceparent`` …) travels beside them under the names the OpenTelemetry propagator chooses.
EVENT_TYPE = "event_type"
EVENT_ID = "event_id"
COMMAND_TYPE = "command_type"
COMMAND_ID = "command_id"
CONTENT_TYPE = "content_type"  # always application/json
# The identity of the outbox an event was published from (``obx_`` + 16 hex, stored in that
# outbox's database: streams.outbox.identity), written by the outbox publisher alone, so a
# consumer can keep its claims per (outbox, project) slot; read with
# streams.outbox.identity.outbox_position. Events produced any other way carry none. An identity
# header, not ``rh.``: it must travel with the event when the event is sent on (an operator's
# retry of its dead letter).
OUTBOX = "outbox"

# -- the runtime's effect id ------------------------------------------------------------------
# Written by the subscription runtime's outputs (consumers.runtime.kafka_transport and its memory
# twin) on every record an effect sends; read by its recovery, which looks for a pending copy's
# records on the output topics when the transaction marker is gone. A record sent on by a worker
# gets a new one.
RECORD_ID = "record_id"

# -- the analytics projector's points ---------------------------------------------------------
# Written by consumers.subscriptions.analytics.projector on each point of the metrics topic, so a
# reader can pick a metric without decoding the point; the rollup reads the point's own field.
METRIC = "metric"

PREFIX = "rh."

# -- a command's delivery: written by the command worker (router.workers.outgoing) ------------
ATTEMPT = "rh.retry.attempt"  # the attempt (delivery) this record is, 1-based; absent = 1
DUE_MS = "rh.retry.due_ms"  # epoch milliseconds before which a retry record must not run

# -- why a record failed: the worker on retries and dead letters, the dead-letter store on its
# -- topic; read by the dead-letter consumer (router.workers.dead_letter_consumer) ------------
ERROR = "rh.error"  # the last error's text, truncated to error_max_bytes
ERROR_TYPE = "rh.error_type"  # the last error's class name
ATTEMPTS = "rh.retry.attempts"  # on a dead letter: the attempts made before it gave up

# -- where a record came from: the worker on dead letters, the dead-letter store on its topic,
# -- the operator's retry on redelivered events (consumers.runtime.dead_letter_ops); read by the
# -- dead-letter consumer and, on a redelivery topic, by the subscription runtime -------------
ORIGIN_TOPIC = "rh.origin_topic"
ORIGIN_PARTITION = "rh.origin_partition"
ORIGIN_OFFSET = "rh.origin_offset"
ORIGIN_QUEUE = "rh.origin_queue"  # the queue purpose a command was dead-lettered from

# -- the dead letter itself --------------------------------------------------------------------
# Written by the worker on a command's dead letter; read by the dead-letter consumer.
DEAD_LETTER_REASON = "rh.dead_letter_reason"  # failed | expired | undecodable
# Written by the operator's retry on what it sends back; read by the dead-letter consumer, which
# re-opens that letter when the command fails again. The worker carries it into a retry.
OPERATOR_RETRY = "rh.dead_letter"  # the id of the dead letter this record was retried from
# Written by the dead-letter store on its topic (consumers.runtime.dead_letters), beside the
# entry's original headers; read by people and tools inspecting the topic.
DEAD_LETTER_ID = "rh.dead_letter_id"
DEAD_LETTER_KIND = "rh.dead_letter_kind"  # event-batch | poison | command
SUBSCRIPTION = "rh.subscription"  # the subscription that dead-lettered the events
# Written by the dead-letter store on its topic instead of an entry's value and headers when the
# record would be too large for the topic (the sizes left out; the Redis index keeps them whole).
DEAD_LETTER_CUT = "rh.dead_letter_cut"

# -- legacy names, still read ----------------------------------------------------------------
# The dead-letter store's topic wrote these until the vocabulary became one. Its records are kept
# for dead_letter_retention_ms (30 days by default); no other topic ever carried them. Remove this
# map once every record written before the change has aged out: dead_letter_retention_ms after the
# release that stopped writing them (the longest retention that can hold them).
LEGACY: dict[str, str] = {
    "dlq.id": DEAD_LETTER_ID,
    "dlq.kind": DEAD_LETTER_KIND,
    "dlq.reason": ERROR,  # it carried the error text, not the failed/expired category
    "dlq.error_type": ERROR_TYPE,
    "dlq.attempts": ATTEMPTS,
    "dlq.source_topic": ORIGIN_TOPIC,
    "dlq.source_partition": ORIGIN_PARTITION,
    "dlq.source_offset": ORIGIN_OFFSET,
    "dlq.subscription": SUBSCRIPTION,
    "dlq.origin_queue": ORIGIN_QUEUE,
}
_LEGACY_OF = {new: tuple(o for o, n in LEGACY.items() if n == new) for new in LEGACY.values()}

# A header may have no value (Kafka allows it; no producer of ours writes one).
Headers = Iterable[tuple[str, bytes | None]]


def is_ours(name: str) -> bool:
    """A header of ours that describes a delivery (not an identity header): under any name, new
    or legacy, it is dropped from a record sent on and written afresh."""
    return name.startswith(PREFIX) or name in LEGACY


def header(headers: Headers, name: str) -> bytes | None:
    """The first value under ``name``, else under a legacy name of it; None when neither is
    there."""
    legacy: bytes | None = None
    olds = _LEGACY_OF.get(name, ())
    for k, v in headers:
        if k == name:
            return v
        if legacy is None and k in olds:
            legacy = v
    return legacy


def header_text(headers: Headers, name: str) -> str | None:
    raw = header(headers, name)
    return raw.decode("utf-8", "replace") if raw is not None else None


def header_int(headers: Headers, name: str, default: int) -> int:
    """The header as an integer; ``default`` when absent or not a number."""
    raw = header(headers, name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def header_dict(headers: Headers) -> dict[str, bytes | None]:
    """Name -> value, the first value of a repeated name (as :func:`header` reads it), a legacy
    name under its new one unless the new one is there too."""
    out: dict[str, bytes | None] = {}
    for k, v in headers:
        out.setdefault(k, v)
    for old, new in LEGACY.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    return out
