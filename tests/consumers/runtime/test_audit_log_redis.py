"""The audit-log contract against real Redis."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from consumers.redis_conn import connect
from consumers.runtime.controls import AuditLog, RedisAuditLog
from tests.contracts.audit_log import SLUG, AuditLogContract
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration


class TestRedisAuditLog(AuditLogContract):
    """Each test has an environment of its own; every log made has a client of its own, as
    another process would; the keys are removed afterwards."""

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.env = "t" + secrets.token_hex(5)
        yield
        client = connect(TEST_REDIS, timeout=5)
        for key in client.scan_iter(match=f"rh:{self.env}:*", count=1000):
            client.delete(key)

    def make_log(self, slug: str = SLUG) -> AuditLog:
        return RedisAuditLog(connect(TEST_REDIS, timeout=5), env=self.env, slug=slug)
