"""Command worker cases: a worker with no failures and with 10 % of commands failing once, beside a
raw confluent-kafka consume and a share-group consume (KIP-932, explicit ACCEPT) of the same
number of commands on the same queue, in the same run. Each case fills its own environment's
``agent-wakeups`` queue in its setup (not timed)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import confluent_kafka
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from bench import raw
from bench.harness import BenchEnv, case
from router.settings import QueuePolicy, Settings
from router.wiring.workers import open_worker, provision_queues
from router.workers.drills import FlakyHandler, OkHandler
from router.workers.model import QueueHandler
from streams.admin import admin_client
from streams.envelopes import Command, build
from streams.producer import Producer
from streams.topology import queue_name

QUEUE = "agent-wakeups"
RAW = "workers: raw confluent-kafka consume of a queue"
# The flaky case's retry delay: short, so the figure is the runtime's cost, not the wait.
FLAKY_DELAY_S = 1.0


def _filled(env: BenchEnv) -> None:
    base = env.settings
    queues = dict(base.queues)
    queues[QUEUE] = queues[QUEUE].model_copy(update={"retry_delay_s": FLAKY_DELAY_S})
    s = Settings(
        env=f"{base.env}_{uuid.uuid4().hex[:6]}",
        partitions=base.partitions,
        queue_partitions=4,
        queues={k: QueuePolicy.model_validate(v.model_dump()) for k, v in queues.items()},
    )
    env.scratch["settings"] = s
    provision_queues(s, [QUEUE])
    producer = Producer(s.kafka_config())
    now = datetime.now(UTC)
    topic = queue_name(QUEUE, s.env)
    for i in range(env.size):
        command = build(
            Command,
            command_id=f"cmd_bench_{i:07d}",
            command_type="agent.wake",
            project_id=f"proj-{i % 500:03d}",
            task_id=f"task-{i}",
            created_at=now,
            deadline=now + timedelta(hours=1),
            payload={"agentId": f"agent-{i % 8}", "reason": "bench"},
        )
        producer.produce_command(topic, command, max_bytes=s.max_envelope_bytes)
        if i % 1000 == 999:
            producer.poll(0)
    producer.flush(120)


def _settings(env: BenchEnv) -> Settings:
    s = env.scratch["settings"]
    assert isinstance(s, Settings)
    return s


@case(RAW, setup=_filled, unit="commands")
def raw_queue_consume(env: BenchEnv) -> int:
    s = _settings(env)
    return raw.raw_consume(s.kafka_bootstrap, [queue_name(QUEUE, s.env)], env.size)


@case("workers: share-group consume, explicit ACCEPT", baseline=RAW, setup=_filled, unit="commands")
def share_group_consume(env: BenchEnv) -> int:
    s = _settings(env)
    group = f"bench-share-{uuid.uuid4().hex}"
    admin = admin_client(s.kafka_config())
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                "share.auto.offset.reset",
                "earliest",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    consumer = confluent_kafka.ShareConsumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    consumer.subscribe([queue_name(QUEUE, s.env)])
    seen = 0
    while seen < env.size:
        messages = consumer.poll(1.0)
        for m in messages:
            if m.error() is None:
                consumer.acknowledge(m, confluent_kafka.AcknowledgeType.ACCEPT)
                seen += 1
        if messages:
            consumer.commit_async()
    consumer.commit_sync()
    consumer.close()
    return seen


def _through_worker(env: BenchEnv, handler: QueueHandler) -> int:
    s = _settings(env)
    process = open_worker(s, QUEUE, handler)
    worker = process.worker
    try:
        worker.run(should_stop=lambda: worker.stats.outcomes["ok"] >= env.size, tick=process.tick)
    finally:
        process.close()
    outcomes = worker.stats.outcomes
    env.scratch["note"] = (
        f"batch {worker.policy.batch}, {worker.stats.transactions} transactions, "
        f"{outcomes['retried']} retried"
    )
    return outcomes["ok"]


@case("workers: worker, no failures", baseline=RAW, setup=_filled, unit="commands")
def worker_ok(env: BenchEnv) -> int:
    return _through_worker(env, OkHandler())


@case(
    f"workers: worker, 10% failing once ({FLAKY_DELAY_S:g} s delay)",
    baseline=RAW,
    setup=_filled,
    unit="commands",
)
def worker_flaky(env: BenchEnv) -> int:
    return _through_worker(env, FlakyHandler())
