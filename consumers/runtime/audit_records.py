"""The durable copy of the operator state Redis indexes: the audit topic ``rhumbatron_audit_<env>``.

Redis holds the operator audit logs (``controls.py``) and the dead-letter index with each letter's
status and audit (``dead_letters.py``). Each change to them is first written here, and counts as
done only once the topic has it (acks=all, an idempotent producer); Redis is written after. A
Redis that lost its data is rebuilt from this topic alone (``state_rebuild.py``).

Three kinds of record, each under a key of its own, so compaction never collapses two of them:

- ``entry:<audit id>``: one entry of an audit log (``log``: the subscription's slug, or ``pump``);
- ``letter:<letter id>:<part>``: a dead letter as the index first stores it, its JSON cut into
  parts of at most ``part_max_bytes`` (a letter keeps its records whole, up to the broker's limit);
  ``write`` tells one write of the letter from another;
- ``transition:<id>``: a letter's status change, with ``seq``, the number of audit entries the
  letter had before it: the rebuild applies a change only onto the state it was made from.

A record whose change did not happen after all (its Redis write lost a check-and-set race) is
voided by a tombstone on its key.
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import orjson

from streams.errors import AuditNotDurable, RhumbatronError
from streams.producer import Producer

# (key, value): a value of None is a tombstone.
Raw = tuple[str, bytes | None]
# (records read, records to read): the rebuild's progress.
Progress = Callable[[int, int], None]

ENTRY = "entry"
LETTER = "letter"
TRANSITION = "transition"
# The field of an audit log's entry naming it: its key on the topic, how a rebuild knows which
# entries Redis already holds.
AUDIT_ID = "audit_id"


def new_id() -> str:
    return uuid.uuid4().hex


def entry_record(log: str, entry: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return f"{ENTRY}:{entry[AUDIT_ID]}", {"kind": ENTRY, "log": log, "entry": entry}


def letter_records(
    letter_id: str, letter_json: bytes, part_max_bytes: int
) -> list[tuple[str, dict[str, Any]]]:
    # base64 makes 4 bytes of 3; the rest of a part's JSON is well under the quarter left.
    size = max(part_max_bytes // 2, 1)
    chunks = [letter_json[i : i + size] for i in range(0, len(letter_json), size)] or [b""]
    write = new_id()
    return [
        (
            f"{LETTER}:{letter_id}:{n}",
            {
                "kind": LETTER,
                "letter": letter_id,
                "write": write,
                "part": n,
                "parts": len(chunks),
                "data": base64.b64encode(chunk).decode(),
            },
        )
        for n, chunk in enumerate(chunks)
    ]


def transition_record(
    letter_id: str, seq: int, frm: str, to: str, entry: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    return (
        f"{TRANSITION}:{new_id()}",
        {
            "kind": TRANSITION,
            "letter": letter_id,
            "seq": seq,
            "from": frm,
            "to": to,
            "entry": entry,
        },
    )


def _ignore(_: object) -> None:
    pass


class DurableAudit(Protocol):
    def write(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Return once every record is durable; else raise AuditNotDurable."""

    def void(self, keys: Sequence[str]) -> None:
        """Tombstones on ``keys``: records whose change did not happen."""

    def read(self, progress: Progress | None = None) -> Iterator[Raw]:
        """Every record from the start of the topic to its end as it was when called."""

    def is_empty(self) -> bool: ...


class MemoryAudit:
    """The topic's twin: records kept in order, as bytes; ``fail_next_write`` fails the next write
    as the real one fails when Kafka does not acknowledge it."""

    def __init__(self) -> None:
        self.records: list[Raw] = []
        self.fail_next_write = False
        self._lock = threading.Lock()

    def write(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        with self._lock:
            if self.fail_next_write:
                self.fail_next_write = False
                raise AuditNotDurable(
                    f"the audit topic did not take {len(records)} record(s) (injected failure); "
                    "nothing was changed: do it again once Kafka answers"
                )
            self.records.extend((key, orjson.dumps(value)) for key, value in records)

    def void(self, keys: Sequence[str]) -> None:
        with self._lock:
            self.records.extend((key, None) for key in keys)

    def read(self, progress: Progress | None = None) -> Iterator[Raw]:
        with self._lock:
            held = list(self.records)
        for n, record in enumerate(held, 1):
            yield record
            if progress is not None:
                progress(n, len(held))

    def is_empty(self) -> bool:
        return not self.records


class KafkaAudit:
    """The audit topic. ``read`` uses a reader of its own per call (assigned, no group)."""

    def __init__(
        self,
        producer: Producer,
        base: dict[str, Any],
        *,
        topic: str,
        flush_timeout: float,
        read_timeout: float,
    ) -> None:
        self.producer = producer
        self.base = base
        self.topic = topic
        self.flush_timeout = flush_timeout
        self.read_timeout = read_timeout

    def write(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        try:
            for key, value in records:
                self.producer.produce(self.topic, orjson.dumps(value), key=key)
            self.producer.flush(self.flush_timeout)
        except RhumbatronError as exc:
            # A record not acknowledged in time may still land later: its tombstone, sent after
            # it on the one partition, lands after it, so a rebuild never applies it.
            self._void_quietly([key for key, _ in records])
            raise AuditNotDurable(
                f"the audit topic {self.topic} did not take {len(records)} record(s) within "
                f"{self.flush_timeout:g}s (flush_timeout_s): {exc}; nothing was changed: do it "
                "again once Kafka answers"
            ) from exc

    def _void_quietly(self, keys: Sequence[str]) -> None:
        try:
            for key in keys:
                # Its own fate is its own: a tombstone lost with its record is no failure, and
                # must not fail the next write's flush.
                self.producer.produce(self.topic, None, key=key, on_delivery=_ignore)
        except RhumbatronError:
            pass  # the producer is down: the records it holds are not sent either

    def void(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.producer.produce(self.topic, None, key=key)
        try:
            self.producer.flush(self.flush_timeout)
        except RhumbatronError as exc:
            raise AuditNotDurable(
                f"the audit topic {self.topic} did not take the tombstones of {', '.join(keys)} "
                f"({exc}): a rebuild of Redis from it would show those records' changes, which "
                "did not happen"
            ) from exc

    def _watermarks(self) -> tuple[int, int]:
        from consumers.runtime.kafka_transport import assign_only_consumer

        consumer = assign_only_consumer(self.base, "audit-watermarks")
        try:
            return self._ends(consumer)
        finally:
            consumer.close()

    def _ends(self, consumer: Any) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        from streams.errors import Unreachable
        from streams.kafka_config import bootstrap_of

        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=self.read_timeout, cached=False
            )
        except KafkaException as exc:
            raise Unreachable(
                "Kafka", bootstrap_of(self.base), f"reading the ends of {self.topic}: {exc}"
            ) from exc
        return int(low), int(high)

    def is_empty(self) -> bool:
        low, high = self._watermarks()
        return high <= low

    def read(self, progress: Progress | None = None) -> Iterator[Raw]:
        from confluent_kafka import KafkaError, TopicPartition

        from consumers.runtime.kafka_transport import assign_only_consumer
        from streams.errors import Unreachable
        from streams.kafka_config import bootstrap_of, reader_reads_on

        consumer = assign_only_consumer(
            self.base, "audit-rebuild", **{"enable.partition.eof": True}
        )
        try:
            low, end = self._ends(consumer)
            if end <= low:
                return
            consumer.assign([TopicPartition(self.topic, 0, low)])
            done = 0
            position = low
            while position < end:
                message = consumer.poll(self.read_timeout)
                if message is None:
                    raise Unreachable(
                        "Kafka",
                        bootstrap_of(self.base),
                        f"no record of {self.topic} came within {self.read_timeout:g}s "
                        f"(connect_timeout_s) at offset {position} of {end}",
                    )
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:  # the rest compacted away
                        position = end
                        continue
                    if reader_reads_on(error):
                        continue
                    raise Unreachable(
                        "Kafka", bootstrap_of(self.base), f"reading {self.topic}: {error}"
                    )
                position = (message.offset() or 0) + 1
                key = message.key()
                done += 1
                yield (key.decode() if key is not None else "", message.value())
                if progress is not None:
                    progress(done, end - low)
        finally:
            consumer.close()
