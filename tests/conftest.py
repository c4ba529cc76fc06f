"""Shared fixtures.

Integration fixtures use the brokers named by RHUMBATRON_TEST_KAFKA_BOOTSTRAP and the Redis named
by RHUMBATRON_TEST_REDIS_URL when set, else the local servers that `make test` starts. Each test
gets its own environment name, so its topics, groups and Redis keys never meet another test's.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from router.settings import Settings

# Property tests run beside real brokers and subprocesses on a small machine: a generated example
# taking longer than hypothesis's default 200 ms is load, not a failure (timings are not tested).
hypothesis_settings.register_profile("rhumbatron", deadline=None)
hypothesis_settings.load_profile("rhumbatron")

TEST_KAFKA = os.environ.get("RHUMBATRON_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TEST_REDIS = os.environ.get("RHUMBATRON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the developer's shell must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("RHUMBATRON_") and not name.startswith("RHUMBATRON_TEST_"):
            monkeypatch.delenv(name)


def make_settings(**overrides: object) -> Settings:
    values: dict[str, object] = {
        "env": "t" + secrets.token_hex(5),
        "kafka_bootstrap": TEST_KAFKA,
        "redis_url": TEST_REDIS,
        "partitions": 2,
        "queue_partitions": 1,
        "connect_timeout_s": 10.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings() -> Iterator[Settings]:
    """A fresh environment; its topics and Redis keys are removed afterwards."""
    s = make_settings()
    yield s
    cleanup_environment(s)


def cleanup_environment(s: Settings) -> None:
    from consumers.redis_conn import connect
    from streams.admin import admin_client, delete_topics

    base = s.kafka_config()
    admin = admin_client(base)
    try:
        names = [
            t
            for t in admin.list_topics(timeout=10).topics
            if t.endswith(f"_{s.env}") or t.endswith(f"-{s.env}")
        ]
        delete_topics(admin, base, names, timeout=30)
    except Exception:  # cleanup is best effort; the test's own result stands
        pass
    try:
        client = connect(s.redis_url, timeout=5)
        for key in client.scan_iter(match=f"*{s.env}*", count=1000):
            client.delete(key)
    except Exception:
        pass


def subprocess_env(s: Settings, **extra: str) -> dict[str, str]:
    """The environment a CLI subprocess needs to act on ``s``'s environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RHUMBATRON_") or k.startswith("RHUMBATRON_TEST_")
    }
    env.update(s.as_environment())
    env.update(extra)
    return env
