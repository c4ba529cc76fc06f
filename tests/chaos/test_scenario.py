"""The four subscriptions together on the real broker and Redis: one project, one change, a task
graph of 12 tasks with dependencies run by 3 agents through to promotion and release, every event
published twice, and one consumer process SIGKILLed mid-run.

The expectations are computed here, independently of the subscriptions' code: the task graph's
own rules say which tasks become ready when, so which commands the router owes; the view comes from
a plain replay (tests/support/projector_oracle.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import read_view
from router.operator.queues import read_commands
from router.settings import Settings
from streams.envelopes import Event, build
from streams.ids import stable_event_id
from tests.support.kafka import read_all
from tests.support.projector_oracle import expected_view
from tests.support.runtime_processes import (
    cli,
    consume_cli,
    publish,
    runtime_settings,
    start_consume_cli,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

PROJECT = "proj-scenario"
CHANGE = "chg-scenario"
AGENTS = ["agent-a", "agent-b", "agent-c"]
# t0..t3 are roots; t4..t7 each need two roots; t8..t11 each need one of t4..t7.
DEPS: dict[str, list[str]] = {
    **{f"t{i}": [] for i in range(4)},
    **{f"t{4 + i}": [f"t{i}", f"t{(i + 1) % 4}"] for i in range(4)},
    **{f"t{8 + i}": [f"t{4 + i}"] for i in range(4)},
}


def scenario() -> list[Event]:
    """The change's life, in order, with slots 1, 2, 3 …"""
    out: list[Event] = []
    start = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def add(
        etype: str,
        task: str | None,
        payload: dict[str, object],
        key: str | None = None,
        **kw: object,
    ) -> None:
        out.append(
            build(
                Event,
                event_id=stable_event_id(CHANGE, etype, task, key),
                event_type=etype,
                tenant_id="tenant-1",
                project_id=PROJECT,
                change_id=None if etype == "project.created" else CHANGE,
                task_id=task,
                actor=str(kw.pop("actor", "service:integration")),
                timestamp=start + timedelta(seconds=len(out)),
                payload=payload,
                slot=len(out) + 1,
                **kw,
            )
        )

    add("project.created", None, {"name": PROJECT})
    add("change.created", None, {"clientRequestId": "req-1", "title": "scenario"})
    for task, deps in DEPS.items():
        add("task.created", task, {"dependsOn": deps, "resources": [f"src/{task}/main.py"]})
    done: set[str] = set()
    ready = [t for t, d in DEPS.items() if not d]
    for t in ready:
        add("task.ready", t, {})
    n = 0
    while ready:
        wave, ready = ready, []
        for task in wave:
            agent = AGENTS[n % len(AGENTS)]
            n += 1
            add("task.started", task, {"agentId": agent}, actor=f"agent:{agent}")
            add(
                "intent.declared",
                task,
                {"agentId": agent, "resources": [f"src/{task}/main.py"]},
                actor=f"agent:{agent}",
            )
            add("task.completed", task, {"agentId": agent}, actor=f"agent:{agent}")
            done.add(task)
            for t, deps in DEPS.items():
                if (
                    t not in done
                    and t not in ready
                    and t not in wave
                    and deps
                    and set(deps) <= done
                ):
                    ready.append(t)
                    add("task.ready", t, {})
    add("verification.started", None, {"candidateId": "cand-1", "workGraphCompleted": True})
    add("candidate.created", None, {"candidateId": "cand-1"})
    add("candidate.verified", None, {"candidateId": "cand-1"})
    add("artifact.promoted", None, {"candidateId": "cand-1", "generation": 1})
    add("canonical.advanced", None, {"generation": 1}, canonical_generation=1)
    add(
        "release.completed",
        None,
        {"releaseId": f"rel_{PROJECT}_1", "generation": 1},
        canonical_generation=1,
    )
    return out


def expected_commands(events: list[Event]) -> Counter[tuple[str, str | None]]:
    """(command type, task) the router owes, from the graph's rules: a task becomes ready when
    its last dependency completes (a dispatch); a complete work graph under verification asks for
    a candidate; a promotion and a canonical advance each ask for an index build. No resources
    overlap and every agent is idle when the canonical generation advances, so no wakes."""
    owed: Counter[tuple[str, str | None]] = Counter()
    done: set[str] = set()
    for e in events:
        if e.event_type == "task.completed" and e.task_id:
            done.add(e.task_id)
            for t, deps in DEPS.items():
                if deps and e.task_id in deps and set(deps) <= done:
                    owed[("change.dispatch", t)] += 1
        elif e.event_type == "verification.started":
            owed[("candidate.create", None)] += 1
        elif e.event_type in ("artifact.promoted", "canonical.advanced"):
            owed[("index.build", None)] += 1
    return owed


def _consume(s: Settings, slug: str, **env: str) -> subprocess.CompletedProcess[str]:
    return consume_cli(s, slug, env=env)


@pytest.mark.slow  # 49 s; the fault matrix's fast rows kill consumers in make test
def test_a_change_run_through_release_with_duplicates_and_a_killed_consumer(
    settings: Settings, tmp_path: Path
) -> None:
    s = runtime_settings(
        settings,
        batch_size=10,
        archive_dir=str(tmp_path / "archive"),
        archive_part_max_age_s=1.0,
        router_outbox_path=str(tmp_path / "router-outbox.sqlite"),
        maintenance_enabled=False,
    )
    events = scenario()
    assert len([e for e in events if e.event_type == "task.created"]) == 12
    cli(s, "provision")
    publish(s, events)
    publish(s, events)  # every event twice

    slugs = ["project-view-projector", "causal-router", "audit-archiver", "analytics-projector"]
    # One process of each subscription; the router's dies by SIGKILL in the middle of its run.
    killed = _consume(s, "causal-router", RHUMBATRON_FAILPOINTS="runtime.after_store_commit@2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    procs = [start_consume_cli(s, slug, until_idle=4) for slug in slugs]
    for slug, proc in zip(slugs, procs, strict=True):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{slug}: {err[-2000:]}"

    # The view equals the expected view exactly.
    tp = TP(*s.topology.partition_of(PROJECT))
    view = read_view(connect(s.redis_url, timeout=5), s.env, tp, PROJECT)
    assert view == expected_view(PROJECT, tp, events + events)
    assert view["counts"]["task.completed"] == 12

    # The commands on the queues are exactly the expected set, each id once (read_committed).
    contents = read_commands(s)
    assert contents.repeated_ids() == {}
    got = Counter(
        (c.command_type, c.task_id if c.command_type == "change.dispatch" else None)
        for c in contents.commands
    )
    assert got == expected_commands(events)

    # The archive holds every event exactly once.
    verify = cli(
        s, "archive", "verify", "--day", events[0].timestamp.strftime("%Y-%m-%d"), "--json"
    )
    report = json.loads(verify.stdout)
    assert report["events"] == len(events)
    assert not report.get("duplicate_events")

    # The analytics points count each event once.
    points = read_all(
        s.kafka_bootstrap, [f"rhumbatron_event_metrics_{s.env}"], expect=len(events), timeout=30
    )
    per_event = Counter(json.loads(m.value() or b"")["eventId"] for m in points)
    assert set(per_event.values()) == {1}
    assert len(per_event) == sum(1 for e in events if e.event_type not in ("intent.declared",))
