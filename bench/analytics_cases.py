"""analytics-projector on one process, and the faust rollup over the points it writes, each beside
the raw confluent-kafka consume of the same run (the baseline case lives in bench.runtime_cases).

The rollup case measures end to end: the worker is started and ready (its partitions assigned)
before the clock starts; then ``size`` points are produced in transactions, as the projector
writes them, and the clock stops when the worker has folded all of them into its windows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import confluent_kafka
import orjson

from bench.harness import BenchEnv, case
from bench.runtime_cases import _published
from consumers.subscriptions.analytics.projector import METRIC_NAMES
from router.settings import Settings
from router.wiring.analytics import count_points, fetch_view
from router.wiring.subscription import open_subscription
from streams.admin import admin_client, provision
from streams.envelopes import format_time
from streams.errors import Unreachable
from streams.topology import metrics_topic

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0
POINTS_PER_TRANSACTION = 1000

_rollup: dict[str, Any] = {}


@case(
    "subscription: analytics-projector",
    baseline="runtime: raw confluent-kafka consume",
    setup=_published,
)
def analytics_projector(env: BenchEnv) -> int:
    subscription = open_subscription(env.settings, "analytics-projector")
    runner = subscription.runner
    try:
        runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
    finally:
        subscription.close()
    env.scratch["note"] = f"{count_points(env.settings)} points on the topic (read_committed)"
    return runner.stats.records


def _rollup_settings(env: BenchEnv) -> Settings:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    values = env.settings.model_dump()
    values.update(
        env=env.settings.env + "r",  # its own points topic and app, apart from the other cases
        analytics_rollup_port=port,
        analytics_rollup_dir=str(ROOT / ".local" / "bench-analytics"),
    )
    return Settings(**values)


def _status(s: Settings) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = fetch_view(s, "/analytics/status/")
    except Unreachable:
        return None
    return status


def _start_rollup(env: BenchEnv) -> None:
    """A ready rollup worker over an empty points topic."""
    s = _rollup_settings(env)
    base = s.kafka_config()
    specs = [t for t in s.topology.internal_specs() if t.name == metrics_topic(s.env)]
    provision(admin_client(base), base, specs, topology=s.topology, timeout=30)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    for name, value in s.model_dump(exclude={"queues", "failure_policies"}).items():
        if value is not None and not isinstance(value, dict):
            environ[f"RHUMBATRON_{name.upper()}"] = str(value)
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "analytics-rollup"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _rollup.update(settings=s, proc=proc)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        status = _status(s)
        if status is not None and status["partitions"] == list(range(status["partitionsTotal"])):
            return
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the rollup at port {s.analytics_rollup_port} did not become ready")


@case(
    "analytics: faust rollup (points folded)",
    baseline="runtime: raw confluent-kafka consume",
    setup=_start_rollup,
)
def faust_rollup(env: BenchEnv) -> int:
    s: Settings = _rollup["settings"]
    proc: subprocess.Popen[bytes] = _rollup["proc"]
    try:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "transactional.id": f"bench-points-{s.env}",
                "compression.type": "lz4",
                "linger.ms": 5,
            }
        )
        producer.init_transactions(30)
        metrics = sorted(METRIC_NAMES)
        now = datetime.now(UTC)
        topic = metrics_topic(s.env)
        producer.begin_transaction()
        for n in range(env.size):
            project = f"proj-{n % 500:05d}"
            point = {
                "metric": metrics[n % len(metrics)],
                "projectId": project,
                "changeId": None,
                "taskId": None,
                "eventId": f"evt_{n:032x}",
                "time": format_time(now - timedelta(seconds=n % 3600)),
                "value": 1,
            }
            while True:
                try:
                    producer.produce(topic, orjson.dumps(point), key=project)
                    break
                except BufferError:
                    producer.poll(0.1)
            if n % POINTS_PER_TRANSACTION == POINTS_PER_TRANSACTION - 1:
                producer.commit_transaction(60)
                producer.begin_transaction()
        producer.commit_transaction(60)
        produced_at = time.perf_counter()
        counted = 0
        last_print = 0.0
        while counted < env.size:
            status = _status(s)
            counted = status["pointsCounted"] if status else counted
            if time.monotonic() - last_print > 5:
                print(f"    rollup: {counted}/{env.size}", file=sys.stderr, flush=True)
                last_print = time.monotonic()
            time.sleep(0.1)
        env.scratch["note"] = (
            f"end to end, produce included ({time.perf_counter() - produced_at:.1f}s after the "
            f"last commit); {s.analytics_rollup_guarantee}"
        )
        return counted
    finally:
        proc.kill()
        proc.wait(30)
