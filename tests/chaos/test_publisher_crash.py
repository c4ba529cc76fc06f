"""A publisher killed (SIGKILL, by the fail-point ``publisher.after_ack``) between Kafka's
acknowledgement and marking its rows published: after a restart nothing is missing, the rows
of the interrupted pass are sent again (duplicates, nothing else), and every project's first
occurrences are in slot order."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from router.settings import Settings
from streams.admin import admin_client, provision
from streams.outbox.store import RowState
from streams.workload import workload, write_workload
from tests.support.environment import ROOT, cleanup_environment, make_settings
from tests.support.kafka import events_of, read_all
from tests.support.outbox import cli_env, outbox_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

PROJECTS, EVENTS, PER_PASS = 50, 3000, 10  # 60 events a project: six passes of 10


@pytest.fixture(params=["serial", "pipelined"])
def crash_settings(request: pytest.FixtureRequest):
    s = make_settings(outbox_ordering=request.param, outbox_rows_per_project_per_pass=PER_PASS)
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    yield s
    cleanup_environment(s)


def _publish(s: Settings, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", "publish", "--outbox", str(path), "--until-empty"],
        cwd=ROOT,
        env=cli_env(s, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_crash_between_ack_and_mark_resends_and_loses_nothing(
    crash_settings: Settings, tmp_path: Path
) -> None:
    s = crash_settings
    path = tmp_path / "outbox.db"
    store = outbox_for(s, path)
    write_workload(store, workload("crash", PROJECTS, EVENTS), writers=4, events_per_write=5)

    crashed = _publish(s, path, RHUMBATRON_FAILPOINTS="publisher.after_ack@3")
    assert crashed.returncode == -9, crashed.stderr  # SIGKILL at the fail-point
    counts = store.counts()
    # Two passes were marked; the third reached Kafka but was never marked.
    assert counts[RowState.PUBLISHED] == 2 * PROJECTS * PER_PASS
    assert counts[RowState.PENDING] == EVENTS - 2 * PROJECTS * PER_PASS

    restarted = _publish(s, path)
    assert restarted.returncode == 0, restarted.stderr
    assert store.counts()[RowState.PUBLISHED] == EVENTS

    resent = PROJECTS * PER_PASS
    messages = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=EVENTS + resent)
    slots: dict[str, list[int]] = defaultdict(list)
    for event in events_of(messages):
        slots[event.project_id].append(event.slot or 0)
    assert sum(len(v) for v in slots.values()) == EVENTS + resent
    for project, found in slots.items():
        first: list[int] = []
        for slot in found:
            if slot not in first:
                first.append(slot)
        assert first == list(range(1, EVENTS // PROJECTS + 1)), project  # nothing missing, in order
        twice = sorted(slot for slot, n in Counter(found).items() if n > 1)
        assert twice == list(range(2 * PER_PASS + 1, 3 * PER_PASS + 1)), project  # the lost marks
    store.close()
