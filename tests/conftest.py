"""Shared fixtures.

Each test gets its own environment on the shared servers (tests/support/environment.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from router.settings import Settings
from tests.support.environment import cleanup_environment, make_settings

# The shared contract classes hold the asserts of the tests that inherit them: rewritten, a
# failing one shows the values it compared, as in a test module.
pytest.register_assert_rewrite("tests.contracts")

# Property tests run beside real brokers and subprocesses on a small machine: a generated example
# taking longer than hypothesis's default 200 ms is load, not a failure (timings are not tested).
hypothesis_settings.register_profile("rhumbatron", deadline=None)
hypothesis_settings.load_profile("rhumbatron")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the developer's shell must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("RHUMBATRON_") and not name.startswith("RHUMBATRON_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings() -> Iterator[Settings]:
    """A fresh environment; its topics and Redis keys are removed afterwards."""
    s = make_settings()
    yield s
    cleanup_environment(s)
