"""The daily-cap contracts against real Redis, with the TTL the router's settings give them, and
the keys' lifetimes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from consumers.redis_conn import connect
from consumers.subscriptions.causal_router.budget import (
    CommandBudget,
    DailyCounter,
    RedisCommandBudget,
    RedisDailyCounter,
)
from router.settings import Settings
from tests.contracts.caps import DAY, CommandBudgetContract, DailyCounterContract
from tests.support.environment import TEST_REDIS, make_settings

pytestmark = pytest.mark.integration


class RedisEnvironment:
    """Each test has an environment of its own; its keys are removed afterwards. Every object
    made has a client of its own, as another process would."""

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings: Settings = make_settings()
        yield
        client = self.client()
        for key in client.scan_iter(match=f"rh:{self.settings.env}:*", count=1000):
            client.delete(key)

    def client(self) -> redis.Redis[bytes]:
        return connect(TEST_REDIS, timeout=5)


class TestRedisDailyCounter(RedisEnvironment, DailyCounterContract):
    def make_counter(self) -> DailyCounter:
        return RedisDailyCounter(
            self.client(), env=self.settings.env, ttl_s=self.settings.router_counter_ttl_s
        )

    def test_the_count_outlives_its_day_and_then_goes(self) -> None:
        counter = RedisDailyCounter(self.client(), env=self.settings.env, ttl_s=2 * 86_400)
        counter.incr("classifier-calls:2026-03-02")
        ttl = counter.client.ttl(counter.prefix + "classifier-calls:2026-03-02")
        assert 86_400 < ttl <= 2 * 86_400


class TestRedisCommandBudget(RedisEnvironment, CommandBudgetContract):
    def make_budget(self, cap: int) -> CommandBudget:
        return RedisCommandBudget(
            self.client(),
            env=self.settings.env,
            cap=cap,
            ttl_s=self.settings.router_counter_ttl_s,
        )

    def test_used_counts_the_admitted_ids_and_the_set_expires(self) -> None:
        budget = RedisCommandBudget(self.client(), env=self.settings.env, cap=3, ttl_s=3600)
        for n in (0, 1, 0, 2, 3):
            budget.admit("p", "c1", DAY, f"cmd_{n}")
        assert budget.used("p", "c1", DAY) == 3
        assert budget.used("p", "c2", DAY) == 0
        assert 0 < budget.client.ttl(budget.key("p", "c1", DAY)) <= 3600

    def test_the_budget_outlives_a_flushed_script_cache(self) -> None:
        # As after a restart of Redis: the script is loaded again, nothing is counted twice.
        budget = RedisCommandBudget(self.client(), env=self.settings.env, cap=2, ttl_s=3600)
        assert budget.admit("p", "c1", DAY, "cmd_a")
        budget.client.script_flush()
        wanted = [("p", "c1", DAY, f"cmd_{n}") for n in "abc"]
        assert budget.admit_all(wanted) == [
            True,
            True,
            False,
        ]
        assert budget.used("p", "c1", DAY) == 2
