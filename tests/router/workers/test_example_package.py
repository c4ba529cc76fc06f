"""The example team package (examples/handlers) as a user installs it: the wheel of this
checkout and the example into a virtual environment of their own, from local wheels only
(``--no-index``); the example's own tests run there; then that environment's ``rhumbatron
fleet`` runs a worker per queue with the example's handlers (one named by its entry point, one
by its path) on the real broker, beside a worker that POSTs a third queue's commands to the
TypeScript reference receiver under node, and every command ends as the handlers say."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from router.settings import Settings, WorkerTarget
from router.wiring.workers import provision_queues
from streams.envelopes import decode_command
from streams.topology import queue_name
from tests.support.environment import NO_SUBSCRIPTIONS, ROOT
from tests.support.example_venv import example_venv, run_example_tests
from tests.support.kafka import read_all
from tests.support.node_receiver import SECRET, build, running
from tests.support.waiting import wait_until
from tests.support.workers import commands, env_of, send, settings_factory, short_queues

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "handlers"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_venv(tmp_path_factory.mktemp("example"), EXAMPLE, "acme-handlers[test]")


def test_the_examples_own_tests_pass_in_its_environment(venv: Path) -> None:
    result = run_example_tests(venv, EXAMPLE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "5 passed" in result.stdout


def test_the_fleet_runs_the_examples_handlers_from_its_environment(
    venv: Path, make: Any, tmp_path: Path
) -> None:
    receiver = build()  # the TypeScript receiver, beside the Python package
    received = tmp_path / "receiver.ndjson"
    with running(receiver, received) as url:
        _run_fleet(venv, make, tmp_path, url, received)


def _run_fleet(venv: Path, make: Any, tmp_path: Path, url: str, received: Path) -> None:
    s = make(
        queues=short_queues(0.5),
        retry_tiers_s=[1, 60],
        fleet_subscriptions=NO_SUBSCRIPTIONS,
        fleet_workers={
            "integration": "acme-integration",
            "agent-wakeups": "acme_handlers.wakeups:wake",
            "release": WorkerTarget(http=url, http_secrets=SECRET),
        },
        fleet_dead_letter_consumer=False,
        fleet_analytics_rollup=False,
        fleet_operator_server=False,
        fleet_stop_timeout_s=60.0,
    )
    provision_queues(s, ["integration", "agent-wakeups", "release"])
    journal = tmp_path / "journal.ndjson"
    env = env_of(s)
    env["ACME_JOURNAL"] = str(journal)
    env.pop("PYTHONPATH", None)
    cwd = tmp_path / "elsewhere"  # not the checkout: only what the venv installed is found
    cwd.mkdir()
    fleet = subprocess.Popen(
        [str(venv / "bin" / "rhumbatron"), "fleet"],
        cwd=cwd,
        env=env,
        stdout=(tmp_path / "fleet.out").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wakes = commands(3, "w")
        dispatches = [
            c.model_copy(update={"command_type": "change.dispatch"}) for c in commands(3, "d")
        ]
        waiting = [
            c.model_copy(update={"command_type": "candidate.create"})
            for c in commands(2, "c", wait_first=True)
        ]
        impossible = [
            c.model_copy(update={"command_type": "candidate.create"})
            for c in commands(1, "x", impossible=True)
        ]
        releases = [
            c.model_copy(update={"command_type": "release.start"}) for c in commands(2, "r")
        ]
        send(s, wakes, "agent-wakeups")
        send(s, dispatches + waiting + impossible, "integration")
        send(s, releases, "release")
        expected = {c.command_id for c in wakes + dispatches + waiting}

        def handled() -> set[str]:
            if fleet.poll() is not None:
                raise AssertionError((tmp_path / "fleet.out").read_text()[-3000:])
            if not journal.exists():
                return set()
            return {json.loads(line)["command"] for line in journal.read_text().splitlines()}

        def released() -> set[str]:
            if not received.exists():
                return set()
            return {json.loads(line)["id"] for line in received.read_text().splitlines()}

        wait_until(lambda: handled() == expected, 120, "every command handled by the example")
        wait_until(
            lambda: released() == {c.command_id for c in releases},
            120,
            "every release command handled by the TypeScript receiver",
        )
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        assert len(lines) == len(expected), "a command was handled twice"
        assert {line["command"]: line["attempt"] for line in lines if line["attempt"] > 1} == {
            c.command_id: 2 for c in waiting
        }
        letters = read_all(
            s.kafka_bootstrap, [queue_name("dead-letter", s.env)], expect=1, timeout=30
        )
        assert [
            decode_command(m.value(), max_bytes=s.max_envelope_bytes).command_id for m in letters
        ] == [c.command_id for c in impossible]
    finally:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=90)
        finally:
            if fleet.poll() is None:
                fleet.kill()
    assert fleet.returncode == 0, (tmp_path / "fleet.out").read_text()[-3000:]
