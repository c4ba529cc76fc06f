"""The command worker: ``worker`` (commands/s of one queue worker, no failures) and
``worker-flaky`` (10 % of the commands failing once, retried after a short delay), beside
``raw-consume-queue``, the raw confluent-kafka consume of the same queue in the same run.

Each round fills a queue of its own (untimed, in a forked process): the raw consume and the
worker read the same one (each with its own group), the flaky worker another, so its retries are
never read by the other cases."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from bench import raw
from bench.harness import BenchEnv, case, delete_keys
from bench.rows import Row, rate
from bench.runtime_cases import isolated
from consumers.redis_conn import connect
from router.settings import QueuePolicy, Settings
from router.wiring.workers import open_worker, provision_queues
from router.workers.drills import FlakyHandler, OkHandler
from router.workers.model import QueueHandler
from streams.envelopes import Command, build
from streams.producer import Producer
from streams.topology import queue_name

QUEUE = "agent-wakeups"
# The flaky case's retry delay: short, so the figure is the runtime's cost, not the wait.
FLAKY_DELAY_S = 1.0


def _queue_settings(env: BenchEnv, suffix: str) -> Settings:
    base = env.settings
    queues = dict(base.queues)
    queues[QUEUE] = queues[QUEUE].model_copy(update={"retry_delay_s": FLAKY_DELAY_S})
    return Settings(
        env=f"{base.env}_{suffix}{env.round}",
        partitions=base.partitions,
        connect_timeout_s=base.connect_timeout_s,
        queue_partitions=4,
        queues={k: QueuePolicy.model_validate(v.model_dump()) for k, v in queues.items()},
    )


def _fill(s: Settings, size: int) -> None:
    provision_queues(s, [QUEUE])
    producer = Producer(s.kafka_config())
    now = datetime.now(UTC)
    topic = queue_name(QUEUE, s.env)
    for i in range(size):
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
    producer.flush(300)  # raises for any command not acknowledged


def _filled(suffix: str) -> Callable[[BenchEnv], None]:
    def setup(env: BenchEnv) -> None:
        s = _queue_settings(env, suffix)
        marker = env.run_dir / f"queue-{s.env}"
        if not marker.exists():
            isolated(_fill, s, env.size)
            marker.write_text(str(env.size))
        env.scratch["settings"] = s

    return setup


def _forget_worker(env: BenchEnv) -> None:
    """The worker's Redis keys (a completed command id each: a million of them after a round of
    both workers, which slowed the next round's subscriptions) deleted after its case."""
    s = env.scratch.get("settings")
    if isinstance(s, Settings):
        delete_keys(connect(s.redis_url, timeout=5), f"rh:{s.env}:*")


def _settings(env: BenchEnv) -> Settings:
    s = env.scratch["settings"]
    assert isinstance(s, Settings)
    return s


@case("raw-consume-queue", setup=_filled("q"))
def raw_consume_queue(env: BenchEnv) -> list[Row]:
    s = _settings(env)
    started = time.perf_counter()
    seen = raw.raw_consume(s.kafka_bootstrap, [queue_name(QUEUE, s.env)], env.size)
    return [
        rate(
            "raw-consume-queue",
            seen,
            time.perf_counter() - started,
            "commands/s",
            note="confluent-kafka, no decoding",
        )
    ]


def _through_worker(env: BenchEnv, name: str, handler: QueueHandler) -> list[Row]:
    s = _settings(env)
    started = time.perf_counter()
    process = open_worker(s, QUEUE, handler)
    worker = process.worker
    try:
        worker.run(should_stop=lambda: worker.stats.outcomes["ok"] >= env.size, tick=process.tick)
    finally:
        process.close()
    seconds = time.perf_counter() - started
    outcomes = worker.stats.outcomes
    note = (
        f"batch {worker.policy.batch}, {worker.stats.transactions} transactions, "
        f"{outcomes['retried']} retried"
    )
    return [rate(name, outcomes["ok"], seconds, "commands/s", vs="raw-consume-queue", note=note)]


@case("worker", setup=_filled("q"), teardown=_forget_worker)
def worker_ok(env: BenchEnv) -> list[Row]:
    return _through_worker(env, "worker", OkHandler())


@case("worker-flaky", setup=_filled("qf"), teardown=_forget_worker)
def worker_flaky(env: BenchEnv) -> list[Row]:
    return _through_worker(env, "worker-flaky", FlakyHandler())
