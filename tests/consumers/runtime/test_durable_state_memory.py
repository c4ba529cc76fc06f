"""The durable-state contract on the twins the runtime's and the operator's unit tests use: one
MemoryAudit (the audit topic's twin) under the dead-letter twin and the audit-log twins."""

from __future__ import annotations

from consumers.runtime.audit_log import MemoryAuditLog
from consumers.runtime.audit_records import MemoryAudit
from consumers.runtime.dead_letters import MemoryDeadLetters
from consumers.runtime.state_rebuild import MemoryTarget, RebuildReport, rebuild
from tests.contracts.durable_state import PART_MAX_BYTES, DurableStateContract, OperatorState


class MemoryState:
    def __init__(self) -> None:
        self.durable = MemoryAudit()
        self.letters = MemoryDeadLetters(self.durable, part_max_bytes=PART_MAX_BYTES)
        self.logs: dict[str, MemoryAuditLog] = {}

    def log(self, slug: str) -> MemoryAuditLog:
        return self.logs.setdefault(slug, MemoryAuditLog(slug=slug, durable=self.durable))

    def lose(self) -> None:
        self.letters.letters.clear()
        for log in self.logs.values():
            log.replace([])

    def rebuild(self) -> RebuildReport:
        return rebuild(self.durable, MemoryTarget(self.letters, self.log))

    def fail_next_audit_write(self) -> None:
        self.durable.fail_next_write = True


class TestMemoryDurableState(DurableStateContract):
    def make_state(self) -> OperatorState:
        return MemoryState()
