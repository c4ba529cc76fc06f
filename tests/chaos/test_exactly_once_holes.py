"""Exactly-once holes, reproduced on the real broker and Redis as a user would meet them: a head
event of one project fails while later events of another project in the same partition apply,
and the router process dies right after that batch's store commit."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from router.operator.queues import read_commands
from router.settings import Settings
from router.wiring.subscription import dead_letters
from streams.envelopes import Event, build
from streams.ids import stable_event_id
from tests.support.runtime_processes import cli, consume_cli, publish, runtime_settings

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

START = datetime(2026, 3, 1, tzinfo=UTC)


def _event(project: str, n: int, event_type: str, **payload: object) -> Event:
    return build(
        Event,
        event_id=stable_event_id(f"{project}-chg", event_type, None, f"{project}/{n}"),
        event_type=event_type,
        tenant_id="t",
        project_id=project,
        change_id=f"{project}-chg",
        task_id=f"{project}-t{n}" if event_type.startswith("task.") else None,
        actor="test",
        timestamp=START + timedelta(seconds=n),
        payload=payload,
        slot=n,
    )


def _projects_on_one_partition(s: Settings, prefix: str) -> tuple[str, str]:
    first = f"{prefix}-x"
    where = s.topology.partition_of(first)
    for n in range(10_000):
        other = f"{prefix}-y{n}"
        if s.topology.partition_of(other) == where:
            return first, other
    raise AssertionError("no second project on the same partition")


def test_a_router_killed_after_a_held_back_batch_still_emits_every_command(
    settings: Settings, tmp_path: Path
) -> None:
    s = runtime_settings(
        settings,
        batch_size=50,
        router_outbox_path=str(tmp_path / "router-outbox.sqlite"),
        maintenance_enabled=False,
    )
    x, y = _projects_on_one_partition(s, "hold")
    cli(s, "provision")
    # The partition's committed offset moves past x's first event...
    publish(s, [_event(x, 1, "project.created", name=x)])
    first = consume_cli(s, "causal-router", until_idle=3)
    assert first.returncode == 0, first.stderr[-3000:]
    # ...then x's next event fails for good (a task.created whose dependsOn is not a list of
    # task ids) and y's four promotions apply past it: acked_through does not move.
    bad = _event(x, 2, "task.created", dependsOn=12, resources=[])
    promotions = [
        _event(y, n, "artifact.promoted", candidateId=f"{y}-cand-{n}", generation=n)
        for n in range(1, 5)
    ]
    publish(s, [bad, *promotions])
    victim = consume_cli(
        s,
        "causal-router",
        until_idle=30,
        env={"RHUMBATRON_FAILPOINTS": "runtime.after_store_commit@1"},
    )
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-3000:]
    survivor = consume_cli(s, "causal-router", until_idle=6)
    assert survivor.returncode == 0, survivor.stderr[-3000:]

    queued = read_commands(s)
    assert queued.repeated_ids() == {}
    builds = sorted(
        c.payload["generation"]
        for c in queued.commands
        if c.command_type == "index.build" and c.project_id == y
    )
    assert builds == [1, 2, 3, 4], "y's index.build commands were lost"
    letters = dead_letters(s, connect(s.redis_url, timeout=5)).list()
    held = [e.event_id for letter in letters for e in letter.entries]
    assert held == [bad.event_id]
