"""Consumer lag after transactional producers, on the real broker, against Kafka's own
``kafka-consumer-groups --describe`` (ConsumerGroupCommand, the broker's release).

Every transaction ends with a commit marker on each partition it wrote to: an offset no
read_committed consumer is handed. The streams are written here in transactions (as a
transactional upstream would write them) and so is the command queue (as the causal router
writes it); the worker writes its retries in transactions of its own. A subscription with Redis
effects, one with Kafka effects and a command worker each run to idle; then every partition
with records reads lag 0, in ``consumers.lag.group_lag`` and in Kafka's tool alike."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import orjson
import pytest
from confluent_kafka.admin import NewTopic

from consumers.lag import PartitionLag, group_lag
from router.settings import Settings
from router.wiring.groups import group_reads
from router.wiring.workers import worker_slug
from streams.admin import admin_client
from streams.envelopes import Command
from streams.producer import Producer, send_to_streams
from streams.topology import group_id, queue_name, retry_topic
from streams.workload import slotted_events, workload
from tests.support.consumer_groups import describe_groups, tool_available
from tests.support.kafka import read_all
from tests.support.runtime_processes import runtime_settings, start
from tests.support.workers import (
    QUEUE,
    cli,
    commands,
    settings_factory,
    short_queues,
    start_worker,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")
SUBSCRIPTIONS = ("ledger", "kafka-counter")  # Redis effects; Kafka effects (transactions)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for first in range(0, len(items), size):
        yield items[first : first + size]


def _in_transactions(
    producer: Producer, chunks: Iterator[Sequence[T]], send: Callable[[Sequence[T]], object]
) -> None:
    """Each chunk in a transaction of its own: its records, then a commit marker."""
    for chunk in chunks:
        producer.begin()
        send(chunk)
        producer.commit()
    producer.close()


def _send_commands(producer: Producer, queue: str, cmds: Sequence[Command], limit: int) -> None:
    for command in cmds:
        producer.produce_command(queue, command, max_bytes=limit)


def _finish(proc: subprocess.Popen[str], what: str) -> None:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{err[-3000:]}"
    orjson.loads(out.strip().splitlines()[-1])  # its stats: it ran to its end


def test_caught_up_groups_read_lag_0_after_transactional_producers_as_kafkas_tool_does(
    make: Callable[..., Settings],
) -> None:
    assert tool_available(), "Kafka's tools are not in .local/kafka/jars: run infra/local.sh jars"
    s = runtime_settings(make(queues=short_queues(0.5, retries=1), queue_partitions=2))
    cli(s, "provision")
    base = s.kafka_config()
    admin = admin_client(base)
    for future in admin.create_topics([NewTopic(f"out_{s.env}", 2, 1)]).values():
        future.result()

    events = slotted_events(workload("txlag", 6, 36), tenant_id="t")
    streams_producer = Producer(base, transactional_id=f"lag-streams-{s.env}")
    _in_transactions(
        streams_producer,
        _chunks(events, 5),
        lambda chunk: send_to_streams(
            streams_producer,
            chunk,
            stream_for=s.topology.stream_for,
            max_bytes=s.max_envelope_bytes,
            flush_timeout=30,
        ),
    )
    # Commands as the causal router sends them; a few fail once, so the worker writes retries.
    cmds = commands(12, "lag") + commands(4, "flaky", drill="fail-once")
    queue = queue_name(QUEUE, s.env)
    queue_producer = Producer(base, transactional_id=f"lag-queue-{s.env}")
    _in_transactions(
        queue_producer,
        _chunks(cmds, 3),
        lambda chunk: _send_commands(queue_producer, queue, chunk, s.max_envelope_bytes),
    )

    running = [(start(s, slug, until_idle=3), slug) for slug in SUBSCRIPTIONS]
    worker = start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "3")
    running.append((worker, "worker"))
    for proc, what in running:
        _finish(proc, what)

    groups = [
        *(group_id(slug, s.env) for slug in SUBSCRIPTIONS),
        group_id(worker_slug(QUEUE), s.env),
    ]
    ours: dict[tuple[str, str, int], PartitionLag] = {}
    for group in groups:
        for row in group_lag(admin, base, group_reads(s.topology, group), timeout=30):
            ours[(group, row.topic, row.partition)] = row

    # Where the records are (read_committed: what a consumer is handed), and that markers
    # follow them: the old rule (last record + 1) would leave every such partition at lag >= 1.
    streams = list(s.topology.stream_names())
    read = [*streams, queue, retry_topic(QUEUE, s.env)]
    records = read_all(s.kafka_bootstrap, read, expect=len(events) + len(cmds) + 4, timeout=60)
    assert len(records) == len(events) + len(cmds) + 4
    last: dict[tuple[str, int], int] = {}
    for m in records:
        key = (m.topic() or "", m.partition() or 0)
        last[key] = max(last.get(key, -1), m.offset() or 0)
    assert any(topic == retry_topic(QUEUE, s.env) for topic, _ in last)
    reads = {group: {*streams} for group in groups[:2]}
    reads[groups[2]] = {queue, retry_topic(QUEUE, s.env)}
    for group in groups:
        for (topic, partition), offset in last.items():
            if topic not in reads[group]:
                continue
            row = ours[(group, topic, partition)]
            assert row.end > offset + 1, (group, topic, partition, offset, row)
            assert (row.committed, row.lag) == (row.end, 0), (group, row)
    assert all(row.lag == 0 for row in ours.values()), [r for r in ours.values() if r.lag]

    # Kafka's own tool: the same offsets, end and lag on every partition it reports, and it
    # reports every partition that holds records.
    described = describe_groups(groups, bootstrap=s.kafka_bootstrap)
    told = {(d.group, d.topic, d.partition): d for d in described}
    assert told, described
    for group in groups:
        for topic, partition in last:
            if topic in reads[group]:
                assert (group, topic, partition) in told, (group, topic, partition)
    for where, d in told.items():
        row = ours[where]
        assert (d.current, d.end, d.lag) == (row.committed, row.end, row.lag), (d, row)
