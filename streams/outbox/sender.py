"""The producer boundary of the publisher: :class:`EventSender`, and its Kafka implementation.

Why the publisher abandons records itself instead of letting librdkafka time them out: with the
idempotent producer, librdkafka's ``message.timeout.ms`` expires queued records one by one, and
a later record of the same partition whose deadline has not yet passed can still be written
after an earlier one expired — a gap (librdkafka INTRODUCTION.md, "Message timeout
considerations"; ``enable.gapless.guarantee`` explicitly does not cover it). So the producer runs
with no local timeout (``message.timeout.ms=0``), and when a record stays unacknowledged past
``outbox_delivery_timeout_s`` the publisher purges *everything* outstanding at once. What reached
the broker is then, per partition, a prefix of what was sent (one producer epoch, sequence
numbers in order), so re-sending from the first unacknowledged row of each project can only add
duplicates after their originals, never put a later slot first.

A fatal producer error (``enable.gapless.guarantee`` turns a failed batch into one; so do fencing
and idempotence desync) makes the sender ``broken``: its reports still arrive, then the
publisher builds a new sender.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from streams.errors import Unreachable
from streams.producer import DeliveryCallback, DeliveryReport, Headers, Producer

log = logging.getLogger("rhumbatron.outbox.sender")


class EventSender(Protocol):
    """What the publisher sends through. Kafka in production; tests wrap it to inject faults."""

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        """Hand one record over. Its fate arrives at ``on_delivery`` exactly once: during a later
        :meth:`poll`, or at once if the record could not even be queued."""

    def poll(self, timeout: float) -> None:
        """Serve delivery reports, waiting up to ``timeout`` seconds for the first one."""

    def outstanding(self) -> int:
        """Records handed over whose report has not been served yet."""

    def abandon(self) -> None:
        """Give up on every outstanding record now (queued and in flight); their reports (an
        outage error) arrive through :meth:`poll`."""

    @property
    def broken(self) -> bool:
        """The sender hit a fatal error: finish serving reports, then replace it."""

    def missing_streams(self, topics: Iterable[str]) -> set[str]:
        """Those of ``topics`` the broker is known not to have. When the broker cannot be asked,
        nothing is known to be missing (the send itself will surface the outage)."""

    def close(self) -> None: ...


# How long one metadata request may take when checking that streams exist; short, because an
# unanswered request only means "unknown" and the send path handles outages itself.
METADATA_TIMEOUT_S = 5.0


class KafkaSender:
    """An idempotent (``acks=all``) producer; ``gapless`` adds ``enable.gapless.guarantee``."""

    def __init__(
        self,
        base: Mapping[str, Any],
        *,
        gapless: bool,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        config: dict[str, Any] = {"message.timeout.ms": 0}  # no local expiry; see module doc
        config.update(extra or {})
        self._producer = Producer(base, gapless=gapless, extra=config)
        self._broken = False
        self._known: set[str] = set()

    @property
    def broken(self) -> bool:
        return self._broken

    def _fatal(self, error: KafkaError) -> None:
        if not self._broken:
            log.error("producer hit a fatal error and will be replaced: %s", error.str())
        self._broken = True

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        def report(delivery: DeliveryReport) -> None:
            error = delivery.error
            if error is not None and (error.fatal() or error.code() == KafkaError._FATAL):
                self._fatal(error)
            on_delivery(delivery)

        try:
            self._producer.produce(topic, value, key=key, headers=headers, on_delivery=report)
        except KafkaException as exc:  # raised by the poll the wrapper runs when its queue is full
            error: KafkaError = exc.args[0]
            if error.fatal():
                self._fatal(error)
            report(DeliveryReport(topic, -1, -1, key, error))
        except Unreachable as exc:
            report(DeliveryReport(topic, -1, -1, key, KafkaError(KafkaError._QUEUE_FULL, str(exc))))

    def poll(self, timeout: float) -> None:
        try:
            self._producer.poll(timeout)
        except KafkaException as exc:
            # confluent-kafka raises a fatal error from poll() before serving the reports.
            error: KafkaError = exc.args[0]
            if not error.fatal():
                raise
            self._fatal(error)

    def outstanding(self) -> int:
        return self._producer.pending()

    def abandon(self) -> None:
        if self._producer.pending():
            self._producer.inner.purge(in_queue=True, in_flight=True, blocking=True)

    def missing_streams(self, topics: Iterable[str]) -> set[str]:
        unknown = set(topics) - self._known
        if not unknown:
            return set()
        try:
            metadata = self._producer.inner.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("could not check which streams exist (%s); sending anyway", exc)
            return set()
        present = {name for name, topic in metadata.topics.items() if topic.error is None}
        self._known |= present & unknown
        return unknown - present

    def close(self) -> None:
        # Nothing outstanding here is lost: rows are marked only after their acknowledgement.
        if self._producer.pending():
            self.abandon()
            self._producer.poll(0)
        self._producer.close(0)


SenderFactory = Callable[[], EventSender]
