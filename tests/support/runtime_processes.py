"""Running subscription processes for real-broker tests."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from router.settings import Settings
from streams.envelopes import Event
from streams.errors import DeliveryFailed
from streams.producer import Producer, send_to_streams
from tests.support.environment import ROOT, run_cli, subprocess_env


def runtime_settings(base: Settings, **overrides: Any) -> Settings:
    values = base.model_dump()
    values.update(
        batch_retry_backoff_s=0.2,
        batch_retry_backoff_max_s=1.0,
        control_check_interval_s=0.5,
        session_timeout_ms=6000,
        batch_size=100,
        transaction_timeout_ms=8000,
    )
    values.update(overrides)
    if "batch_size_behind" not in overrides:
        # Polls of the size the test chose, behind or not (its failpoints count batches).
        values["batch_size_behind"] = values["batch_size"]
    return Settings(**values)


def publish(s: Settings, events: list[Event], *, attempts: int = 5) -> None:
    """Send events to their streams, at least once. A broker loaded by many tests at once can
    refuse a whole produce request with a retriable error (seen: UNKNOWN_TOPIC_OR_PART for every
    topic of a batch); the batch is then sent again, as the outbox publisher would. Duplicates
    are what the subscriptions are built to absorb, and order per project is kept: a batch is
    sent again before any later one."""
    for attempt in range(1, attempts + 1):
        try:
            send_to_streams(
                Producer(s.kafka_config()),
                events,
                stream_for=s.topology.stream_for,
                max_bytes=s.max_envelope_bytes,
                flush_timeout=60,
            )
            return
        except DeliveryFailed as exc:
            transient = all(f.retriable or "UNKNOWN_TOPIC_OR_PART" in f.error for f in exc.failures)
            if attempt == attempts or not transient:
                raise
            time.sleep(0.5 * attempt)


def start(
    s: Settings, name: str, *, until_idle: float | None = None, **env: str
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.support.subscription_main", name]
    if until_idle is not None:
        args += ["--until-idle", str(until_idle)]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(
    s: Settings, name: str, *, until_idle: float = 4.0, timeout: float = 180, **env: str
) -> dict[str, Any]:
    proc = start(s, name, until_idle=until_idle, **env)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{err[-3000:]}"
    stats: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return stats


def cli(s: Settings, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *args, check=check, timeout=120)


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait until a process froze itself with SIGSTOP."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) instead of stopping: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.1)
    raise AssertionError("process did not stop itself")


def consume_args(slug: str, until_idle: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "router.cli",
        "consume",
        "--subscription",
        slug,
        "--until-idle",
        str(until_idle),
    ]


def consume_cli(
    s: Settings,
    slug: str,
    *,
    until_idle: float = 4,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``rhumbatron consume --subscription SLUG --until-idle S`` to the end."""
    return subprocess.run(
        consume_args(slug, until_idle),
        cwd=ROOT,
        env=subprocess_env(s, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_consume_cli(
    s: Settings, slug: str, *, until_idle: float = 4, **env: str
) -> subprocess.Popen[str]:
    """The same, started in the background."""
    return subprocess.Popen(
        consume_args(slug, until_idle),
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait until a tests.support.subscription_main process says it is subscribed."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if line.strip() == "ready":
                return
            if not line and proc.poll() is not None:
                raise AssertionError(f"process exited ({proc.returncode}) before it was ready")
    raise AssertionError("process did not get ready in time")
