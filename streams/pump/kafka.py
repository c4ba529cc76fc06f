"""The pump's Kafka side: each batch and the checkpoint after it in one transaction, and the
checkpoint read back.

The checkpoint is a record on the compacted topic ``rhumbatron_pump_checkpoints_<env>`` (one
partition) keyed by the feed, written in the same transaction as the batch it follows, so a
read-committed reader sees a batch exactly when it sees its checkpoint. The transactional id is
stable per feed (``rhumbatron-pump-<env>-<feed hash>``): a second pump of the same feed fences
the first at ``init_transactions()`` (``KafkaSink.open``), which it calls before it reads the
checkpoint, so the checkpoint it reads is the last one any pump committed, and an older pump's
next commit fails instead of publishing."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from streams import failpoints, tracing
from streams.errors import DeliveryFailed, TransactionFailed, Unreachable
from streams.kafka_config import bootstrap_of, client_config, reader_reads_on
from streams.producer import Producer
from streams.pump.identity import Checkpoint
from streams.pump.page import FeedEvent
from streams.topology import check_env, pump_checkpoint_topic

READ_TIMEOUT_S = 30.0  # reading the checkpoint topic to its end


def feed_key(feed: str) -> str:
    """The feed's name in the checkpoint topic: its URL without the query."""
    return feed.split("?", 1)[0].rstrip("/")


def pump_transactional_id(env: str, feed: str) -> str:
    digest = hashlib.sha256(feed_key(feed).encode()).hexdigest()[:16]
    return f"rhumbatron-pump-{check_env(env)}-{digest}"


class KafkaSink:
    def __init__(
        self,
        base: Mapping[str, Any],
        *,
        env: str,
        feed: str,
        stream_for: Callable[[str], str],
        max_envelope_bytes: int,
        failpoint: Callable[[str], None] = failpoints.hit,
    ) -> None:
        self.base = dict(base)
        self.topic = pump_checkpoint_topic(env)
        self.key = feed_key(feed)
        self.stream_for = stream_for
        self.max_envelope_bytes = max_envelope_bytes
        self.failpoint = failpoint
        self.producer = Producer(base, transactional_id=pump_transactional_id(env, feed))

    def open(self) -> None:
        """``init_transactions()``: fences any older pump of this feed and settles its open
        transaction. The pump opens its sink before it reads the checkpoint; a reader only
        (``rhumbatron pump checkpoint``) does not, and so fences nobody."""
        self.producer.inner  # noqa: B018 (building the client runs init_transactions)

    def checkpoint(self) -> Checkpoint | None:
        """The feed's latest committed checkpoint: the topic read committed to its end (its last
        stable offset: a transaction still open, another feed's, is not waited for)."""
        config = {**client_config(self.base, "reader"), "enable.partition.eof": True}
        consumer = Consumer(config)
        found: bytes | None = None
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=READ_TIMEOUT_S
            )
            if high <= low:
                return None
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + READ_TIMEOUT_S
            at_end = False
            while not at_end:
                if time.monotonic() > deadline:
                    raise Unreachable(
                        "Kafka",
                        bootstrap_of(self.base),
                        f"{self.topic} was not read to its end in {READ_TIMEOUT_S:g}s",
                    )
                for message in consumer.consume(500, 0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end = True
                        elif not reader_reads_on(error):
                            raise KafkaException(error)
                        continue
                    if message.key() == self.key.encode():
                        found = message.value()  # None: a tombstone (the checkpoint forgotten)
        except KafkaException as exc:
            raise Unreachable("Kafka", bootstrap_of(self.base), str(exc.args[0])) from exc
        finally:
            consumer.close()
        if found is None:
            return None
        return Checkpoint.parse(found, where=f"{self.topic} key {self.key!r}")

    def commit(self, events: Sequence[FeedEvent], checkpoint: Checkpoint) -> None:
        """One transaction: the events, then the checkpoint. Traced as ``pump batch``, the
        parent of each event's publish span (whose context the event's headers carry on)."""
        if not tracing.active():
            self._commit(events, checkpoint)
            return
        attributes = {
            "rhumbatron.pump.sequence": checkpoint.sequence,
            tracing.BATCH_COUNT: len(events),
        }
        with tracing.tracer(__name__).start_as_current_span("pump batch", attributes=attributes):
            self._commit(events, checkpoint)

    def _commit(self, events: Sequence[FeedEvent], checkpoint: Checkpoint) -> None:
        with self._transaction() as producer:
            for event in events:
                producer.produce_event(
                    self.stream_for(event.event.project_id),
                    event.event,
                    max_bytes=self.max_envelope_bytes,
                )
            self.failpoint("pump.after_events")
            producer.produce(self.topic, checkpoint.to_json(), key=self.key, partition=0)
            self.failpoint("pump.before_commit")

    def forget(self) -> None:
        """The feed's checkpoint removed (a tombstone under its key, in a transaction of this
        pump's id, so a running pump of the feed is fenced first): the next pump installs anew."""
        with self._transaction() as producer:
            producer.produce(self.topic, None, key=self.key, partition=0)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Producer]:
        """Begun, then committed when the block ends; aborted if it raises (fenced or broken:
        nothing of the transaction is committed either way)."""
        producer = self.producer
        producer.begin()
        try:
            try:
                yield producer
            except DeliveryFailed as exc:
                # A transactional producer's fatal error (another pump took over its id between
                # this one's sends) comes from a send as "Local: Fatal error": name the fencing.
                if any(f.fatal for f in exc.failures):
                    raise TransactionFailed(
                        producer.transactional_id or "?", str(exc), fenced=True
                    ) from exc
                raise
            producer.commit()
        except BaseException:
            if producer.in_transaction:
                with contextlib.suppress(TransactionFailed):
                    producer.abort()
            raise

    def close(self) -> None:
        self.producer.close()
