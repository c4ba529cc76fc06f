"""The index-state and workflow-registry contracts against real Redis, built as the worker
builds them (router/wiring/workers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from consumers.redis_conn import connect
from router.settings import Settings
from router.wiring.workers import index_states, workflow_registry
from router.workers.helpers import IndexStates, WorkflowRegistry
from tests.contracts.worker_registries import IndexStatesContract, WorkflowRegistryContract
from tests.support.environment import TEST_REDIS, make_settings

pytestmark = pytest.mark.integration


class RedisEnvironment:
    """Each test has an environment of its own; its keys are removed afterwards."""

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.client: redis.Redis[bytes] = connect(TEST_REDIS, timeout=5)
        self.settings: Settings = make_settings()
        yield
        for key in self.client.scan_iter(match=f"rh:{self.settings.env}:*", count=1000):
            self.client.delete(key)


class TestRedisIndexStates(RedisEnvironment, IndexStatesContract):
    def make_states(self) -> IndexStates:
        return index_states(self.settings, self.client)


class TestRedisWorkflowRegistry(RedisEnvironment, WorkflowRegistryContract):
    def make_registry(self) -> WorkflowRegistry:
        return workflow_registry(self.settings, self.client)
