"""``pump``: events/s through the feed pump, beside ``raw-produce`` (bench.cases).

The feed is a file of PUMP_EVENTS events of the workload (written once per run, untimed, in a
forked process), served by ``rhumbatron feed-server`` in a process of its own, as a feed is. The
timed part is one pump pass to the feed's end from a new installation: the fence, the identity's
checkpoint, then every page read, checked line by line, and published in batches of
``pump_batch_max_events``, each with its checkpoint in one Kafka transaction. Each round pumps
under a feed URL of its own (its own checkpoint and transactional id) into the case's own
environment."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.harness import BenchEnv, case
from bench.rows import Row, rate
from bench.runtime_cases import PROJECTS, isolated
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.pump import open_pump
from streams.pump.reference_server import workload_feed

PUMP_EVENTS = 100_000  # the feed file; at most the run's size (--quick)
CORPUS = "7f3e9c1a-2b4d-4e6f-8a0b-1c2d3e4f5a6b"
LINEAGE = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
FEED_FILE = "pump-feed.ndjson"
SERVER_START_S = 30.0


def _write_feed(path: Path, count: int) -> None:
    lines = workload_feed("pump", PROJECTS, count)
    partial = path.with_suffix(".partial")
    partial.write_bytes(b"".join(line + b"\n" for line in lines))
    partial.rename(path)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _setup(env: BenchEnv) -> None:
    s = env.settings = Settings(**{**env.settings.model_dump(), "env": f"{env.settings.env}_p"})
    provision_environment(s)  # the streams and the pump's checkpoint topic
    path = env.run_dir / FEED_FILE
    count = min(PUMP_EVENTS, env.size)
    if not path.exists():
        isolated(_write_feed, path, count)
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "feed-server",
            "--file",
            str(path),
            "--corpus-id",
            CORPUS,
            "--lineage",
            LINEAGE,
            "--port",
            str(port),
            "--page-size",
            str(s.pump_page_size),
        ],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/round-{env.round}"
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/control", timeout=1)
            break
        except httpx.HTTPError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"the feed server on port {port} did not start") from None
            time.sleep(0.1)
    env.scratch.update(server=server, url=url, count=count)


def _teardown(env: BenchEnv) -> None:
    server = env.scratch.get("server")
    if server is not None:
        server.terminate()
        server.wait(timeout=10)


@case("pump", setup=_setup, teardown=_teardown)
def pump(env: BenchEnv) -> list[Row]:
    started = time.perf_counter()
    with open_pump(env.settings, env.scratch["url"]) as running:
        result = running.pass_once()
    seconds = time.perf_counter() - started
    if result.published != env.scratch["count"]:
        raise RuntimeError(f"pumped {result.published} events of {env.scratch['count']}")
    return [
        rate(
            "pump",
            result.published,
            seconds,
            "events/s",
            vs="raw-produce",
            note=f"a feed file of {result.published} events, batches of "
            f"{env.settings.pump_batch_max_events}",
        )
    ]
