"""Every long-running command runs observed, and so with its cycle collector tuned
(router/wiring/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from router.cli.observed import observed
from router.settings import Settings


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_every_observed_command_runs_with_the_collector_tuned(restored: None) -> None:
    gc.set_threshold(700)
    with observed(Settings(gc_young_threshold=4_321, metrics_port=None), "test"):
        assert gc.get_threshold()[0] == 4_321
