"""streams/clock.py's test-only skew: a process whose environment names a skew file has its wall
clock moved by the seconds the file holds, read at every call; its monotonic clock never moves."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.clock import SKEW_ENV, SystemClock


def _between(skew_s: float) -> bool:
    before = datetime.now(UTC)
    skewed = SystemClock().now()
    after = datetime.now(UTC)
    return before + timedelta(seconds=skew_s) <= skewed <= after + timedelta(seconds=skew_s)


def test_without_the_variable_the_clock_is_the_hosts() -> None:
    assert _between(0)


def test_the_skew_file_moves_the_wall_clock_at_each_call_and_never_the_monotonic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skew = tmp_path / "skew"
    skew.write_text("300\n")
    monkeypatch.setenv(SKEW_ENV, str(skew))
    assert _between(300)
    skew.write_text("-300.5")
    assert _between(-300.5)
    began = time.monotonic()
    mono = SystemClock().monotonic()
    assert began <= mono <= time.monotonic()


def test_a_skew_file_that_is_not_there_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SKEW_ENV, str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match=f"{SKEW_ENV}=.*missing"):
        SystemClock().now()
