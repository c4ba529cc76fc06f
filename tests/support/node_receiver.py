"""The TypeScript reference receiver (examples/http-receiver) built and run under node, for the
tests that drive it with real workers."""

from __future__ import annotations

import base64
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.environment import ROOT
from tests.support.prometheus import free_port

EXAMPLE = ROOT / "examples" / "http-receiver"
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def build() -> Path:
    """Compiles the example and runs its own tests under node (``npm test``); the server's path."""
    result = subprocess.run(
        ["npm", "test"], cwd=EXAMPLE, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout and "# pass 4" in result.stdout
    return EXAMPLE / "dist" / "src" / "server.js"


@contextmanager
def running(server: Path, journal: Path) -> Iterator[str]:
    """The receiver on a free port, listening; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        ["node", str(server)],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PORT": str(port),
            "RHUMBATRON_HTTP_HANDLER_SECRETS": SECRET,
            "RECEIVER_JOURNAL": str(journal),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _listening(proc)
        yield f"http://127.0.0.1:{port}/commands"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _listening(proc: subprocess.Popen[str], timeout: float = 30) -> None:
    assert proc.stderr is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the receiver exited: {proc.stderr.read()}")
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready and "listening" in proc.stderr.readline():
            return
    raise AssertionError("the receiver did not start listening")
