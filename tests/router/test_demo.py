"""The main job, `rhumbatron demo`, end to end on the real broker and Redis — run twice in one
environment, as a user re-running `make demo` would: the second run also consumes what the first
run's dead-letter path wrote (task.blocked / task.failed through the router's outbox)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.settings import Settings
from tests.support.environment import subprocess_env

pytestmark = pytest.mark.integration

PROJECTS = 12
EVENTS = 600  # two changes per project: every kind of command, one agent.wake per change
EVENT_SUBSCRIPTIONS = (
    "project-view-projector",
    "causal-router",
    "audit-archiver",
    "analytics-projector",
)


def run_demo(s: Settings, cwd: Path) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "router.cli",
            "demo",
            "--projects",
            str(PROJECTS),
            "--events",
            str(EVENTS),
            "--no-serve",
        ],
        cwd=cwd,
        env=subprocess_env(s),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def line_of(out: str, label: str) -> str:
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith(label + " ")]
    return line


def worker_stats(out: str, label: str) -> dict[str, Any]:
    line = line_of(out, label)
    assert " ok " in line, line
    stats: dict[str, Any] = orjson.loads(line[line.index("{") :])
    return stats


def dead_lettered(out: str, slug: str) -> int:
    line = line_of(out, slug)
    assert f"{slug} ok" in " ".join(line.split()), line
    match = re.search(r"(\d+) dead-lettered", line)
    assert match, line
    return int(match.group(1))


def test_the_demo_runs_every_part_and_a_second_run_is_as_clean_as_the_first(
    settings: Settings, tmp_path: Path
) -> None:
    for run in (1, 2):
        out = run_demo(settings, tmp_path)
        assert "arrived complete and in slot order: yes" in out, out
        for slug in EVENT_SUBSCRIPTIONS:
            assert dead_lettered(out, slug) == 0, out  # only the drill events end as letters
        assert dead_lettered(out, "ledger") == 3, out
        wakes = worker_stats(out, "agent-wakeups (flaky)")
        assert wakes["records"] >= wakes["ok"] > 0, out
        drill = worker_stats(out, "integration (drill)")
        assert drill["dead_lettered"] == 1, out
        assert worker_stats(out, "indexing (ok)")["failed"] == 0, out
        recorder = line_of(out, "dead-letter-consumer")
        assert '"recorded":1' in recorder, out
        views = line_of(out, "project views built")
        assert int(views.split()[-1]) == run * (PROJECTS + 1), out  # + the drill project
        assert "operator page" not in out
