"""Waiting on a condition a test can observe, instead of sleeping for a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable

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
