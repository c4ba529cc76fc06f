"""The feed pump's test parts: a reference feed over a file, the in-memory twin of the Kafka
sink (held to it by tests/streams/pump/test_sink_contract.py), the legacy sequence in memory,
and a read of everything committed on the streams."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx

from router.settings import Settings
from streams.envelopes import Event, decode_event
from streams.errors import TransactionFailed
from streams.pump.identity import Checkpoint, Identity
from streams.pump.page import FeedEvent
from streams.pump.reference_server import FeedServer, workload_feed

CORPUS = "11111111-1111-4111-8111-111111111111"
LINEAGE = "22222222-2222-4222-8222-222222222222"
OTHER = "33333333-3333-4333-8333-333333333333"
IDENTITY = Identity(CORPUS, LINEAGE)


def write_feed(path: Path, lines: Sequence[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@contextmanager
def serving(
    path: Path, *, page_size: int = 50, identity: Identity = IDENTITY
) -> Iterator[FeedServer]:
    server = FeedServer(path, identity, page_size=page_size).start()
    try:
        yield server
    finally:
        server.close()


def control(server: FeedServer, **change: object) -> dict[str, Any]:
    return httpx.post(server.url + "control", json=change, timeout=5).json()  # type: ignore[no-any-return]


def feed(run: str, count: int, *, projects: int = 7, step: int = 1) -> list[bytes]:
    return workload_feed(run, projects, count, step=step)


@dataclass
class MemorySink:
    """The Kafka sink's twin: one checkpoint, the committed events, a commit both or neither.
    ``fail_at``: commits numbered from 1 that raise (before anything is kept), as an abort does."""

    committed: list[FeedEvent] = field(default_factory=list)
    saved: Checkpoint | None = None
    commits: int = 0
    fail_at: set[int] = field(default_factory=set)

    def checkpoint(self) -> Checkpoint | None:
        return self.saved

    def commit(self, events: Sequence[FeedEvent], checkpoint: Checkpoint) -> None:
        self.commits += 1
        if self.commits in self.fail_at:
            raise TransactionFailed(
                "memory", "commit_transaction: failing on purpose", abortable=True
            )
        self.committed.extend(events)
        self.saved = checkpoint


@dataclass
class MemoryLegacy:
    value: int | None = None
    deletes: int = 0

    def read(self) -> int | None:
        return self.value

    def delete(self) -> None:
        self.deletes += 1
        self.value = None


def committed_events(s: Settings, timeout: float = 30.0) -> list[Event]:
    """Every event a read-committed reader finds on the streams, read to each partition's end."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": "pump-test-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    parts = [
        confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
        for topic in s.topology.stream_names()
        for p in range(s.partitions)
    ]
    ends: dict[tuple[str, int], int] = {}
    for tp in parts:
        _, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        ends[(tp.topic, tp.partition)] = high
    open_parts = {k for k, high in ends.items() if high > 0}
    out: list[Event] = []
    consumer.assign(parts)
    deadline = time.monotonic() + timeout
    try:
        while open_parts and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                key = (message.topic() or "", message.partition() or 0)
                offset = message.offset() or 0
                error = message.error()
                if error is not None:
                    eof = error.code() == confluent_kafka.KafkaError._PARTITION_EOF
                    if eof and offset >= ends[key]:
                        open_parts.discard(key)
                    continue
                out.append(decode_event(message.value(), max_bytes=s.max_envelope_bytes))
                if offset + 1 >= ends[key]:
                    open_parts.discard(key)
    finally:
        consumer.close()
    assert not open_parts, f"the streams were not read to their end: {sorted(open_parts)}"
    return out
