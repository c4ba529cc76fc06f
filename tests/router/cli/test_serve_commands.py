"""``rhumbatron serve`` as a process: it prints its address, answers there, stops on SIGTERM, and
a port already taken is one clear error."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx
import pytest

from router.settings import Settings
from tests.support.environment import ROOT, subprocess_env

pytestmark = pytest.mark.integration


def _serve(s: Settings, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", *args],
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


TOKEN = "serve-test-token-0123456789abcdef"


def test_serve_prints_its_address_answers_there_and_stops_on_sigterm(settings: Settings) -> None:
    proc = _serve(settings, "--port", "0", RHUMBATRON_OPERATOR_TOKEN=TOKEN)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket is bound
        assert line.startswith("operator page at http://127.0.0.1:"), line
        url = line.split()[3]
        info = httpx.get(url + "api/info", timeout=30).json()
        assert info["env"] == settings.env and info["mutations_enabled"] is True
        assert httpx.get(url + "api/health", timeout=30).json()["ok"] is True
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "Rhumbatron operator" in page.text
        refused = httpx.post(url + "api/dead-letters/dl_x/retry", json={"who": "a"}, timeout=30)
        assert refused.status_code == 401
        assert httpx.get(url + "api/dead-letters", timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(url + "api/dead-letters", headers=auth, timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_serve_on_a_taken_port_says_so(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _serve(settings, "--port", str(port))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


def test_serve_refuses_a_port_out_of_range(settings: Settings) -> None:
    proc = _serve(settings, "--port", "70000")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "70000 is out of range" in err
