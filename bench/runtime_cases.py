"""The run's shared workload and the subscription cases' common part, the raw confluent-kafka
consume of it (``raw-consume``, the limit every subscription row is set beside) and the ``ledger``
subscription with ``claim-bytes``, the Redis bytes it keeps per claimed event.

The workload is published once per run, into the run's own environment, by the first case that
needs it (a marker file in the run's folder says it is there). Every subscription case reads it
from the start: before each round its Redis keys and its consumer group are deleted, so a later
round does not find its events already claimed. Subscriptions do not disturb each other: each
has its own group and its own keys."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import KafkaException

from bench import raw
from bench.harness import BenchEnv, CpuMeter, CpuUse, case, cpu_row, delete_keys
from bench.rows import Row, rate
from consumers.redis_conn import connect
from consumers.runtime.runner_base import Stats
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from streams.admin import admin_client
from streams.producer import Producer, send_to_streams
from streams.topology import group_id
from streams.workload import slotted_events, workload

PROJECTS = 500
PUBLISHED = "published"  # the marker file in the run's folder


def isolated(fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` in a forked process and wait for it: what a setup builds there (a
    workload of half a million events) does not count in the case's peak RSS. Its error is
    raised here, named."""
    reader, writer = multiprocessing.get_context("fork").Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(
        target=_reporting, args=(writer, fn, *args)
    )
    process.start()
    writer.close()
    try:
        error = reader.recv()  # the child's error, if it failed
    except EOFError:  # it finished without one
        error = None
    process.join()
    if process.exitcode != 0:
        name = getattr(fn, "__name__", str(fn))
        raise RuntimeError(f"{name}: {error or f'exit code {process.exitcode}'}")


def _reporting(writer: Connection, fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:
        writer.send(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
        raise
    finally:
        writer.close()


def _publish(settings: Settings, size: int) -> None:
    provision_environment(settings)  # the subscriptions' redelivery topics too
    events = slotted_events(workload(settings.env, PROJECTS, size), tenant_id="tenant-bench")
    send_to_streams(
        Producer(settings.kafka_config()),
        events,
        stream_for=settings.topology.stream_for,
        max_bytes=settings.max_envelope_bytes,
        flush_timeout=300,
    )


def published(env: BenchEnv) -> None:
    """The run's streams hold env.size events of the workload (published by the first case of
    the run that asks)."""
    marker = env.run_dir / PUBLISHED
    if marker.exists():
        return
    isolated(_publish, env.settings, env.size)
    marker.write_text(str(env.size))


def fresh_subscription(env: BenchEnv, slug: str) -> None:
    """The shared workload, and none of ``slug``'s state of an earlier round."""
    published(env)
    forget_subscription(env.settings, slug)


def forget_subscription(s: Settings, slug: str) -> None:
    """``slug``'s Redis keys and its consumer group in the environment of ``s`` deleted."""
    client = connect(s.redis_url, timeout=5)
    patterns = (
        f"rh:{s.env}:{{{slug}|*",
        f"rh:{s.env}:{{slots}}:{slug}:*",
        f"rh:{s.env}:{{audit}}:{slug}",
        f"rh:{s.env}:{slug}:*",
    )
    delete_keys(client, *patterns)
    admin = admin_client(s.kafka_config())
    for future in admin.delete_consumer_groups([group_id(slug, s.env)]).values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if "GROUP_ID_NOT_FOUND" not in str(exc):
                raise


def redis_bytes(env: BenchEnv, pattern: str, settings: Settings | None = None) -> int:
    """``MEMORY USAGE key SAMPLES 0`` summed over the keys matching ``pattern``, asked 1,000 keys
    a round trip (the ledger's claims are tens of thousands of small hashes)."""
    client = connect((settings or env.settings).redis_url, timeout=5)
    keys = list(client.scan_iter(match=pattern, count=10_000))
    total = 0
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 1000]:
            pipe.memory_usage(key, samples=0)
        total += sum(used or 0 for used in pipe.execute())
    return total


@dataclass(frozen=True)
class Consumed:
    seconds: float
    stats: Stats
    cpu: CpuUse  # this process's CPU over the run, and the broker's and Redis's


def consume(
    env: BenchEnv, slug: str, settings: Settings | None = None, *, count: int | None = None
) -> Consumed:
    """One process of ``slug`` over the shared workload until it has handled env.size records
    (or ``count``): the time from opening it (its group join included, as in the raw consume)
    to the last."""
    count = env.size if count is None else count
    started = time.perf_counter()
    with CpuMeter() as meter:
        subscription = open_subscription(settings or env.settings, slug)
        runner = subscription.runner
        try:
            runner.run(should_stop=lambda: runner.stats.records >= count, tick=subscription.tick)
        finally:
            subscription.close()
    return Consumed(time.perf_counter() - started, runner.stats, meter.use)


def subscription_case(
    name: str, slug: str
) -> Callable[[Callable[[BenchEnv], list[Row]]], Callable[[BenchEnv], list[Row]]]:
    """A case of one subscription over the shared workload: its state of an earlier round
    deleted before it, and its state deleted after it (a subscription's run leaves hundreds of
    thousands of keys: kept, they slowed every later case's Redis by a fifth or more)."""

    def setup(env: BenchEnv) -> None:
        fresh_subscription(env, slug)

    def teardown(env: BenchEnv) -> None:
        forget_subscription(env.settings, slug)

    return case(name, setup=setup, teardown=teardown)


@case("raw-consume", setup=published)
def raw_consume(env: BenchEnv) -> list[Row]:
    s = env.settings
    started = time.perf_counter()
    seen = raw.raw_consume(s.kafka_bootstrap, s.topology.stream_names(), env.size)
    seconds = time.perf_counter() - started
    return [rate("raw-consume", seen, seconds, "events/s", note="confluent-kafka, no decoding")]


@subscription_case("ledger", "ledger")
def ledger(env: BenchEnv) -> list[Row]:
    run = consume(env, "ledger")
    claim_bytes = redis_bytes(env, f"rh:{env.settings.env}:{{ledger|*}}:claims*")
    claimed = run.stats.applied
    return [
        rate("ledger", run.stats.records, run.seconds, "events/s", vs="raw-consume"),
        cpu_row("ledger", run.cpu, run.stats.records),
        Row(
            "claim-bytes",
            claim_bytes / max(claimed, 1),
            "B",
            note=f"MEMORY USAGE of the ledger's claim keys over its {claimed} applied events",
        ),
    ]
