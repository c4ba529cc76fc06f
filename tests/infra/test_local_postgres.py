"""infra/local.sh's PostgreSQL on a private instance (its own state folder and port): start,
status with the password masked, the role and database reachable with the generated password,
kill and start again keeping the data, stop; every subcommand idempotent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.support.environment import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

LOCAL_SH = Path(ROOT) / "infra" / "local.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_postgres_start_status_kill_and_stop_on_a_private_instance() -> None:
    state = Path(tempfile.mkdtemp(prefix="rhumbatron-private-pg-"))
    port = _free_port()
    env = {**os.environ, "RHUMBATRON_LOCAL_DIR": str(state), "RHUMBATRON_POSTGRES_PORT": str(port)}

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(LOCAL_SH), *args], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    home: Path | None = None
    try:
        started = run("postgres-start")
        assert f"postgresql://rhumbatron:***@127.0.0.1:{port}/rhumbatron" in started
        made = started.split("initialising a PostgreSQL cluster in ", 1)[1].split()[0]
        home = Path(made).parent
        if os.getuid() == 0:  # postgres refuses root: the postgres user owns it, outside .local
            assert home.owner() == "postgres" and not home.is_relative_to(state)
        password_file = state / "postgres" / "password"
        password = password_file.read_text().strip()
        assert password and password not in started
        assert password_file.stat().st_mode & 0o777 == 0o600
        url = f"postgresql://rhumbatron:{quote(password)}@127.0.0.1:{port}/rhumbatron"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n integer)")
            conn.execute("INSERT INTO kept VALUES (7)")
        status = run("status")
        assert "postgres: running" in status and password not in status
        assert "already running" in run("postgres-start")
        assert "killed" in run("postgres-kill")
        assert "not running" in run("postgres-kill")
        run("postgres-start")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
        assert "stopped" in run("postgres-stop")
        assert "postgres: stopped" in run("status")
    finally:
        subprocess.run([str(LOCAL_SH), "postgres-stop"], env=env, capture_output=True, timeout=120)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
