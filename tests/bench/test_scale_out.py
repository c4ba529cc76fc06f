"""The scale-out case: pinning puts every thread of a process on one core and gives its mask back;
a process's CPU seconds are read from /proc; and one tiny round through the bench command
measures one and two projector processes (pinned too, where infra/local.sh's broker and Redis
are found), all the events handled, and gives the servers their masks back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import process_cpu_s, servers
from bench.scale_out_cases import pinned

ROOT = Path(__file__).resolve().parents[2]
THREADS = "import threading, time\n[threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(3)]\ntime.sleep(60)"
BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(60)"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", THREADS])
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _masks(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="pinning apart needs two cores")
def test_pinned_moves_every_thread_to_the_core_and_puts_the_mask_back(
    sleeper: subprocess.Popen[bytes],
) -> None:
    before = _masks(sleeper.pid)
    assert len(os.listdir(f"/proc/{sleeper.pid}/task")) == 4
    with pinned([sleeper.pid], 1):
        assert _masks(sleeper.pid) == {frozenset({1})}
    assert _masks(sleeper.pid) == before


def test_a_processes_cpu_seconds_come_from_proc() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        deadline = time.monotonic() + 60
        while process_cpu_s(proc.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.5 <= process_cpu_s(proc.pid) < 5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.integration
@pytest.mark.slow  # 41 s: a bench round
def test_one_round_measures_one_and_two_projector_processes_and_their_cpu() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    size = 3000
    found = servers()
    masks = {pid: os.sched_getaffinity(pid) for pid in (found or {}).values()}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--json", "--rounds", "1", "--size", str(size)]
        + ["scale-out"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(done.stdout)["rows"]}
    assert rows["projector-1p"]["value"] > 0
    assert rows["projector-2p"]["vs"] == "projector-1p" and rows["projector-2p"]["ratio"] > 0
    # Two processes, all the events handled between them (so few events can all go to the
    # first to join: the scale-out test proves the sharing).
    split = rows["projector-2p"]["note"].split(": ", 1)[1].split(";")[0]
    handled = [int(part.split()[0]) for part in split.split(" + ")]
    assert len(handled) == 2 and sum(handled) >= size, split
    if found is None or (os.cpu_count() or 1) < 2:
        return
    assert rows["projector-2p-pinned"]["vs"] == "projector-1p-pinned"
    for name in (
        "projector-1p-pinned-cpu-us",
        "projector-1p-pinned-broker-cpu-us",
        "projector-1p-pinned-redis-cpu-us",
    ):
        assert rows[name]["value"] > 0, name
    assert rows["projector-core-rate"]["value"] == pytest.approx(
        1e6 / rows["projector-1p-pinned-cpu-us"]["value"]
    )
    assert {pid: os.sched_getaffinity(pid) for pid in found.values()} == masks  # theirs again
