"""Helpers for tests that read back what reached the real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import confluent_kafka
import confluent_kafka.admin

from streams.envelopes import Event, decode_event
from streams.topology import partition_for


def murmur2_partition(key: str, partitions: int) -> int:
    return partition_for(key, partitions)


def read_all(
    bootstrap: str,
    topics: Iterable[str],
    *,
    expect: int,
    timeout: float = 60.0,
    committed_only: bool = True,
) -> list[confluent_kafka.Message]:
    """Read every record of ``topics`` from the start with a throwaway group until ``expect``
    records arrived or ``timeout`` passed (then returns what it has)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    consumer.subscribe(list(topics))
    out: list[confluent_kafka.Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    out.append(message)
    finally:
        consumer.close()
    return out


def events_of(messages: Iterable[confluent_kafka.Message], max_bytes: int = 1 << 20) -> list[Event]:
    return [decode_event(m.value(), max_bytes=max_bytes) for m in messages]


def group_assignments(bootstrap: str, group: str) -> list[list[tuple[str, int]]]:
    """What the broker says each member of consumer group ``group`` holds (one sorted list of
    (topic, partition) per member; no members: an empty list). Classic and consumer groups."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_consumer_groups([group], request_timeout=10).values()
    description = future.result()
    return [
        sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions)
        for member in description.members
    ]
