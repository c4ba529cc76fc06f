"""Consumer lag per group and partition: the one place it is computed.

lag = log end offset - committed offset (a partition with no commit counts from the log start),
over the topics the group reads (``streams.topology.GroupReads``, derived for each group by
``router.wiring.groups``) and nothing else.

The committed offsets are fetched by a consumer that names the group and never joins it, not by
the AdminClient's ListConsumerGroupOffsets: in librdkafka (2.16, confluentinc/librdkafka#4605)
an admin request to a group coordinator whose connection drops mid-request aborts the whole
process (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``), and
the consume, worker and serve processes ask the lag while they run: a coordinator broker lost
would kill them (tests/chaos/test_broker_failover.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from streams.admin import ensure_reachable
from streams.kafka_config import client_config
from streams.topology import GroupReads


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _offsets(
    admin: AdminClient, specs: dict[TopicPartition, Any], timeout: float
) -> dict[tuple[str, int], int]:
    if not specs:
        return {}
    out: dict[tuple[str, int], int] = {}
    for tp, future in admin.list_offsets(specs, request_timeout=timeout).items():
        out[(tp.topic, tp.partition)] = future.result().offset
    return out


def _committed(
    base: Mapping[str, Any], group: str, partitions: list[TopicPartition], timeout: float
) -> dict[tuple[str, int], int | None]:
    """``group``'s committed offset of each partition (None: never committed), asked through the
    consumer group protocol's OffsetFetch (see the module docstring for why not the admin's)."""
    # A reader never subscribes, so it never joins the group nor commits to it.
    consumer = Consumer(client_config(base, "reader", group_id=group))
    try:
        found = consumer.committed(partitions, timeout=timeout)
    finally:
        consumer.close()
    failed = [tp for tp in found if tp.error is not None]
    if failed:
        # Not "never committed": that would count the partition's lag from its log start.
        raise KafkaException(failed[0].error)
    return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}


def group_lag(
    admin: AdminClient,
    base: Mapping[str, Any],
    reads: GroupReads,
    timeout: float,
) -> list[PartitionLag]:
    """``reads.group``'s lag on every partition of the topics it reads (those that exist); of its
    ``assigned`` topics, only the partitions it committed."""
    metadata = ensure_reachable(admin, base, timeout)
    partitions = [
        TopicPartition(t, p)
        for t in (*reads.subscribed, *reads.assigned)
        if t in metadata.topics
        for p in metadata.topics[t].partitions
    ]
    if not partitions:
        return []
    committed = _committed(base, reads.group, partitions, timeout)
    subscribed = set(reads.subscribed)
    partitions = [
        tp
        for tp in partitions
        if tp.topic in subscribed or committed.get((tp.topic, tp.partition)) is not None
    ]
    ends = _offsets(admin, {tp: OffsetSpec.latest() for tp in partitions}, timeout)
    starts = _offsets(admin, {tp: OffsetSpec.earliest() for tp in partitions}, timeout)
    out = []
    for tp in partitions:
        key = (tp.topic, tp.partition)
        done = committed.get(key)
        end = ends.get(key, 0)
        out.append(
            PartitionLag(
                tp.topic,
                tp.partition,
                done,
                end,
                max(end - (done if done is not None else starts.get(key, 0)), 0),
            )
        )
    return out


def list_groups(admin: AdminClient, prefix: str, suffix: str, timeout: float) -> list[str]:
    result = admin.list_consumer_groups(request_timeout=timeout).result()
    return sorted(
        g.group_id
        for g in result.valid
        if g.group_id.startswith(prefix) and g.group_id.endswith(suffix)
    )
