"""A long-running command's cycle collector: what it built at start frozen, its youngest
generation collected every ``gc_young_threshold`` allocations, the older ones at Python's
ratios."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from router.settings import Settings
from router.wiring import collector


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_freezes_the_start_and_sets_the_young_threshold(restored: None) -> None:
    gc.unfreeze()
    _, middle, oldest = gc.get_threshold()
    collector.tune(Settings(gc_young_threshold=12_345))
    assert gc.get_threshold() == (12_345, middle, oldest)
    assert gc.get_freeze_count() > 0


def test_the_default_is_fifty_thousand() -> None:
    assert Settings().gc_young_threshold == 50_000
