"""The runtime's Transport, Output, Redelivery and LogReader on confluent-kafka.

Assignment resumes from the cursor stored with the state: the offsets go to ``incremental_assign``
inside the assign callback (a ``seek`` there fails: the partition is not fetching yet). The same
callback style serves the classic protocol with cooperative-sticky and KIP-848's consumer protocol:
both are incremental.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from consumers.runtime.transport import AssignCallback, Committed, RevokeCallback
from consumers.runtime.types import TP, OutRecord, Record
from streams.errors import CommittedUnknown, ConfigurationError, InstanceIdHeld, Unreachable
from streams.headers import RECORD_ID
from streams.kafka_config import bootstrap_of, client_config
from streams.producer import Producer

log = logging.getLogger("rhumbatron.transport")

# A reader of a range gives up after this many empty polls in a row (10 s): the broker holds the
# range (its watermarks said so), so that long without a record is a broker not answering.
READ_POLL_S = 0.5
READ_IDLE_POLLS = 20

# Bound on broker round trips the loop makes itself (watermarks, committed offsets): long enough
# for a loaded broker, short enough that a dead one surfaces instead of hanging the loop.
BROKER_CALL_TIMEOUT_S = 10.0


_NOTHING: set[TP] = set()


def _record(message: Message, tp: TP | None = None) -> Record:
    timestamp = message.timestamp()
    return Record(
        topic=tp.topic if tp is not None else message.topic() or "",
        partition=tp.partition if tp is not None else message.partition() or 0,
        offset=message.offset() or 0,
        key=message.key(),
        value=message.value(),
        headers=message.headers,  # built when first asked
        timestamp_ms=timestamp[1] if timestamp else 0,
    )


class KafkaTransport:
    def __init__(
        self,
        base: Mapping[str, Any],
        *,
        group_id: str,
        protocol: str,
        session_timeout_ms: int,
        max_poll_interval_ms: int = 300_000,
        prefetch_kbytes: int | None = None,
        fetch_backoff_ms: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.group_id = group_id
        self._bootstrap = bootstrap_of(base)
        self._session_timeout_ms = session_timeout_ms
        # Partition EOF events tell when a partition has been read to its end (librdkafka knows
        # about transaction markers and the last stable offset; a position does not).
        extra: dict[str, Any] = {
            "max.poll.interval.ms": max_poll_interval_ms,
            "enable.partition.eof": True,
            "on_commit": self._on_commit,
        }
        if prefetch_kbytes is not None:
            # What librdkafka fetches ahead of the polls, per consumer (its default is 64 MB).
            extra["queued.max.messages.kbytes"] = prefetch_kbytes
        if fetch_backoff_ms is not None:
            # How long a partition's fetching waits once its prefetch is full (librdkafka's
            # default is a second: at a small prefetch the consumer then idled between fetches).
            extra["fetch.queue.backoff.ms"] = fetch_backoff_ms
        self.consumer = confluent_kafka.Consumer(
            client_config(
                base,
                "consumer",
                group_id=group_id,
                protocol=protocol,
                session_timeout_ms=session_timeout_ms,
                instance_id=instance_id,
                extra=extra,
            )
        )
        self._assigned: set[TP] = set()
        self._seeks: dict[TP, int] = {}
        self._at_end: set[TP] = set()  # partitions read to their end since their last record
        # Per partition, the offset after what the polls handed over (``position``): a record's
        # offset + 1, or the offset a partition EOF reports, which is past the transaction
        # markers before it. Tracked here rather than asked of librdkafka, whose position also
        # counts records fetched inside a poll that the caller has not been handed yet (the
        # rebalance callbacks run in the middle of one).
        self._position: dict[TP, int] = {}
        self._moved: set[TP] = set()  # partitions assigned or revoked since a poll's first call
        self._tps: dict[tuple[str, int], TP] = {}  # one TP per topic partition read
        # Group offsets asked for, per partition, and those of them the group refused (a commit
        # in the middle of a rebalance is refused, and nothing may follow it for a partition
        # read to its end): asked again at the next poll while still the latest and owned.
        self._asked: dict[TP, int] = {}
        self._marks: dict[TP, str] = {}  # the metadata asked with each
        self._refused: dict[TP, int] = {}

    def subscribe(
        self, topics: list[str], on_assign: AssignCallback, on_revoke: RevokeCallback
    ) -> None:
        def assigned(consumer: Any, partitions: list[TopicPartition]) -> None:
            tps = [TP(p.topic, p.partition) for p in partitions]
            # A cooperative rebalance that only took partitions away (and close) ends with an
            # assignment of nothing: nothing was assigned, so the callback is not called.
            starts = on_assign(tps) if tps else {}
            out = []
            for p in partitions:
                start = starts.get(TP(p.topic, p.partition))
                out.append(
                    TopicPartition(
                        p.topic, p.partition, start if start is not None else OFFSET_INVALID
                    )
                )
            consumer.incremental_assign(out)
            # librdkafka keeps a partition's pause flag across unassign/assign: a partition we
            # paused in an earlier assignment (e.g. after being fenced) must fetch again.
            consumer.resume(out)
            self._assigned.update(tps)
            self._at_end.difference_update(tps)
            self._moved.update(tps)
            for tp in tps:
                self._position.pop(tp, None)
                self._asked.pop(tp, None)
                self._marks.pop(tp, None)
                self._refused.pop(tp, None)

        def revoked(consumer: Any, partitions: list[TopicPartition]) -> None:
            tps = [TP(p.topic, p.partition) for p in partitions]
            if tps:
                on_revoke(tps)
            consumer.incremental_unassign(partitions)
            self._assigned.difference_update(tps)
            self._at_end.difference_update(tps)
            self._moved.update(tps)
            for tp in tps:
                self._seeks.pop(tp, None)
                self._position.pop(tp, None)
                self._asked.pop(tp, None)
                self._refused.pop(tp, None)

        self.consumer.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        """Waits up to ``timeout`` for the first message only (a record, or a partition's end),
        then takes what the client has fetched already, up to ``max_records``, without waiting
        for more: a batch never waits to fill up (at a steady trickle that wait would be each
        record's latency)."""
        self._apply_seeks()
        if self._refused:
            again, self._refused = self._refused, {}
            self.commit_offsets(again, {tp: self._marks.get(tp, "") for tp in again})
        try:
            first = self.consumer.consume(1, timeout=timeout)
            self._moved.clear()
            more = max_records - 1 if first else 0
            rest = self.consumer.consume(more, timeout=0) if more > 0 else []
        except KafkaException as exc:
            raise Unreachable("Kafka", self._bootstrap, exc.args[0].str()) from exc
        out: list[Record] = []
        # A rebalance inside the second call: what the first brought of a partition assigned or
        # revoked then belongs to the assignment before it, and is not handed over.
        self._take(first, out, skip=self._moved)
        self._take(rest, out, skip=_NOTHING)
        return out

    def _take(self, messages: list[Message], out: list[Record], *, skip: set[TP]) -> None:
        seeks, assigned, position, tps = self._seeks, self._assigned, self._position, self._tps
        for message in messages:
            error = message.error()
            key = (message.topic() or "", message.partition() or 0)
            tp = tps.get(key)
            if tp is None:
                tp = tps[key] = TP(*key)
            if skip and tp in skip:
                continue
            if error is not None:
                # A fatal error of the consumer itself comes as _FATAL with fatal() false
                # (librdkafka's consumer group errors, UNRELEASED_INSTANCE_ID among them): the
                # consumer will never fetch again, so it ends the process rather than idle.
                if error.fatal() or error.code() == KafkaError._FATAL:
                    if InstanceIdHeld.BROKER_TEXT in error.str():
                        raise InstanceIdHeld(error.str())
                    raise KafkaException(error)
                if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
                    # librdkafka would ask to join again every few seconds, for ever.
                    raise ConfigurationError(self._refused_session_timeout())
                if error.code() == KafkaError._PARTITION_EOF:
                    if tp not in seeks and tp in assigned:
                        self._at_end.add(tp)
                        end = message.offset()
                        if end is not None and end >= 0:
                            position[tp] = max(end, position.get(tp, end))
                else:
                    log.warning("consumer error on %s: %s", message.topic(), error.str())
                continue
            if seeks and tp in seeks:
                continue  # fetched before a pending seek took effect; it will come again
            if self._at_end:
                self._at_end.discard(tp)
            record = _record(message, tp)
            position[tp] = record.offset + 1
            out.append(record)

    def _refused_session_timeout(self) -> str:
        return (
            f"session_timeout_ms={self._session_timeout_ms}: the broker refused it as the "
            f"session timeout of group {self.group_id} ({self._bootstrap}); it must lie within "
            "the broker's group.min.session.timeout.ms and group.max.session.timeout.ms "
            "(6,000 and 1,800,000 ms by default)"
        )

    def _apply_seeks(self) -> None:
        for tp, offset in list(self._seeks.items()):
            try:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                del self._seeks[tp]
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._STATE:
                    raise
                # The partition is not fetching yet (just assigned): try again next poll.

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    def pause(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps if tp in self._assigned]
        if parts:
            self.consumer.pause(parts)

    def resume(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps if tp in self._assigned]
        if parts:
            self.consumer.resume(parts)

    def seek(self, tp: TP, offset: int) -> None:
        if tp in self._assigned:
            self._at_end.discard(tp)
            self._position.pop(tp, None)
            self._seeks[tp] = offset
            self._apply_seeks()

    def commit_offsets(self, offsets: Mapping[TP, int], marks: Mapping[TP, str]) -> None:
        parts = [
            TopicPartition(tp.topic, tp.partition, o, metadata=marks[tp])
            if marks.get(tp)
            else TopicPartition(tp.topic, tp.partition, o)
            for tp, o in offsets.items()
            if tp in self._assigned
        ]
        if not parts:
            return
        for p in parts:
            tp = TP(p.topic, p.partition)
            self._asked[tp] = p.offset
            self._marks[tp] = p.metadata or ""
            # A refusal already known is superseded: asked again at the next poll, it would
            # land after this offset and move the group back behind it, where a quiet
            # partition's lag would stay (nothing asks for this offset again: it was asked).
            self._refused.pop(tp, None)
        try:
            self.consumer.commit(offsets=parts, asynchronous=True)
        except KafkaException as exc:
            # Group offsets only feed lag tooling here; the cursor in the store is authoritative.
            log.warning("offset commit failed (lag figures may trail): %s", exc.args[0].str())

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to an asynchronous commit (served inside a poll). A partition whose
        offset the group refused is asked again, unless a later offset was asked since or it is
        no longer ours (its next owner commits its own)."""
        if error is not None and error.code() == KafkaError._NO_OFFSET:
            return
        refused: list[str] = []
        for p in partitions:
            failed = error if error is not None else p.error
            if failed is None:
                continue
            tp = self._tps.get((p.topic, p.partition)) or TP(p.topic, p.partition)
            if tp in self._assigned and self._asked.get(tp) == p.offset:
                self._refused[tp] = p.offset
                refused.append(f"{tp.topic}[{tp.partition}]@{p.offset}: {failed.str()}")
        if refused:
            log.info("group offsets refused, asked again: %s", "; ".join(refused))

    def committed(self, tps: Iterable[TP]) -> dict[TP, Committed | None]:
        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
        if not parts:
            return {}
        try:
            result = self.consumer.committed(parts, timeout=BROKER_CALL_TIMEOUT_S)
        except KafkaException as exc:
            # Typically a transaction of a dead producer is still open (the broker answers
            # "unstable" until it aborts on its timeout): we cannot know yet whether it landed.
            raise CommittedUnknown(exc.args[0].str()) from exc
        return {
            TP(p.topic, p.partition): (
                Committed(p.offset, p.metadata or "") if p.offset >= 0 else None
            )
            for p in result
        }

    def high_watermark(self, tp: TP, *, cached: bool = True) -> int:
        """The partition's end offset; ``cached`` answers from the last fetch response (no round
        trip; -1 when there was none yet)."""
        try:
            _, high = self.consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=BROKER_CALL_TIMEOUT_S, cached=cached
            )
        except KafkaException:
            return -1
        return int(high) if high is not None and high >= 0 else -1

    def caught_up(self, tps: Iterable[TP]) -> bool:
        return all(tp in self._at_end for tp in tps)

    def position(self, tp: TP) -> int | None:
        return self._position.get(tp) if tp in self._assigned else None

    def log_start(self, tp: TP) -> int:
        try:
            low, _ = self.consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=BROKER_CALL_TIMEOUT_S
            )
        except KafkaException:
            return 0
        return int(low) if low is not None and low >= 0 else 0

    def group_metadata(self) -> Any:
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()


class KafkaOutput:
    """A transactional producer: one stable transactional id per producer lease, so a
    process restarted under the same lease fences its own zombie."""

    def __init__(
        self, base: Mapping[str, Any], *, transactional_id: str, transaction_timeout_ms: int
    ) -> None:
        # The transaction timeout bounds how long a crashed worker's open transaction blocks
        # the next owner from learning whether it landed.
        self.producer = Producer(
            base,
            transactional_id=transactional_id,
            extra={"linger.ms": 2, "transaction.timeout.ms": transaction_timeout_ms},
        )

    def begin(self) -> None:
        self.producer.begin()

    def produce(self, record: OutRecord) -> None:
        self.producer.produce(
            record.topic,
            record.value,
            key=record.key,
            headers=[*record.headers, (RECORD_ID, record.record_id.encode())],
        )

    def send_offsets(
        self,
        offsets: Mapping[TP, int],
        group_metadata: Any,
        metadata: Mapping[TP, str] | None = None,
    ) -> None:
        marks = metadata or {}
        # confluent-kafka refuses metadata=None: a partition without a marker gets no argument.
        self.producer.send_offsets(
            [
                TopicPartition(tp.topic, tp.partition, o, metadata=marks[tp])
                if marks.get(tp)
                else TopicPartition(tp.topic, tp.partition, o)
                for tp, o in offsets.items()
            ],
            group_metadata,
        )

    def commit(self) -> None:
        self.producer.commit()

    def abort(self) -> None:
        if self.producer.in_transaction:
            self.producer.abort()

    def close(self) -> None:
        self.producer.close()


def assign_only_consumer(
    base: Mapping[str, Any], purpose: str, **config: Any
) -> confluent_kafka.Consumer:
    """A consumer for manual assignment: read_committed from the earliest offset unless
    ``config`` says otherwise. librdkafka wants a group id even then; nothing is ever committed
    with it."""
    return confluent_kafka.Consumer(
        client_config(
            base,
            "reader",
            group_id=f"rhumbatron-{purpose}-{uuid.uuid4().hex[:12]}",
            extra=config,
        )
    )


class KafkaRedelivery:
    def __init__(self, base: Mapping[str, Any], topic: str) -> None:
        self.topic = topic
        self.consumer = assign_only_consumer(base, "redelivery")
        self._assigned: set[int] = set()

    def assign(self, partition: int, offset: int | None) -> None:
        tp = TopicPartition(self.topic, partition, offset if offset is not None else 0)
        if partition in self._assigned:
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])
        self.consumer.incremental_assign([tp])
        self._assigned.add(partition)

    def unassign(self, partition: int) -> None:
        if partition in self._assigned:
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])
            self._assigned.discard(partition)

    def poll(self, max_records: int) -> list[Record]:
        if not self._assigned:
            return []
        return [
            _record(m) for m in self.consumer.consume(max_records, timeout=0) if m.error() is None
        ]

    def close(self) -> None:
        self.consumer.close()


class KafkaOutputLog:
    """OutputLog on the broker: reads each output topic ``read_committed`` from the offsets of
    ``since_ms`` to the last stable offset, looking for the records' ids (the ``record_id``
    header every Kafka effect carries)."""

    def __init__(self, base: Mapping[str, Any]) -> None:
        self.base = base

    def find(self, records: Sequence[OutRecord], since_ms: int) -> set[str]:
        wanted = {r.record_id for r in records}
        found: set[str] = set()
        for topic in sorted({r.topic for r in records}):
            found |= self._scan(topic, since_ms, wanted - found)
            if found >= wanted:
                break
        return found

    def _scan(self, topic: str, since_ms: int, wanted: set[str]) -> set[str]:
        consumer = assign_only_consumer(self.base, "output-log", **{"enable.partition.eof": True})
        found: set[str] = set()
        try:
            meta = consumer.list_topics(topic, timeout=BROKER_CALL_TIMEOUT_S).topics[topic]
            if meta.error is not None:
                raise Unreachable("Kafka", bootstrap_of(self.base), meta.error.str())
            starts = consumer.offsets_for_times(
                [TopicPartition(topic, p, max(since_ms, 0)) for p in meta.partitions],
                timeout=BROKER_CALL_TIMEOUT_S,
            )
            # A partition with nothing written since then answers -1: nothing to read there.
            todo = [tp for tp in starts if tp.offset >= 0]
            if not todo:
                return found
            consumer.assign(todo)
            open_parts = {tp.partition for tp in todo}
            quiet_s = 0.0
            while open_parts and not wanted <= found:
                batch = consumer.consume(1000, timeout=1.0)
                quiet_s = 0.0 if batch else quiet_s + 1.0
                if quiet_s >= BROKER_CALL_TIMEOUT_S:
                    raise Unreachable(
                        "Kafka",
                        bootstrap_of(self.base),
                        f"{topic} partitions {sorted(open_parts)} not read to their end",
                    )
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            open_parts.discard(message.partition() or 0)
                        elif error.fatal() or error.code() == KafkaError._FATAL:
                            raise KafkaException(error)
                        continue
                    rid = _record(message).header(RECORD_ID)
                    if rid is not None and rid.decode() in wanted:
                        found.add(rid.decode())
        finally:
            consumer.close()
        return found


class KafkaReader:
    """Reads a retained range of one partition (for refolds)."""

    def __init__(self, base: Mapping[str, Any]) -> None:
        self.base = base

    def _watermarks(self, tp: TP) -> tuple[int, int]:
        consumer = assign_only_consumer(self.base, "reader")
        try:
            return self._ask_watermarks(consumer, tp)
        finally:
            consumer.close()

    def _ask_watermarks(self, consumer: confluent_kafka.Consumer, tp: TP) -> tuple[int, int]:
        # The operator's controls call this reader: no retry policy above it, so a broker that
        # does not answer is said here, naming the address and the partition.
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=BROKER_CALL_TIMEOUT_S
            )
        except KafkaException as exc:
            raise Unreachable(
                "Kafka",
                bootstrap_of(self.base),
                f"asking the offsets of {tp}: {exc.args[0].str()}",
            ) from exc
        return int(low), int(high)

    def log_start(self, tp: TP) -> int:
        return self._watermarks(tp)[0]

    def end(self, tp: TP) -> int:
        return self._watermarks(tp)[1]

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]:
        if end < start:
            return
        consumer = assign_only_consumer(self.base, "reader")
        try:
            _, high = self._ask_watermarks(consumer, tp)
            last = min(end, high - 1)
            if last < start:
                return
            part = TopicPartition(tp.topic, tp.partition, start)
            consumer.assign([part])
            idle = 0
            while idle < READ_IDLE_POLLS:
                batch = consumer.consume(1000, timeout=READ_POLL_S)
                idle = 0 if batch else idle + 1
                for message in batch:
                    if message.error() is not None:
                        continue
                    offset = message.offset() or 0
                    if offset > last:
                        return
                    yield _record(message)
                # Transaction markers take offsets but are never delivered: go by position.
                if consumer.position([part])[0].offset > last:
                    return
            # A short read must never pass for the whole range: a refold or a park's drain
            # would take the missing records for records that are not there.
            reached = consumer.position([part])[0].offset
            raise Unreachable(
                "Kafka",
                bootstrap_of(self.base),
                f"reading {tp} offsets {start}..{last}: nothing more came for "
                f"{READ_IDLE_POLLS * READ_POLL_S:.0f} s at position {reached}",
            )
        finally:
            consumer.close()
