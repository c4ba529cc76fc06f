"""The workers' Redis stores against the real Redis: the completed-command ledger and its TTL,
the counters summed across processes, the index states, the workflow-instance registry."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import redis

from consumers.redis_conn import connect
from router.settings import Settings
from router.wiring.workers import index_states, workflow_registry
from router.workers.helpers import STARTING, WorkflowInstance
from router.workers.stores import (
    CommandLedger,
    RedisCommandLedger,
    RedisWorkerMetrics,
    WorkerMetrics,
    prefix,
    read_metrics,
)
from tests.contracts.worker_ledgers import WorkerLedgersContract
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration

LEDGER_TTL_MS = 3_600_000


class TestRedisWorkerLedgers(WorkerLedgersContract):
    """Each test has an environment of its own; its keys are removed afterwards."""

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.client: redis.Redis[bytes] = connect(TEST_REDIS, timeout=5)
        self.env = "t" + secrets.token_hex(5)
        yield
        for key in self.client.scan_iter(match=prefix(self.env) + "*", count=1000):
            self.client.delete(key)

    def make_ledger(self) -> CommandLedger:
        return RedisCommandLedger(self.client, env=self.env, ttl_ms=LEDGER_TTL_MS)

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


def test_counters_of_two_workers_add_up(settings: Settings) -> None:
    client = connect(settings.redis_url, timeout=5)
    RedisWorkerMetrics(client, env=settings.env).add("agent-wakeups", {"ok": 3, "false_wakeup": 1})
    RedisWorkerMetrics(client, env=settings.env).add("agent-wakeups", {"ok": 2, "retried": 0})
    assert read_metrics(client, settings.env) == {"agent-wakeups": {"false_wakeup": 1, "ok": 5}}


def test_index_state_keeps_the_last_outcome_only(settings: Settings) -> None:
    states = index_states(settings, connect(settings.redis_url, timeout=5))
    states.record("p1", {"status": "failed", "error": "disk full", "command_id": "cmd_1"})
    states.record("p1", {"status": "ok", "command_id": "cmd_2"})
    assert states.get("p1") == {"status": "ok", "command_id": "cmd_2"}
    assert states.get("p-unknown") == {}


def test_the_workflow_registry_starts_an_instance_once(settings: Settings) -> None:
    registry = workflow_registry(settings, connect(settings.redis_url, timeout=5))
    first = WorkflowInstance(
        "release", "rel_p_3", "cmd_rel_3", STARTING, "2026-01-01T00:00:00.000Z"
    )
    second = WorkflowInstance(
        "release", "rel_p_3", "cmd_other", STARTING, "2026-01-01T00:01:00.000Z"
    )
    assert registry.start(first) == first
    assert registry.start(second) == first  # the earlier one is found
    registry.mark_running("release", "rel_p_3")
    found = registry.get("release", "rel_p_3")
    assert found is not None and found.status == "running" and found.command_id == "cmd_rel_3"
    assert registry.get("release", "rel_p_4") is None
