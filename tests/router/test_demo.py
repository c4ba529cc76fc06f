"""The main job, `rhumbatron demo`, end to end on the real broker and Redis — run twice in one
environment, as a user re-running `make demo` would: the second run also consumes what the first
run's dead-letter path wrote (task.blocked / task.failed through the router's outbox)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from router.demo import (
    CHILD_ROLES,
    FEED_EVENTS,
    FEED_PROJECTS,
    child_environment,
    child_metrics_port,
    run_all,
    serve_operator_page,
)
from router.demo import DRILL_EVENTS as DRILL
from router.operator.pid_file import running_server
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.errors import ConfigurationError
from tests.support.environment import ROOT, make_settings, subprocess_env
from tests.support.files import mode_of, umask
from tests.support.waiting import wait_until

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
        pumped = line_of(out, "pump:")
        assert f"pump: {FEED_EVENTS} events from the reference feed" in pumped, out
        assert pumped.endswith("run again: 0 published"), out
        views = line_of(out, "project views built")
        # + the drill project, + the feed's projects (a new feed run each time)
        assert int(views.split()[-1]) == run * (PROJECTS + 1 + FEED_PROJECTS), out
        assert "operator page" not in out


# -- the operator page it leaves running ---------------------------------------------------------
def _alive(pid: int) -> bool:
    """Running, not merely an exited child nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def page_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings whose state directory is the test's own (not made yet), on a free port; the
    servers the demo leaves running are stopped afterwards."""
    monkeypatch.chdir(ROOT)  # the server runs `python -m router.cli` from the working directory
    s = make_settings(state_dir=tmp_path / "state", operator_port=0)
    yield s
    pid = running_server(s.state_dir / "operator.pid")
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not _alive(pid), 60, f"the operator server {pid} stopped")


def test_the_page_is_served_and_its_token_is_in_a_0600_file_never_printed(
    page_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    state = page_settings.state_dir
    state.parent.chmod(0o755)
    with umask(0o022):
        serve_operator_page(page_settings)
    out = capsys.readouterr().out
    token = (state / "operator-token").read_text().strip()
    assert len(token) >= 32 and token not in out
    assert f"the operator token is in {state / 'operator-token'}, mode 0600" in out
    address = re.search(r"operator page: (http://127\.0\.0\.1:\d+/) ", out)
    assert address, out
    session = httpx.get(
        address.group(1) + "api/session", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert session.status_code == 200, session.text
    assert mode_of(state) == 0o700 and mode_of(state.parent) == 0o755  # only what it made
    for name in ("operator-token", "operator.pid", "operator.log"):
        assert mode_of(state / name) == 0o600, name


def test_an_earlier_server_is_stopped_and_a_foreign_pid_left_alone(
    page_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = page_settings.state_dir / "operator.pid"
    unrelated = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(f"{unrelated.pid}\n")
        serve_operator_page(page_settings)
        out = capsys.readouterr().out
        assert f"note: {pid_file} names pid {unrelated.pid}, which is no operator server" in out
        assert unrelated.poll() is None  # not signalled
        first = running_server(pid_file)
        assert first is not None and first != unrelated.pid
        serve_operator_page(page_settings)
        out = capsys.readouterr().out
        assert f"stopped the operator server of an earlier run (pid {first})" in out
        assert not _alive(first)
        second = running_server(pid_file)
        assert second is not None and second != first and _alive(second)
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait(timeout=30)


def test_a_server_that_cannot_start_is_one_clear_error(page_settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        s = page_settings.model_copy(update={"operator_port": port})
        with pytest.raises(ConfigurationError) as refused:
            serve_operator_page(s)
    assert str(refused.value).startswith(
        f"the operator server did not start: cannot listen on 127.0.0.1:{port}"
    ), refused.value
    assert running_server(s.state_dir / "operator.pid") is None


@pytest.mark.slow  # 54 s; the demo on SQLite, twice, stays in make test
def test_the_demo_runs_on_a_postgresql_outbox(settings: Settings, tmp_path: Path) -> None:
    from tests.support.postgres import FreshSchema

    schema = FreshSchema(init=False)  # the demo makes the outbox's schema
    try:
        result = subprocess.run(
            [sys.executable, "-m", "router.cli", "demo", "--outbox", schema.url]
            + ["--projects", "4", "--events", "200", "--no-serve"],
            cwd=tmp_path,
            env=subprocess_env(settings),
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = result.stdout
        assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
        assert "arrived complete and in slot order: yes" in out, out
        assert f"outbox schema version 3 created in schema {schema.name}" in out
        password = str(psycopg.conninfo.conninfo_to_dict(schema.url)["password"])
        assert password not in out + result.stderr
        assert "into the outbox postgresql://rhumbatron:****@127.0.0.1:5432/rhumbatron" in out
        assert (
            not list(tmp_path.glob("**/*.sqlite"))
            and not (settings.state_dir / f"outbox-{settings.env}.sqlite").exists()
        )
        with schema.connect() as conn:
            # The dead-letter consumer blocked the drill's task through the router's outbox:
            # here, after the writers' events of its project, in the same slot sequence.
            found = conn.execute(
                "SELECT slot, event_type FROM outbox WHERE project_id LIKE 'proj-%-drill-00000' "
                "ORDER BY slot"
            ).fetchall()
    finally:
        schema.drop()
    slots = [slot for slot, _ in found]
    assert slots == list(range(1, len(slots) + 1))
    assert {kind for _, kind in found[5 + DRILL :]} & {"task.blocked", "task.failed"}, found


# -- the children's metrics ports ----------------------------------------------------------------
def test_each_child_gets_the_next_metrics_port_after_the_demos_in_a_fixed_order() -> None:
    s = make_settings(metrics_port=9600)
    ports = {role: child_environment(s, role)["RHUMBATRON_METRICS_PORT"] for role in CHILD_ROLES}
    assert list(ports.values()) == [str(9601 + n) for n in range(len(CHILD_ROLES))]
    assert ports["project-view-projector"] == "9601" and ports["causal-router"] == "9602"
    assert ports["worker-integration"] == "9606" and ports["operator"] == "9610"
    assert Settings(metrics_port=ports["ledger"]).metrics_port == 9605  # the child reads it back


def test_port_0_gives_every_child_a_free_port_and_unset_gives_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    zero = make_settings(metrics_port=0)
    assert {child_environment(zero, r)["RHUMBATRON_METRICS_PORT"] for r in CHILD_ROLES} == {"0"}
    unset = make_settings()
    monkeypatch.setenv("RHUMBATRON_METRICS_PORT", "9600")  # not the settings: never inherited
    assert all("RHUMBATRON_METRICS_PORT" not in child_environment(unset, r) for r in CHILD_ROLES)


def test_a_base_port_whose_children_pass_65535_is_refused_naming_the_limit() -> None:
    with pytest.raises(ConfigurationError) as refused:
        child_metrics_port(make_settings(metrics_port=65530), "worker-integration")
    assert f"set RHUMBATRON_METRICS_PORT to at most {65535 - len(CHILD_ROLES)}" in str(
        refused.value
    )


def _free_ports(count: int) -> int:
    """A base port P with P+1 … P+count free just now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            for port in range(base + 1, base + count + 1):
                with socket.socket() as taken:
                    taken.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no run of free ports")


def test_children_run_together_each_serving_its_own_port_while_the_demo_beats(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _free_ports(len(CHILD_ROLES))
    s = settings.model_copy(update={"metrics_port": base, "demo_beat_interval_s": 0.05})
    provision_environment(s)
    beats: list[None] = []

    def beat() -> None:
        beats.append(None)

    runs = [
        ("worker-indexing", ["worker", "--queue", "indexing", "--handler", "ok"]),
        ("dead-letter-consumer", ["dead-letter-consumer"]),
    ]
    outcomes = run_all(s, [(role, [*args, "--until-idle", "1"]) for role, args in runs], beat)
    assert [code for code, _ in outcomes] == [0, 0], outcomes
    out = capsys.readouterr().out
    for role, _ in runs:
        port = base + 1 + CHILD_ROLES.index(role)
        assert f"  metrics of {role:<24} http://127.0.0.1:{port}/metrics" in out.splitlines(), out
    assert beats  # the demo's own /healthz stays fresh while it waits
