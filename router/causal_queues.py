"""What the causal router put on its command queues: for the demo and for operators.

Reads the queues the router writes to (agent-wakeups, integration, indexing) from the beginning
to their current end as a ``read_committed`` reader — so a command of an aborted transaction is
never counted — and returns the commands, or their count by type.

"Their current end" is each partition's high watermark when the read starts. A transaction still
open there (a router process killed mid-transaction leaves one until the broker aborts it, at most
``transaction_timeout_ms`` later) hides everything behind it from ``read_committed`` readers, so
the read first waits until every partition's last stable offset has reached that watermark.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import confluent_kafka

from consumers.subscriptions.causal_commands import queues
from router.settings import Settings
from streams.envelopes import Command, decode_command
from streams.errors import EnvelopeError, RhumbatronError, Unreachable


class QueuesNotSettled(RhumbatronError):
    """A transaction on a queue stayed open for the whole wait: its commands are not decided."""


@dataclass
class QueueContents:
    commands: list[Command] = field(default_factory=list)
    undecodable: int = 0  # records on the queues that are not Command envelopes

    def by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(c.command_type for c in self.commands).items()))

    def repeated_ids(self) -> dict[str, int]:
        """Command ids seen more than once (each id should appear once)."""
        counts = Counter(c.command_id for c in self.commands)
        return {i: n for i, n in sorted(counts.items()) if n > 1}


# How often to ask whether open transactions have ended: a cheap metadata request.
SETTLE_POLL_S = 0.2


def _consumer(settings: Settings, isolation: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        settings.kafka_config(
            **{
                "group.id": f"rhumbatron-queue-reader-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "enable.partition.eof": True,
            }
        )
    )


def _wait_settled(
    settings: Settings,
    committed: confluent_kafka.Consumer,
    parts: list[confluent_kafka.TopicPartition],
    deadline: float,
) -> None:
    """Wait until no transaction open when we started holds back any partition."""
    everything = _consumer(settings, "read_uncommitted")
    query = settings.connect_timeout_s
    try:
        targets = {
            (tp.topic, tp.partition): everything.get_watermark_offsets(tp, timeout=query)[1]
            for tp in parts
        }
    finally:
        everything.close()
    while True:
        held = [
            f"{tp.topic}[{tp.partition}]"
            for tp in parts
            if committed.get_watermark_offsets(tp, timeout=query, cached=False)[1]
            < targets[(tp.topic, tp.partition)]
        ]
        if not held:
            return
        if time.monotonic() > deadline:
            raise QueuesNotSettled(
                f"an open transaction still holds back {', '.join(held)}; its commands are not "
                "decided yet (a killed producer's transaction is aborted by the broker after "
                "transaction_timeout_ms): try again later"
            )
        time.sleep(SETTLE_POLL_S)


def read_commands(settings: Settings, *, timeout_s: float | None = None) -> QueueContents:
    """Every committed command on the router's queues of ``settings.env``, up to the queues' end
    when called. Raises QueuesNotSettled or Unreachable if that end cannot be read in time
    (default: the transaction timeout plus a margin)."""
    if timeout_s is None:
        timeout_s = settings.transaction_timeout_ms / 1000 + settings.connect_timeout_s * 3
    topics = queues(settings.env)
    consumer = _consumer(settings, "read_committed")
    contents = QueueContents()
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        parts = [
            confluent_kafka.TopicPartition(t, p, confluent_kafka.OFFSET_BEGINNING)
            for t in topics
            if t in metadata.topics
            for p in metadata.topics[t].partitions
        ]
        if not parts:
            return contents
        deadline = time.monotonic() + timeout_s
        _wait_settled(settings, consumer, parts, deadline)
        consumer.assign(parts)
        open_parts = {(tp.topic, tp.partition) for tp in parts}
        while open_parts:
            if time.monotonic() > deadline:
                raise Unreachable(
                    "Kafka",
                    settings.kafka_bootstrap,
                    f"{len(open_parts)} queue partition(s) not read to their end within "
                    f"{timeout_s:g}s",
                )
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        open_parts.discard((message.topic(), message.partition()))
                        continue
                    raise Unreachable("Kafka", settings.kafka_bootstrap, error.str())
                try:
                    contents.commands.append(
                        decode_command(message.value(), max_bytes=settings.max_envelope_bytes)
                    )
                except EnvelopeError:
                    contents.undecodable += 1
    finally:
        consumer.close()
    return contents


def commands_by_type(settings: Settings, *, timeout_s: float | None = None) -> dict[str, int]:
    """``{command_type: n}`` of the committed commands on the router's queues."""
    return read_commands(settings, timeout_s=timeout_s).by_type()
