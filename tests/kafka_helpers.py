"""Helpers for tests that read back what reached the real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import confluent_kafka

from streams.envelopes import Event, decode_event


def murmur2_partition(key: str, partitions: int) -> int:
    """The Java client's default partitioner (Utils.murmur2, positive, mod partitions)."""
    data = key.encode()
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, idx = length % 4, length & ~3
    if tail == 3:
        h ^= data[idx + 2] << 16
    if tail >= 2:
        h ^= data[idx + 1] << 8
    if tail >= 1:
        h ^= data[idx]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


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
