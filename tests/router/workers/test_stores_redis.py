"""The workers' Redis stores against the real Redis: the ledger and counter contracts, and the
completed-command ledger's TTL. (The index states and the workflow registry: test_helpers_redis.)"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import redis

from consumers.redis_conn import connect
from router.settings import Settings
from router.workers.stores import (
    CommandLedger,
    RedisCommandLedger,
    RedisWorkerMetrics,
    WorkerMetrics,
    prefix,
    read_metrics,
)
from tests.contracts.worker_ledgers import CommandLedgerContract, WorkerMetricsContract
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration

LEDGER_TTL_MS = 3_600_000


class RedisEnvironment:
    """Each test has an environment of its own; its keys are removed afterwards."""

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.client: redis.Redis[bytes] = connect(TEST_REDIS, timeout=5)
        self.env = "t" + secrets.token_hex(5)
        yield
        for key in self.client.scan_iter(match=prefix(self.env) + "*", count=1000):
            self.client.delete(key)


class TestRedisCommandLedger(RedisEnvironment, CommandLedgerContract):
    def make_ledger(self) -> CommandLedger:
        return RedisCommandLedger(self.client, env=self.env, ttl_ms=LEDGER_TTL_MS)


class TestRedisWorkerMetrics(RedisEnvironment, WorkerMetricsContract):
    def make_metrics(self) -> WorkerMetrics:
        return RedisWorkerMetrics(self.client, env=self.env)

    def read_metrics(self) -> dict[str, dict[str, int]]:
        return read_metrics(self.client, self.env)


def test_the_ledger_remembers_completed_ids_past_the_queue_retention(settings: Settings) -> None:
    client = connect(settings.redis_url, timeout=5)
    ttl_ms = settings.queue_retention_ms + settings.command_dedupe_margin_ms
    ledger = RedisCommandLedger(client, env=settings.env, ttl_ms=ttl_ms)
    assert ledger.done_among(["cmd_a", "cmd_b"]) == set()
    ledger.mark_done(["cmd_a"])
    assert ledger.done_among(["cmd_a", "cmd_b", "cmd_a"]) == {"cmd_a"}
    remaining = client.pttl(ledger.prefix + "cmd_a")
    assert settings.queue_retention_ms < remaining <= ttl_ms
