"""A team's own handler, loaded by its path, on the real broker and Redis: done, Retry with a
delay (its tier topic provisioned and read), and Fail dead-lettered at once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rhumbatron import send_command
from router.settings import Settings
from router.wiring.workers import provision_queues
from streams.envelopes import decode_command
from streams.headers import ATTEMPTS, ERROR, header_dict
from streams.topology import queue_name
from tests.support.environment import ROOT
from tests.support.kafka import read_all
from tests.support.workers import QUEUE, commands, env_of, send, settings_factory, short_queues

pytestmark = pytest.mark.integration


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


def _worker(env: dict[str, str], handler: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "router.cli",
            "worker",
            "--queue",
            QUEUE,
            "--handler",
            handler,
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_handler_loaded_by_its_path_is_done_retried_on_its_tier_and_failed(
    make: Any, tmp_path: Path
) -> None:
    s = make(queues=short_queues(0.5, retries=3), retry_tiers_s=[2, 60])
    provision_queues(s, [QUEUE])
    done, later, failed = (
        commands(5, "d"),
        commands(3, "l", mode="later"),
        commands(2, "f", mode="fail"),
    )
    send(s, later + done + failed)
    journal = tmp_path / "journal.ndjson"
    env = env_of(s)
    env["TEAM_JOURNAL"] = str(journal)
    result = _worker(env, "tests.support.team_handlers:handlers", "--until-idle", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    runs = [json.loads(line) for line in journal.read_text().splitlines()]
    attempts = Counter((r["id"], r["attempt"]) for r in runs)
    assert all(n == 1 for n in attempts.values()), "an attempt ran twice"
    assert {r["id"] for r in runs if r["attempt"] == 2} == {c.command_id for c in later}
    assert {r["id"] for r in runs} == {c.command_id for c in later + done + failed}
    assert stats["ok"] == len(done) + len(later) and stats["dead_lettered"] == len(failed)
    letters = read_all(s.kafka_bootstrap, [queue_name("dead-letter", s.env)], expect=2, timeout=20)
    assert sorted(
        decode_command(m.value(), max_bytes=s.max_envelope_bytes).command_id for m in letters
    ) == sorted(c.command_id for c in failed)
    for m in letters:
        headers = header_dict(m.headers() or [])  # type: ignore[arg-type]
        assert headers[ATTEMPTS] == b"1" and (headers[ERROR] or b"").endswith(b"is gone")
    tier = read_all(
        s.kafka_bootstrap, [f"rhumbatron-{QUEUE}-retry-2s-{s.env}"], expect=3, timeout=20
    )
    assert len(tier) == len(later)  # the retries waited on the 2 s tier, not the queue's own


def test_a_wrong_handler_path_is_one_line_and_exit_2_before_joining(make: Any) -> None:
    s = make()
    result = _worker(env_of(s), "tests.support.team_handlers:nothing_here")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "rhumbatron: handler 'tests.support.team_handlers:nothing_here': "
        "'tests.support.team_handlers' has no attribute 'nothing_here'"
    ]


def test_a_command_sent_twice_by_a_service_runs_once(make: Any, tmp_path: Path) -> None:
    s = make(queues=short_queues(0.5, retries=2), retry_tiers_s=[2, 60])
    provision_queues(s, [QUEUE])
    journal = tmp_path / "journal.ndjson"
    env = env_of(s)
    env["TEAM_JOURNAL"] = str(journal)
    # From the command line, then from Python with the same id, once the first copy's retry
    # chain is over: the second copy is a duplicate. (A copy arriving while the chain is under
    # way: tests/router/workers/test_handlers.py and the adversarial suite.)
    sent = subprocess.run(
        [
            sys.executable,
            "-m",
            "router.cli",
            "command",
            "send",
            "--type",
            "agent.wake",
            "--project",
            "proj-1",
            "--id",
            "cmd_twice",
            "--payload",
            '{"mode": "later"}',
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout) == {
        "command_id": "cmd_twice",
        "topic": queue_name(QUEUE, s.env),
    }
    result = _worker(env, "tests.support.team_handlers:handlers", "--until-idle", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    send_command(
        "agent.wake", "proj-1", command_id="cmd_twice", payload={"mode": "later"}, settings=s
    )
    result = _worker(env, "tests.support.team_handlers:handlers", "--until-idle", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(r["id"], r["attempt"]) for r in runs] == [("cmd_twice", 1), ("cmd_twice", 2)]
