"""One ``change.dispatch`` made by the real processes, each exporting its spans over OTLP/HTTP to
the endpoint a test gives (tests/tracing): ``produce --outbox`` (the writer), ``publish``, the
``project-view-projector`` and ``causal-router`` consumers, and the ``integration`` queue's
worker, one after the other on the real broker. Each flushes its spans on its way out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from router.settings import Settings
from tests.support.environment import ROOT, run_cli, subprocess_env

PROJECTOR = "project-view-projector"
ROUTER = "causal-router"
QUEUE = "integration"  # change.dispatch goes there (causal_router.commands.QUEUES)
# A project's first 12 workload events: t0 runs and completes, so the router dispatches t1.
EVENTS = "12"
IDLE_S = "2"
RUN_TIMEOUT_S = 180


def traced_env(s: Settings, endpoint: str) -> dict[str, str]:
    """The processes' environment: ``s``'s, exporting to ``endpoint`` every 100 ms."""
    env = {k: v for k, v in subprocess_env(s).items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    return env


def run_dispatch(s: Settings, outbox: Path, env: dict[str, str]) -> None:
    """The five processes, each run to its end (the consumers and the worker until idle)."""
    produce = ["produce", "--outbox", str(outbox), "--projects", "1", "--events", EVENTS]
    run_cli(s, *produce, env=env, check=True)
    run_cli(s, "publish", "--outbox", str(outbox), "--until-empty", env=env, check=True)
    consumers = {slug: _consume(env, slug) for slug in (PROJECTOR, ROUTER)}
    for slug, proc in consumers.items():
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, f"{slug} exited {proc.returncode}:\n{err[-3000:]}"
    worker = ["worker", "--queue", QUEUE, "--handler", "ok", "--until-idle", IDLE_S]
    run_cli(s, *worker, env=env, check=True)


def _consume(env: dict[str, str], slug: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", "consume", "--subscription", slug]
        + ["--until-idle", IDLE_S],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
