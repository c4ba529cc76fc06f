"""Running command workers and the dead-letter consumer as processes for real-broker tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from router.settings import QueuePolicy, Settings
from streams.envelopes import Command, build
from streams.producer import Producer
from streams.topology import queue_name
from tests.support.environment import (
    ROOT,
    cleanup_environment,
    make_settings,
    run_cli,
    subprocess_env,
)

QUEUE = "agent-wakeups"


def short_queues(delay_s: float, retries: int = 3) -> dict[str, QueuePolicy]:
    return {
        purpose: QueuePolicy(
            batch=policy.batch,
            retries=retries if purpose != "dead-letter" else policy.retries,
            retry_delay_s=delay_s,
            max_in_flight=policy.max_in_flight,
            dead_letter=policy.dead_letter,
        )
        for purpose, policy in Settings().queues.items()
    }


def settings_factory(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    """Body of a ``make`` fixture: settings for a fresh environment, removed afterwards."""
    made: list[Settings] = []

    def factory(**overrides: Any) -> Settings:
        s = make_settings(
            router_outbox_path=str(tmp_path / "router-outbox.sqlite"),
            session_timeout_ms=6000,
            transaction_timeout_ms=8000,
            # Longer than a transactional call may block behind a killed worker's open
            # transaction: up to its transaction_timeout_ms (8 s) and the broker's 10 s sweep
            # for timed-out transactions. At 6 s a restarted worker's lease expired while its
            # offsets waited for the zombie's abort.
            producer_lease_ttl_s=20,
            outbox_poll_interval_s=0.2,
            **overrides,
        )
        made.append(s)
        return s

    yield factory
    for s in made:
        cleanup_environment(s)


def env_of(s: Settings) -> dict[str, str]:
    queues = {k: v.model_dump() for k, v in s.queues.items()}
    return subprocess_env(s, RHUMBATRON_QUEUES=orjson.dumps(queues).decode())


def cli(s: Settings, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *args, env=env_of(s), check=check)


def start_worker(
    s: Settings, *args: str, failpoints: str = "", journal: Path | None = None
) -> subprocess.Popen[str]:
    """``journal``: where tests.support.team_handlers notes each run."""
    env = env_of(s)
    if failpoints:
        env["RHUMBATRON_FAILPOINTS"] = failpoints
    if journal is not None:
        env["TEAM_JOURNAL"] = str(journal)
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, int]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{err[-3000:]}"
    stats: dict[str, int] = orjson.loads(out.strip().splitlines()[-1])
    return stats


def commands(n: int, prefix: str, **payload: Any) -> list[Command]:
    now = datetime.now(UTC)
    return [
        build(
            Command,
            command_id=f"cmd_{prefix}{i:04d}",
            command_type="agent.wake",
            project_id=f"proj-{i % 7}",
            change_id=f"chg-{i % 7}",
            task_id=f"task-{i}",
            created_at=now,
            deadline=now + timedelta(hours=1),
            payload={"agentId": f"agent-{i % 3}", **payload},
        )
        for i in range(n)
    ]


def send(s: Settings, cmds: list[Command], purpose: str = QUEUE) -> None:
    producer = Producer(s.kafka_config())
    for c in cmds:
        producer.produce_command(queue_name(purpose, s.env), c, max_bytes=s.max_envelope_bytes)
    producer.flush(30)
