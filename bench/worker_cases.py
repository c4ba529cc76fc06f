"""The command worker: ``worker`` (commands/s of one queue worker, no failures),
``worker-flaky`` (10 % of the commands failing once, retried after a short delay), beside
``raw-consume-queue``, the raw confluent-kafka consume of the same queue in the same run; and
``worker-io``: a handler that waits 50 ms on each command (a call to a service), with
``max_in_flight`` 64 — the ceiling is 64 / 0.05 = 1,280 commands/s, the target 0.6 of it.

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
from router.workers.model import Context, QueueHandler
from streams.envelopes import Command, build
from streams.producer import Producer
from streams.topology import queue_name

QUEUE = "agent-wakeups"
# The flaky case's retry delay: short, so the figure is the runtime's cost, not the wait.
FLAKY_DELAY_S = 1.0


def _queue_settings(env: BenchEnv, suffix: str, **queue: object) -> Settings:
    base = env.settings
    queues = dict(base.queues)
    queues[QUEUE] = queues[QUEUE].model_copy(update={"retry_delay_s": FLAKY_DELAY_S, **queue})
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


def _filled(
    suffix: str, size: Callable[[BenchEnv], int] = lambda env: env.size, **queue: object
) -> Callable[[BenchEnv], None]:
    def setup(env: BenchEnv) -> None:
        s = _queue_settings(env, suffix, **queue)
        marker = env.run_dir / f"queue-{s.env}"
        if not marker.exists():
            isolated(_fill, s, size(env))
            marker.write_text(str(size(env)))
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


def _through_worker(
    env: BenchEnv, name: str, handler: QueueHandler, size: int | None = None, note: str = ""
) -> list[Row]:
    s = _settings(env)
    size = env.size if size is None else size
    started = time.perf_counter()
    process = open_worker(s, QUEUE, handler)
    worker = process.worker
    try:
        worker.run(should_stop=lambda: worker.stats.outcomes["ok"] >= size, tick=process.tick)
    finally:
        process.close()
    seconds = time.perf_counter() - started
    outcomes = worker.stats.outcomes
    said = (
        f"batch {worker.policy.batch}, {worker.stats.transactions} transactions, "
        f"{outcomes['retried']} retried"
    )
    vs = None if note else "raw-consume-queue"
    return [rate(name, outcomes["ok"], seconds, "commands/s", vs=vs, note=f"{note}{said}")]


@case("worker", setup=_filled("q"), teardown=_forget_worker)
def worker_ok(env: BenchEnv) -> list[Row]:
    return _through_worker(env, "worker", OkHandler())


@case("worker-flaky", setup=_filled("qf"), teardown=_forget_worker)
def worker_flaky(env: BenchEnv) -> list[Row]:
    return _through_worker(env, "worker-flaky", FlakyHandler())


# worker-io: a fixed number of commands (at about a thousand a second, the throughput rows'
# size would take minutes), each waiting IO_WAIT_S in its handler, IO_IN_FLIGHT at once.
IO_COMMANDS = 6000
IO_WAIT_S = 0.05
IO_IN_FLIGHT = 64


class WaitingHandler(OkHandler):
    """Waits as a call to a service would, then succeeds."""

    def handle(self, command: Command, ctx: Context) -> str | None:
        time.sleep(IO_WAIT_S)
        return None


@case(
    "worker-io",
    setup=_filled(
        "qio",
        lambda env: min(env.size, IO_COMMANDS),
        max_in_flight=IO_IN_FLIGHT,
        batch=IO_IN_FLIGHT,
    ),
    teardown=_forget_worker,
)
def worker_io(env: BenchEnv) -> list[Row]:
    target = 0.6 * IO_IN_FLIGHT / IO_WAIT_S
    return _through_worker(
        env,
        "worker-io",
        WaitingHandler(),
        size=min(env.size, IO_COMMANDS),
        note=f"{IO_WAIT_S * 1000:g} ms a command, max_in_flight {IO_IN_FLIGHT} "
        f"(target {target:,.0f}/s); ",
    )
