"""SIGKILL of a ``rhumbatron consume --subscription causal-router`` process around its Kafka
transaction, then a restart, with every event published twice: the commands on the queues are
exactly the expected set, each id once for read_committed readers, and the router's own events
reached the streams."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from router.operator.queues import read_commands
from router.settings import Settings
from streams.envelopes import Event
from tests.support.causal_router import (
    History,
    drive,
    graph_history,
    make_router,
    open_test_outbox,
)
from tests.support.environment import ROOT, subprocess_env
from tests.support.kafka import events_of, read_all
from tests.support.runtime_processes import cli, publish, runtime_settings

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

PROJECTS = [f"router-kill-{n}" for n in range(6)]


def _consume(s: Settings, until_idle: float, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "consume",
            "--subscription",
            "causal-router",
            "--until-idle",
            str(until_idle),
        ],
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events() -> list[Event]:
    histories: list[History] = [graph_history(p, change=f"{p}-chg") for p in PROJECTS]
    out: list[Event] = []
    for n in range(max(len(h.events) for h in histories)):
        out.extend(h.events[n] for h in histories if n < len(h.events))
    return out


# One kill in `make test`, the other two in `make test-slow` (about 30 s each).
@pytest.mark.parametrize(
    "failpoint",
    [
        pytest.param("runtime.after_store_commit@3", marks=pytest.mark.slow),
        pytest.param("runtime.before_transaction_commit@3", marks=pytest.mark.slow),
        "runtime.after_transaction_commit@3",
    ],
)
def test_sigkill_around_the_transaction_leaves_exactly_the_expected_commands(
    settings: Settings, tmp_path: Path, failpoint: str
) -> None:
    s = runtime_settings(
        settings,
        batch_size=20,
        router_outbox_path=str(tmp_path / "router-outbox.sqlite"),
        maintenance_enabled=False,  # its commands depend on the wall clock; tested apart
    )
    events = _events()
    # What the rules decide for these events, computed in process by the same processor.
    expected = drive(make_router(open_test_outbox(tmp_path / "expect.sqlite")), events)
    assert Counter(c.command_type for c in expected) == {
        "change.dispatch": 11 * len(PROJECTS),
        "agent.wake": 4 * len(PROJECTS),
        "candidate.create": len(PROJECTS),
        "index.build": 2 * len(PROJECTS),
    }
    cli(s, "provision")
    publish(s, [e for e in events for _ in (1, 2)])  # every event twice, the copy right behind
    victim = _consume(s, 30, RHUMBATRON_FAILPOINTS=failpoint)
    _, err = victim.communicate(timeout=180)
    assert victim.returncode == -signal.SIGKILL, err[-3000:]
    survivor = _consume(s, 6)
    _, err = survivor.communicate(timeout=180)
    assert survivor.returncode == 0, err[-3000:]

    queued = read_commands(s)
    assert queued.undecodable == 0
    assert queued.repeated_ids() == {}, "a command id reached read_committed readers twice"
    assert sorted(c.command_id for c in queued.commands) == sorted(c.command_id for c in expected)
    assert queued.by_type() == dict(sorted(Counter(c.command_type for c in expected).items()))
    # The router's own candidate.stale events (one per project) went out through its outbox.
    streams = s.topology.stream_names()
    # (At least once: a publisher killed between Kafka's ack and marking the row re-sends it.)
    stale = {
        e.event_id: e
        for e in events_of(
            read_all(s.kafka_bootstrap, streams, expect=2 * len(events) + len(PROJECTS))
        )
        if e.event_type == "candidate.stale"
    }
    assert sorted(e.payload["candidateId"] for e in stale.values()) == sorted(
        f"{p}-chg-cand-0" for p in PROJECTS
    )
    assert {e.actor for e in stale.values()} == {"service:causal-router"}
