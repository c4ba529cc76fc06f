"""The audit-log contract against the real log: each entry on the audit topic (Kafka), then in
Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumers.redis_conn import connect
from consumers.runtime.controls import AuditLog, RedisAuditLog
from router.settings import Settings
from router.wiring.state import durable_audit
from tests.contracts.audit_log import SLUG, AuditLogContract
from tests.support.environment import (
    TEST_REDIS,
    cleanup_environment,
    make_settings,
    provision_internal,
)

pytestmark = pytest.mark.integration


class TestRedisAuditLog(AuditLogContract):
    """Each test has an environment of its own (its audit topic and its keys); every log made has
    clients of its own, as another process would; all is removed afterwards."""

    settings: Settings

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings = make_settings()
        self.env = self.settings.env
        provision_internal(self.settings)
        yield
        cleanup_environment(self.settings)

    def make_log(self, slug: str = SLUG) -> AuditLog:
        return RedisAuditLog(
            connect(TEST_REDIS, timeout=5),
            env=self.env,
            slug=slug,
            durable=durable_audit(self.settings),
        )
