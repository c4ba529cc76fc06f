"""Time, injectable. Code that waits, backs off or stamps times takes a ``Clock`` so tests can
drive it (``ManualClock``) instead of sleeping.

A test-only hook moves the wall clock of a whole process under test, as a host whose clock is
stepped would see it (the chaos matrix's clock row, docs/reliability.md): with the environment
variable ``RHUMBATRON_CLOCK_SKEW_FILE`` naming a file, ``SystemClock.now`` adds the number of
seconds the file holds at each call (a test rewrites it to jump). ``monotonic`` and ``sleep`` are
untouched, as a stepped system clock leaves CLOCK_MONOTONIC alone. Unset (always, outside
tests), it costs one environment lookup. Only this process's ``SystemClock`` moves: librdkafka's
record timestamps and Redis's expiry run on the host's own clock.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""

    def sleep(self, seconds: float) -> None: ...


SKEW_ENV = "RHUMBATRON_CLOCK_SKEW_FILE"  # test-only: see the module's docstring


def _skew() -> timedelta:
    path = os.environ.get(SKEW_ENV)
    if path is None:
        return timedelta(0)
    try:
        with open(path) as f:
            return timedelta(seconds=float(f.read().strip() or 0))
    except (OSError, ValueError) as exc:
        # A test that names a file it never wrote would test nothing: say so, loudly.
        raise RuntimeError(f"{SKEW_ENV}={path}: no clock skew to read there ({exc})") from exc


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC) + _skew()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to. ``sleep`` advances it instead of waiting."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
