"""The audit-log contract against the in-memory twin the runtime's unit tests use."""

from __future__ import annotations

from consumers.runtime.controls import AuditLog, MemoryAuditLog
from tests.contracts.audit_log import SLUG, AuditLogContract


class TestMemoryAuditLog(AuditLogContract):
    """One process: the "processes" of a test share one twin per subscription."""

    def setup_method(self) -> None:
        self.logs: dict[str, MemoryAuditLog] = {}

    def make_log(self, slug: str = SLUG) -> AuditLog:
        return self.logs.setdefault(slug, MemoryAuditLog(slug=slug))
