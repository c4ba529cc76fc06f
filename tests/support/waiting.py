"""Waiting on a condition a test can observe, instead of sleeping for a guessed time; and
stopping a process a test started."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.05  # how often the condition is asked; not a timing the test depends on


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> None:
    """Return as soon as ``predicate()`` is true; fail naming ``what`` if it is still false after
    ``timeout`` seconds (a bound against a hang, never a measured expectation). ``explain``: what
    the failure should show of the state it was waiting on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"{what}: not so after {timeout} s{said}")
        time.sleep(POLL_S)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL what is still running after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
