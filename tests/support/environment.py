"""Test environments on the shared servers: each test's own environment name, so its topics,
groups and Redis keys never meet another test's; and the environment a CLI subprocess needs.

The brokers are those named by RHUMBATRON_TEST_KAFKA_BOOTSTRAP and the Redis named by
RHUMBATRON_TEST_REDIS_URL when set, else the local servers that `make test` starts."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from router.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the checkout: where `python -m` runs from

TEST_KAFKA = os.environ.get("RHUMBATRON_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TEST_REDIS = os.environ.get("RHUMBATRON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Each environment's files (outbox, archive, pid and token files) sit in a folder of its own in
# the checkout, removed with the environment: never in the developer's own state dir.
TEST_STATE = ROOT / ".local" / "test-state"


# fleet_subscriptions running none of them: a fleet test names the few it runs.
NO_SUBSCRIPTIONS = {
    "project-view-projector": 0,
    "causal-router": 0,
    "audit-archiver": 0,
    "analytics-projector": 0,
    "ledger": 0,
}


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
    values.setdefault("state_dir", TEST_STATE / str(values["env"]))
    return Settings(**values)  # type: ignore[arg-type]


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
    if s.state_dir.parent == TEST_STATE:
        shutil.rmtree(s.state_dir, ignore_errors=True)


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


def run_cli(
    s: Settings,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = False,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``python -m router.cli ARGS`` acting on ``s``'s environment (or on ``env``), run to its end
    with its output captured; with ``check``, a non-zero exit fails the test with its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "router.cli", *args],
        cwd=ROOT,
        env=subprocess_env(s) if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, (
            f"{args} exited {result.returncode}:\n{result.stderr[-3000:]}"
        )
    return result


def provision_internal(s: Settings) -> None:
    """The environment's internal topics (dead letters, metric points, the audit topic), as
    ``provision`` makes them: what a test of one store on real Kafka needs."""
    from streams.admin import admin_client, provision

    base = s.kafka_config()
    provision(
        admin_client(base),
        base,
        s.topology.internal_specs(),
        topology=s.topology,
        timeout=s.connect_timeout_s,
    )
