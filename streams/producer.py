"""The one Kafka producer wrapper: thin, lazy, and loud about failures.

- ``acks=all`` and idempotence always; ``partitioner=murmur2_random`` so a producer in any
  language (the Java client, aiokafka) puts a project on the same partition as we do.
- The confluent producer is created on first use; in transactional mode ``init_transactions``
  runs there too.
- Nothing is dropped silently. A record sent with an ``on_delivery`` callback reports its fate to
  that callback (the caller owns it, e.g. the outbox publisher marks its row). A record sent
  without one is tracked here, and :meth:`Producer.flush` raises :class:`DeliveryFailed` listing
  every such record that failed.
- Errors are classified once (:func:`classify`): a *row* error is the record's own fault (too
  large, rejected by the broker); an *outage* is the broker's (unreachable, timed out, not enough
  replicas) and never counts against the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from opentelemetry import propagate, trace

from streams import tracing
from streams.envelopes import Command, Event, encode
from streams.errors import DeliveryFailed, FailedRecord, TransactionFailed, Unreachable
from streams.headers import COMMAND_ID, COMMAND_TYPE, EVENT_ID, EVENT_TYPE
from streams.headers import CONTENT_TYPE as CONTENT_TYPE_HEADER
from streams.kafka_config import bootstrap_of, client_config

log = logging.getLogger("rhumbatron.producer")

CONTENT_TYPE = b"application/json"

# How long produce() keeps polling for room when librdkafka's local queue is full before it
# gives up: long enough to ride out a burst, short enough that a dead broker surfaces as an error.
BUFFER_FULL_WAIT_S = 30.0
# init/commit/abort of a transaction: librdkafka's own default is the transaction timeout; we
# bound it so a fenced or partitioned producer reports instead of hanging a consumer loop.
TRANSACTION_CALL_TIMEOUT_S = 30.0
# A bulk send serves delivery reports every this many records, so their callbacks do not pile up
# in librdkafka's queue until the final flush.
DELIVERY_POLL_EVERY = 1000

Headers = list[tuple[str, bytes]]


class Fault(StrEnum):
    ROW = "row"  # the record itself: retrying the same bytes will fail the same way
    OUTAGE = "outage"  # the broker or the network: not the record's fault
    FATAL = "fatal"  # the producer instance is unusable (fenced, idempotence broken)


_ROW_ERRORS = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.POLICY_VIOLATION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG,
    KafkaError.INVALID_TIMESTAMP,
}


def classify(error: KafkaError) -> Fault:
    if error.fatal():
        return Fault.FATAL
    if error.code() in _ROW_ERRORS:
        return Fault.ROW
    return Fault.OUTAGE


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What a delivery callback receives: where the record landed, or why it did not."""

    topic: str
    partition: int
    offset: int
    key: str | None
    error: KafkaError | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def fault(self) -> Fault | None:
        return None if self.error is None else classify(self.error)

    def describe_error(self) -> str:
        if self.error is None:
            return ""
        return f"{self.error.name()}: {self.error.str()}"


DeliveryCallback = Callable[[DeliveryReport], None]


def event_headers(event: Event) -> Headers:
    headers: Headers = [
        (EVENT_TYPE, event.event_type.encode()),
        (EVENT_ID, event.event_id.encode()),
        (CONTENT_TYPE_HEADER, CONTENT_TYPE),
    ]
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    headers.extend((k, v.encode()) for k, v in carrier.items())
    return headers


def command_headers(command: Command) -> Headers:
    headers: Headers = [
        (COMMAND_TYPE, command.command_type.encode()),
        (COMMAND_ID, command.command_id.encode()),
        (CONTENT_TYPE_HEADER, CONTENT_TYPE),
    ]
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    headers.extend((k, v.encode()) for k, v in carrier.items())
    return headers


def publish_span(
    topic: str, key: str, message_id: str, own: Mapping[str, str]
) -> trace.Span | None:
    """The PRODUCER span ``publish <topic>`` of one record, a child of the current span; None
    when tracing is off."""
    if not tracing.active():
        return None
    return tracing.tracer(__name__).start_span(
        f"publish {topic}",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            tracing.MESSAGING_SYSTEM: tracing.KAFKA,
            tracing.OPERATION_TYPE: tracing.SEND,
            tracing.OPERATION_NAME: "publish",
            tracing.DESTINATION: topic,
            tracing.MESSAGE_KEY: key,
            tracing.MESSAGE_ID: message_id,
            **own,
        },
    )


def _end_publish(span: trace.Span, delivery: DeliveryReport) -> None:
    if delivery.error is None:
        span.set_attribute(tracing.PARTITION, str(delivery.partition))
        span.set_attribute(tracing.OFFSET, delivery.offset)
    else:
        span.set_status(trace.StatusCode.ERROR, delivery.describe_error())
    span.end()


def _is_fatal(error: KafkaError) -> bool:
    """The producer is unusable: its fatal error itself, or a send refused because of one
    (librdkafka then reports ``_FATAL``, "Local: Fatal error", with ``fatal()`` false)."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


class Producer:
    def __init__(
        self,
        base: Mapping[str, Any],
        *,
        transactional_id: str | None = None,
        gapless: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self._config = client_config(
            base, "producer", transactional_id=transactional_id, gapless=gapless, extra=extra
        )
        self._bootstrap = bootstrap_of(base)
        self.transactional_id = transactional_id
        self._inner: confluent_kafka.Producer | None = None
        self._failures: list[FailedRecord] = []
        self._in_transaction = False

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def inner(self) -> confluent_kafka.Producer:
        if self._inner is None:
            self._inner = confluent_kafka.Producer(self._config)
            if self.transactional_id is not None:
                self._call("init_transactions", TRANSACTION_CALL_TIMEOUT_S)
        return self._inner

    def close(self, timeout: float = 10.0) -> None:
        if self._inner is not None:
            if self._in_transaction:
                self.abort()
            self._inner.flush(timeout)
            self._inner = None

    # -- sending -------------------------------------------------------------------------------
    def produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | None,
        # A header may have no value (Kafka allows it): a record sent on keeps it so.
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        on_delivery: DeliveryCallback | None = None,
        span: trace.Span | None = None,
    ) -> None:
        """Send one record. ``span``: its PRODUCER span (:func:`publish_span`), ended when the
        broker has answered."""

        def report(err: KafkaError | None, msg: Any) -> None:
            delivery = DeliveryReport(
                topic=msg.topic() if msg is not None else topic,
                partition=msg.partition() if msg is not None else -1,
                offset=msg.offset() if msg is not None and err is None else -1,
                key=key,
                error=err,
            )
            if span is not None:
                _end_publish(span, delivery)
            if on_delivery is not None:
                on_delivery(delivery)
            elif err is not None:
                self._failures.append(
                    FailedRecord(
                        topic, key, delivery.describe_error(), err.retriable(), _is_fatal(err)
                    )
                )

        kwargs: dict[str, Any] = {
            "value": value,
            "key": key,
            "headers": headers,
            "on_delivery": report,
        }
        if partition is not None:
            kwargs["partition"] = partition
        deadline = time.monotonic() + BUFFER_FULL_WAIT_S
        while True:
            try:
                self.inner.produce(topic, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    if span is not None:
                        span.set_status(trace.StatusCode.ERROR, "the local send queue stayed full")
                        span.end()
                    raise Unreachable(
                        "Kafka",
                        self._bootstrap,
                        f"the local send queue stayed full for {BUFFER_FULL_WAIT_S:g}s",
                    ) from None
                self.inner.poll(0.1)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if span is not None:
                    _end_publish(span, DeliveryReport(topic, -1, -1, key, error))
                if on_delivery is not None:
                    on_delivery(DeliveryReport(topic, -1, -1, key, error))
                    return
                raise DeliveryFailed(
                    [FailedRecord(topic, key, error.str(), error.retriable(), _is_fatal(error))]
                ) from exc

    def produce_event(
        self,
        topic: str,
        event: Event,
        *,
        max_bytes: int,
        on_delivery: DeliveryCallback | None = None,
        partition: int | None = None,
    ) -> None:
        value = encode(event, max_bytes=max_bytes)
        headers = event_headers(event)
        span = publish_span(
            topic,
            event.project_id,
            event.event_id,
            {tracing.EVENT_ID: event.event_id, tracing.EVENT_TYPE: event.event_type},
        )
        if span is not None:
            headers = list(tracing.with_context(headers, tracing.span_in(span)))
        self.produce(
            topic,
            value,
            key=event.project_id,
            headers=headers,
            partition=partition,
            on_delivery=on_delivery,
            span=span,
        )

    def produce_command(
        self,
        topic: str,
        command: Command,
        *,
        max_bytes: int,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        value = encode(command, max_bytes=max_bytes)
        sent = command_headers(command) + list(headers or [])
        span = publish_span(
            topic,
            command.project_id,
            command.command_id,
            {tracing.COMMAND_ID: command.command_id, tracing.COMMAND_TYPE: command.command_type},
        )
        if span is not None:
            sent = list(tracing.with_context(sent, tracing.span_in(span)))
        self.produce(
            topic, value, key=command.project_id, headers=sent, on_delivery=on_delivery, span=span
        )

    def poll(self, timeout: float = 0.0) -> int:
        return int(self.inner.poll(timeout))

    def flush(self, timeout: float) -> None:
        """Wait for every outstanding record. Raises DeliveryFailed for any record sent without
        a callback that failed, or for records still unacknowledged after ``timeout``."""
        remaining = self.inner.flush(timeout) if self._inner is not None else 0
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(
                FailedRecord(
                    "*",
                    None,
                    f"{remaining} record(s) still unacknowledged after {timeout:g}s "
                    f"(is Kafka at {self._bootstrap} up?)",
                    True,
                    False,
                )
            )
        if failures:
            raise DeliveryFailed(failures)

    def pending(self) -> int:
        return len(self.inner) if self._inner is not None else 0

    # -- transactions --------------------------------------------------------------------------
    def begin(self) -> None:
        self._call("begin_transaction")
        self._in_transaction = True

    def send_offsets(self, offsets: Sequence[TopicPartition], group_metadata: Any) -> None:
        self._call(
            "send_offsets_to_transaction", offsets, group_metadata, TRANSACTION_CALL_TIMEOUT_S
        )

    def commit(self) -> None:
        try:
            self._call("commit_transaction", TRANSACTION_CALL_TIMEOUT_S)
        finally:
            self._in_transaction = False
        # Records of a committed transaction were all delivered; nothing to collect.
        self._failures.clear()

    def abort(self) -> None:
        try:
            self._call("abort_transaction", TRANSACTION_CALL_TIMEOUT_S)
        finally:
            self._in_transaction = False
            self._failures.clear()

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    def _call(self, name: str, *args: Any) -> Any:
        tid = self.transactional_id or "?"
        try:
            return getattr(self.inner, name)(*args)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            fenced = error.fatal() or error.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            )
            if fenced:
                self._inner = None  # unusable: the next use builds a fresh instance
                self._in_transaction = False
            raise TransactionFailed(
                tid,
                f"{name}: {error.name()}: {error.str()}",
                fenced=fenced,
                abortable=error.txn_requires_abort(),
            ) from exc


def send_to_streams(
    producer: Producer,
    events: Sequence[Event],
    *,
    stream_for: Callable[[str], str],
    max_bytes: int,
    flush_timeout: float,
) -> dict[str, int]:
    """Send events to their projects' streams and wait for every acknowledgement. Returns the
    count per stream; raises DeliveryFailed if any record was not delivered."""
    counts: dict[str, int] = {}
    # Traced, each event is sent inside a span of its own, as a service writing it would: its
    # trace starts there (sampling is decided there), the PRODUCER span its child.
    tracer = tracing.tracer(__name__) if tracing.active() else None
    for n, event in enumerate(events):
        topic = stream_for(event.project_id)
        if tracer is None:
            producer.produce_event(topic, event, max_bytes=max_bytes)
        else:
            with tracer.start_as_current_span(
                f"produce {event.event_type}",
                attributes={tracing.EVENT_ID: event.event_id, tracing.PROJECT: event.project_id},
            ):
                producer.produce_event(topic, event, max_bytes=max_bytes)
        counts[topic] = counts.get(topic, 0) + 1
        if n % DELIVERY_POLL_EVERY == DELIVERY_POLL_EVERY - 1:
            producer.poll(0)
    producer.flush(flush_timeout)
    return counts
