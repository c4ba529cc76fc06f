"""Reading topics from their start to their end as a ``read_committed`` reader: how the operator
figures and tests count what a transactional writer committed (commands on the queues, metric
points).

A transaction still open when the read starts (say, of a producer that was just killed) hides
every later record of its partitions from a committed reader until the broker aborts it after its
transaction timeout. With ``settle`` the read first waits, bounded, until the committed end of
every partition has caught up with its end as it was when the read started, so the answer covers
everything written before the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, Message

from consumers.runtime.kafka_transport import assign_only_consumer
from streams.errors import TransactionsOpen, Unreachable
from streams.kafka_config import bootstrap_of, reader_reads_on

# How often to ask whether open transactions have ended: a cheap watermark request.
SETTLE_POLL_S = 0.2


def _consumer(base: Mapping[str, Any], isolation: str) -> confluent_kafka.Consumer:
    return assign_only_consumer(
        base, "reader", **{"isolation.level": isolation, "enable.partition.eof": True}
    )


def _wait_settled(
    base: Mapping[str, Any],
    committed: confluent_kafka.Consumer,
    parts: list[confluent_kafka.TopicPartition],
    deadline: float,
    query_timeout: float,
) -> None:
    everything = _consumer(base, "read_uncommitted")
    try:
        targets = {
            (tp.topic, tp.partition): everything.get_watermark_offsets(tp, timeout=query_timeout)[1]
            for tp in parts
        }
    finally:
        everything.close()
    while True:
        held = [
            f"{tp.topic}[{tp.partition}]"
            for tp in parts
            if committed.get_watermark_offsets(tp, timeout=query_timeout, cached=False)[1]
            < targets[(tp.topic, tp.partition)]
        ]
        if not held:
            return
        if time.monotonic() > deadline:
            raise TransactionsOpen(
                f"an open transaction still holds back {', '.join(held)}; what it wrote is not "
                "decided yet (a killed producer's transaction is aborted by the broker after its "
                "transaction timeout): try again later"
            )
        time.sleep(SETTLE_POLL_S)


def read_committed(
    base: Mapping[str, Any],
    topics: Iterable[str],
    visit: Callable[[Message], None],
    *,
    timeout_s: float,
    settle: bool = True,
) -> int:
    """Call ``visit`` with every committed record of ``topics`` (those that exist), from their
    start to their end when called; returns how many. Raises Unreachable (or TransactionsOpen)
    when that end cannot be read within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    topics = list(topics)
    consumer = _consumer(base, "read_committed")
    count = 0
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        parts = [
            confluent_kafka.TopicPartition(t, p, confluent_kafka.OFFSET_BEGINNING)
            for t in topics
            if t in metadata.topics
            for p in metadata.topics[t].partitions
        ]
        if not parts:
            return 0
        if settle:
            _wait_settled(base, consumer, parts, deadline, min(timeout_s, 10.0))
        consumer.assign(parts)
        open_parts = {(tp.topic, tp.partition) for tp in parts}
        while open_parts:
            if time.monotonic() > deadline:
                raise Unreachable(
                    "Kafka",
                    bootstrap_of(base),
                    f"{len(open_parts)} partition(s) not read to their end within {timeout_s:g}s",
                )
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is None:
                    visit(message)
                    count += 1
                elif error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    open_parts.discard((message.topic() or "", message.partition() or 0))
                elif reader_reads_on(error):
                    continue
                else:
                    raise Unreachable("Kafka", bootstrap_of(base), error.str())
    except KafkaException as exc:  # a metadata or watermark request had no answer
        raise Unreachable(
            "Kafka", bootstrap_of(base), f"reading {', '.join(topics)}: {exc.args[0].str()}"
        ) from exc
    finally:
        consumer.close()
    return count
