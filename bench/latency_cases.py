"""End-to-end latency: an event's outbox commit to its effect in the project-view-projector's
Redis, at a steady write rate, every event measured.

Three processes, as a deployment runs them, so none takes the others' interpreter lock: this case's
own process writes the events through a SQLite outbox (the settings' own, ``synchronous`` FULL by
default), one event per transaction while it keeps up (up to ``WRITE_MAX_EVENTS`` of those due
when it is behind), paced by an absolute schedule (event n is due at start + n / rate, so a late
write does not push the later ones back); ``rhumbatron publish`` moves them to the streams; a projector process
(``python -m bench.latency_cases``) runs the subscription and records, for every event it
applied, the moment the store commit carrying its effect returned (the runtime's ``committed``
instrument hook, called right after that commit).

The start time is the event's own timestamp, which the outbox stamps inside the writer's
transaction just before it commits (millisecond resolution: the envelope's time is ISO with
milliseconds, so a figure can read up to 1 ms long). Both ends read this machine's wall clock.
Percentiles are nearest-rank over every measured event; an event written but never recorded by the
projector fails the case.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.metrics import NoOpMeter

from bench.harness import BenchEnv, case, delete_keys
from bench.rows import Row
from consumers.runtime.metrics import RuntimeInstruments
from router.settings import Settings
from router.wiring.outbox import open_outbox
from router.wiring.provisioning import provision_environment
from streams.workload import workload

ROOT = Path(__file__).resolve().parents[1]
SLUG = "project-view-projector"
PROJECTS = 500
TENANT = "tenant-bench"
WRITE_MAX_EVENTS = 20  # most events of one outbox transaction, when the writer is behind
WARMUP_EVENTS = 50  # written before the measured ones: the first send builds the producer
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 120.0  # after the last write, for the last effects to land
PERCENTILES = (("p50", 0.50), ("p99", 0.99), ("p999", 0.999))


# -- environments of their own (shared with the faust and scale cases) ---------------------------


def fresh_settings(env: BenchEnv, suffix: str) -> Settings:
    """Settings of a new environment under the run's (so the harness's clean-up finds it too)."""
    name = f"{env.settings.env}_{suffix}{uuid.uuid4().hex[:4]}"
    return Settings(**{**env.settings.model_dump(), "env": name})


def remove_environment(s: Settings) -> None:
    """Delete the environment's topics and Redis keys (everything whose name holds its name)."""
    from consumers.redis_conn import connect
    from streams.admin import admin_client, delete_topics

    base = s.kafka_config()
    admin = admin_client(base)
    topics = [t for t in admin.list_topics(timeout=60).topics if s.env in t]
    delete_topics(admin, base, topics, timeout=60)
    delete_keys(connect(s.redis_url, timeout=5), f"*{s.env}*")


def settings_environ(s: Settings) -> dict[str, str]:
    """The process environment that gives a child ``rhumbatron`` command these settings."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RHUMBATRON_", "OTEL_"))}
    for name, value in s.model_dump(exclude={"queues", "failure_policies"}).items():
        if value is not None and not isinstance(value, dict):
            environ[f"RHUMBATRON_{name.upper()}"] = str(value)
    environ["OTEL_SDK_DISABLED"] = "true"
    return environ


def percentile(ordered: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)]


# -- the projector process ----------------------------------------------------------------------


class CommitTimes(RuntimeInstruments):
    """Records (event time ms, commit returned ms) of every applied event, and counts those
    stamped at or after ``measured_from`` once it is known; records nothing else."""

    def __init__(self) -> None:
        super().__init__(NoOpMeter("bench.latency"))
        self.samples: list[tuple[int, float]] = []
        self.measured_from: int | None = None
        self.measured = 0

    def committed(self, subscription: str, event_times_ms: Iterable[int], now_s: float) -> None:
        now_ms = now_s * 1000
        since = self.measured_from
        for ms in event_times_ms:
            self.samples.append((ms, now_ms))
            if since is not None and ms >= since:
                self.measured += 1


def run_projector(s: Settings, workdir: Path, expected: int) -> None:
    """The projector process: ``ready`` once every partition is assigned; ``samples.json`` when
    ``expected`` measured events arrived or ``stop`` appeared."""
    from router.wiring.subscription import open_subscription

    subscription = open_subscription(s, SLUG)
    runner = subscription.runner
    times = CommitTimes()
    runner.instruments = times
    partitions = len(s.topology.subscription_reads(SLUG).subscribed) * s.partitions
    ready = workdir / "ready"
    stop = workdir / "stop"
    checked = [0.0]

    def should_stop() -> bool:
        if not ready.exists() and len(runner.parts) >= partitions:
            ready.touch()
        now = time.monotonic()
        if now - checked[0] < 0.05:
            return False
        checked[0] = now
        if stop.exists():
            return True
        if times.measured_from is None:
            if not (workdir / "measured_from").exists():
                return False
            since = int((workdir / "measured_from").read_text())
            times.measured = sum(1 for ms, _ in times.samples if ms >= since)
            times.measured_from = since
        return times.measured >= expected

    try:
        runner.run(should_stop=should_stop, tick=subscription.tick)
    finally:
        subscription.close()
        (workdir / "samples.json").write_bytes(orjson.dumps(times.samples))


# -- the case -----------------------------------------------------------------------------------


def _wait_for(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _write_paced(store: Any, drafts: list[Any], rate: float) -> tuple[float, int, int]:
    """Append the drafts at ``rate`` per second by absolute schedule (draft n is due at start +
    n / rate): each transaction takes the drafts due by then, one when the writer keeps up, up to
    ``WRITE_MAX_EVENTS`` when a commit took longer than the spacing (an event is stamped at its
    append and waits for its transaction's commit, so a wider one would lengthen the figure it
    measures). Returns (seconds taken, transactions, most drafts in one)."""
    started = time.perf_counter()
    written = transactions = widest = 0
    while written < len(drafts):
        now = time.perf_counter()
        due = min(int((now - started) * rate) + 1, len(drafts), written + WRITE_MAX_EVENTS)
        if due <= written:
            time.sleep(started + written / rate - now)
            continue
        with store.transaction() as unit:
            for draft in drafts[written:due]:
                unit.append(draft.project_id, [draft], tenant_id=TENANT)
        transactions += 1
        widest = max(widest, due - written)
        written = due
    return time.perf_counter() - started, transactions, widest


def measure_latency(env: BenchEnv, rate: int, prefix: str) -> list[Row]:
    quick = env.quick
    seconds = 15 if quick else 60
    count = rate * seconds
    s = fresh_settings(env, "lat")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        provision_environment(s, subscriptions=[SLUG])
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
            workdir = Path(tmp)
            outbox_path = workdir / "outbox.sqlite"
            store = open_outbox(s, outbox_path, create=True)
            environ = settings_environ(s)
            projector = subprocess.Popen(
                [sys.executable, "-m", "bench.latency_cases", str(workdir), str(count)],
                cwd=ROOT,
                env=environ,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            procs.append(projector)
            publisher = subprocess.Popen(
                [sys.executable, "-m", "router.cli", "publish", "--outbox", str(outbox_path)],
                cwd=ROOT,
                env=environ,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(publisher)
            _wait_for(workdir / "ready", projector, "the projector process")
            drafts = workload(uuid.uuid4().hex[:6], PROJECTS, WARMUP_EVENTS + count)
            _write_paced(store, drafts[:WARMUP_EVENTS], 100)
            time.sleep(1.0)
            # Measured: events stamped from now on (a timestamp is whole milliseconds).
            measured_from = int(time.time() * 1000) + 1
            time.sleep(0.002)
            # Renamed into place, so the projector never reads a half-written file.
            (workdir / "measured_from.tmp").write_text(str(measured_from))
            (workdir / "measured_from.tmp").rename(workdir / "measured_from")
            print(f"    e2e: writing {count} events at {rate}/s ...", file=sys.stderr, flush=True)
            took, transactions, widest = _write_paced(store, drafts[WARMUP_EVENTS:], rate)
            try:
                projector.wait(DRAIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                (workdir / "stop").touch()
                projector.wait(60)
            samples = orjson.loads((workdir / "samples.json").read_bytes())
            store.close()
        latencies = sorted(end - ms for ms, end in samples if ms >= measured_from)
        if len(latencies) < count:
            raise RuntimeError(
                f"{count - len(latencies)} of {count} events written at {rate}/s never reached "
                "the projector's view"
            )
        note = (
            f"{count} events at {rate}/s for {seconds} s by absolute schedule (written in "
            f"{took:.1f} s, {transactions} outbox transactions, at most {widest} events in one)"
            f"{', --quick' if quick else ''}; outbox commit (the event's own timestamp) to the "
            f"projector's store commit returned; `rhumbatron publish` and the projector each a "
            f"process; outbox_poll_interval_s {s.outbox_poll_interval_s}, batch_size "
            f"{s.batch_size}"
        )
        return [
            Row(f"{prefix}-{label}-ms", percentile(latencies, p), "ms", note=note)
            for label, p in PERCENTILES
        ]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)
        remove_environment(s)


@case("e2e-1k", children=True)
def e2e_1k(env: BenchEnv) -> list[Row]:
    """Rows e2e-p50-ms, e2e-p99-ms, e2e-p999-ms: 1,000 events/s."""
    return measure_latency(env, 1000, "e2e")


@case("e2e-5k", children=True)
def e2e_5k(env: BenchEnv) -> list[Row]:
    """Rows e2e-5k-p50-ms, e2e-5k-p99-ms, e2e-5k-p999-ms: 5,000 events/s."""
    return measure_latency(env, 5000, "e2e-5k")


if __name__ == "__main__":
    # The projector process of a latency case: settings from RHUMBATRON_* (settings_environ).
    run_projector(Settings(), Path(sys.argv[1]), int(sys.argv[2]))
