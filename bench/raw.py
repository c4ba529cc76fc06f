"""The baselines: raw confluent-kafka doing the same work as a case, with no envelope validation
and nothing of ours in between, so a ratio is what Rhumbatron costs on top of the client."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import confluent_kafka


def raw_produce(bootstrap: str, records: Sequence[tuple[str, str, bytes]]) -> int:
    """Send (topic, key, value) records with the producer settings we use (acks=all,
    idempotence, murmur2 partitioning, lz4, a 5 ms linger) and wait for every acknowledgement."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    for n, (topic, key, value) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 1000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("raw producer: records still unacknowledged after 60 s")
    return len(records)


def raw_consume(bootstrap: str, topics: list[str], count: int, *, idle_polls: int = 20) -> int:
    """Consume ``count`` records of ``topics`` from the start with a fresh group (or stop after
    ``idle_polls`` empty polls of 0.5 s)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    seen = 0
    idle = 0
    while seen < count and idle < idle_polls:
        batch = consumer.consume(1000, timeout=0.5)
        idle = 0 if batch else idle + 1
        seen += sum(1 for m in batch if m.error() is None)
    consumer.close()
    return seen
