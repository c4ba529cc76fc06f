"""The example team package of subscriptions (examples/processors) as a user installs and runs
it: the wheels of this checkout and the example into a virtual environment of their own
(``--no-index``); the example's own tests run there, against a PostgreSQL schema too; then that
environment's ``rhumbatron provision``, the example's ``acme-processors init-db`` and
``rhumbatron fleet`` run its three subscriptions (Redis, SQL and Kafka effects) and its handler on
the real broker, Redis and PostgreSQL, beside the built-in ``ledger``, over a workload during
which the SQL subscription's process is killed with SIGKILL. What they leave is checked against
a record the test keeps of what it published: each project's counts, one history row per task
event and each task's last state, one alert per failed task, the ledger's every event once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers.subscriptions.ledger import read_ledger
from rhumbatron.testing import event
from router.fleet import MemberStatus, read_status, status_path
from router.settings import QueuePolicy, Settings
from router.wiring.subscription import redis_client
from streams.envelopes import Event
from tests.support.environment import NO_SUBSCRIPTIONS, ROOT
from tests.support.example_venv import example_venv, run_example_tests
from tests.support.postgres import FreshSchema
from tests.support.runtime_processes import publish
from tests.support.waiting import wait_until
from tests.support.workers import env_of, settings_factory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "processors"
PROJECTS, TASKS = 10, 12  # three events a task: 360 events, every fourth task failing
HISTORY = "acme-task-history"
SUBSCRIPTIONS = ("acme-task-counts", HISTORY, "acme-failure-alerts")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_venv(tmp_path_factory.mktemp("example"), EXAMPLE, "acme-processors[test]")


@pytest.fixture
def database() -> Iterator[FreshSchema]:
    schema = FreshSchema(init=False)
    yield schema
    schema.drop()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


def test_the_examples_own_tests_pass_in_its_environment(venv: Path, database: FreshSchema) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.pop("PYTHONPATH", None)
    env["ACME_TEST_DATABASE"] = database.url  # none skipped: the statements run in PostgreSQL
    result = run_example_tests(venv, EXAMPLE, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "19 passed" in result.stdout and "skipped" not in result.stdout, result.stdout


@dataclass(frozen=True)
class Workload:
    """What the test published, and what each subscription must make of it."""

    events: list[Event]

    def counts(self) -> dict[str, dict[str, str]]:
        found: dict[str, Counter[str]] = {}
        for e in self.events:
            outcome = {"task.completed": "completed", "task.failed": "failed"}.get(e.event_type)
            counted = found.setdefault(e.project_id, Counter(completed=0, failed=0))
            if outcome is not None:
                counted[outcome] += 1
        return {p: {k: str(n) for k, n in c.items()} for p, c in found.items()}

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            (e.event_id, e.project_id, e.task_id, e.event_type.removeprefix("task."), e.slot)
            for e in self.events
        }

    def last_states(self) -> dict[tuple[str, str], str]:
        last: dict[tuple[str, str], str] = {}
        for e in self.events:  # in slot order per project
            last[(e.project_id, e.task_id or "")] = e.event_type.removeprefix("task.")
        return last

    def failed(self) -> Counter[tuple[str, str]]:
        return Counter(
            (e.project_id, e.task_id or "") for e in self.events if e.event_type == "task.failed"
        )


def workload() -> Workload:
    """Each project's tasks created, started, then completed or failed, in slot order; the
    projects interleaved, as many writers publish at once."""
    start = datetime.now(UTC)
    per_project: list[list[Event]] = []
    for p in range(PROJECTS):
        project, events = f"acme-{p}", list[Event]()
        for t in range(TASKS):
            outcome = "failed" if (p + t) % 4 == 0 else "completed"
            for kind in ("created", "started", outcome):
                slot = len(events) + 1
                payload = {"reason": f"step {t} broke"} if kind == "failed" else {}
                events.append(
                    event(
                        f"task.{kind}",
                        project,
                        slot=slot,
                        task_id=f"{project}-task-{t}",
                        payload=payload,
                        timestamp=start + timedelta(milliseconds=slot),
                    )
                )
        per_project.append(events)
    return Workload([e for row in zip(*per_project, strict=True) for e in row])


def test_the_fleet_runs_the_examples_subscriptions_beside_the_built_ins(
    venv: Path, database: FreshSchema, make: Any, tmp_path: Path
) -> None:
    s = make(
        subscriptions={HISTORY: {"database": database.url}},
        queues={"notifications": QueuePolicy(batch=20, retries=3, retry_delay_s=0.5)},
        fleet_subscriptions={**NO_SUBSCRIPTIONS, "ledger": 1, **dict.fromkeys(SUBSCRIPTIONS, 1)},
        fleet_workers={"notifications": "acme-notify"},
        fleet_dead_letter_consumer=False,
        fleet_analytics_rollup=False,
        fleet_operator_server=False,
        fleet_restart_backoff_s=0.2,
        fleet_stop_timeout_s=60.0,
        batch_size=5,  # many small commits: the kill finds the SQL member amid them
        batch_size_behind=5,
        batch_retry_backoff_s=0.2,
        batch_retry_backoff_max_s=1.0,
    )
    journal = tmp_path / "alerts.ndjson"
    env = env_of(s)
    env["ACME_ALERTS_JOURNAL"] = str(journal)
    env.pop("PYTHONPATH", None)
    cwd = tmp_path / "elsewhere"  # not the checkout: only what the venv installed is found
    cwd.mkdir()

    def tool(*args: str) -> None:
        done = subprocess.run(
            [str(venv / "bin" / args[0]), *args[1:]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"

    # As the example's README says: the runtime's topics and tables, then the team's table.
    tool("rhumbatron", "provision")
    tool("acme-processors", "init-db", "--database", database.url)

    work = workload()
    half = len(work.events) // 2
    log = tmp_path / "fleet.out"
    fleet = subprocess.Popen(
        [str(venv / "bin" / "rhumbatron"), "fleet"],
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )

    def members() -> dict[str, MemberStatus]:
        if fleet.poll() is not None:
            raise AssertionError(f"the fleet exited {fleet.returncode}: {log.read_text()[-3000:]}")
        found = read_status(status_path(s))
        return {m.name: m for m in found.members} if found else {}

    def history_rows() -> int:
        with database.connect(autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM task_history").fetchone()
        assert row is not None and isinstance(row[0], int)
        return row[0]

    try:
        names = {*(f"{slug}-1" for slug in (*SUBSCRIPTIONS, "ledger")), "worker-notifications-1"}
        wait_until(
            lambda: (
                set(members()) == names and all(m.state == "running" for m in members().values())
            ),
            120,
            "every member running",
        )
        publish(s, work.events[:half])
        wait_until(lambda: history_rows() > 0, 120, f"{HISTORY} writing its rows")
        victim = members()[f"{HISTORY}-1"]
        assert victim.pid is not None
        publish(s, work.events[half:])
        # Killed once it has committed some of the second half: amid its batches, unless it
        # wrote them all between two looks.
        wait_until(lambda: history_rows() > half, 120, f"{HISTORY} writing the second half")
        os.kill(victim.pid, signal.SIGKILL)
        print(f"{HISTORY}-1 killed with {history_rows()} of {len(work.events)} rows written")
        wait_until(
            lambda: (
                members()[f"{HISTORY}-1"].restarts == 1
                and members()[f"{HISTORY}-1"].state == "running"
            ),
            60,
            f"{HISTORY}-1 restarted",
        )
        restarted = members()[f"{HISTORY}-1"]
        assert restarted.pid != victim.pid and restarted.last_exit == -signal.SIGKILL

        seen: dict[str, object] = {}

        def caught_up() -> bool:
            members()  # fails at once should the fleet have died
            seen.update(
                counts=_counts(s),
                rows=history_rows(),
                alerts=len(_alerts(journal)),
                ledger=len(read_ledger(redis_client(s), s.env)["counts"]),
            )
            return (
                seen["counts"] == work.counts()
                and seen["rows"] == len(work.events)
                and seen["alerts"] == sum(work.failed().values())
                and seen["ledger"] == len(work.events)
            )

        wait_until(caught_up, 150, "every subscription caught up", lambda: f"last seen: {seen}")
    finally:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=90)
        finally:
            if fleet.poll() is None:
                fleet.kill()
    assert fleet.returncode == 0, log.read_text()[-3000:]

    # Nothing more arrived while the fleet stopped.
    assert _counts(s) == work.counts()
    with database.connect(autocommit=True) as conn:
        rows = conn.execute(
            "SELECT event_id, project_id, task_id, status, slot FROM task_history"
        ).fetchall()
        last = conn.execute(
            "SELECT DISTINCT ON (project_id, task_id) project_id, task_id, status "
            "FROM task_history ORDER BY project_id, task_id, slot DESC"
        ).fetchall()
    assert len(rows) == len(work.events) and set(rows) == work.rows()
    assert {(p, t): status for p, t, status in last} == work.last_states()
    alerts = _alerts(journal)
    assert Counter((a["project"], a["task"]) for a in alerts) == work.failed()
    assert len({a["key"] for a in alerts}) == len(alerts)
    assert all(str(a["key"]).startswith("cmd_idk_") for a in alerts)
    ledger = read_ledger(redis_client(s), s.env)
    assert set(ledger["counts"].values()) == {1}
    assert ledger["projects"] == {
        f"acme-{p}": list(range(1, 3 * TASKS + 1)) for p in range(PROJECTS)
    }


def _counts(s: Settings) -> dict[str, dict[str, str]]:
    """acme-task-counts' hashes, by project."""
    client = redis_client(s)
    found: dict[str, dict[str, str]] = {}
    pattern = f"rh:{s.env}:{{acme-task-counts|*}}:x:task-counts:*"
    for key in client.scan_iter(match=pattern, count=1000):
        project = key.decode().rsplit(":x:task-counts:", 1)[1]
        found[project] = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    return found


def _alerts(journal: Path) -> list[dict[str, object]]:
    """What the stand-in alerting service sent."""
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines()]
