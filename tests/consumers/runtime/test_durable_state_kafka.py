"""The durable-state contract on the real thing: the audit topic on Kafka, the dead-letter index
and the audit logs in Redis, built as the processes build them (router/wiring)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from consumers.runtime.audit_records import DurableAudit, KafkaAudit, Progress, Raw
from consumers.runtime.controls import AuditLog, RedisAuditLog
from consumers.runtime.state_rebuild import RebuildReport
from router.settings import Settings
from router.wiring.state import durable_audit, rebuild_state
from router.wiring.subscription import dead_letters, redis_client
from streams.producer import Producer
from tests.contracts.durable_state import PART_MAX_BYTES, DurableStateContract, OperatorState
from tests.support.environment import cleanup_environment, make_settings, provision_internal
from tests.support.redis_loss import delete_environment_keys

pytestmark = pytest.mark.integration


class FailingOnce:
    """The audit topic, but its next write goes to a producer that reaches no broker: the real
    store's failure, not a stand-in for it."""

    def __init__(self, real: KafkaAudit) -> None:
        self.real = real
        self.fail_next = False

    def write(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if self.fail_next:
            self.fail_next = False
            broken = KafkaAudit(
                Producer({"bootstrap.servers": "127.0.0.1:1"}),
                self.real.base,
                topic=self.real.topic,
                flush_timeout=1.0,
                read_timeout=1.0,
            )
            broken.write(records)
        self.real.write(records)

    def void(self, keys: Sequence[str]) -> None:
        self.real.void(keys)

    def read(self, progress: Progress | None = None) -> Iterator[Raw]:
        return self.real.read(progress)

    def is_empty(self) -> bool:
        return self.real.is_empty()


class RealState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = redis_client(settings)
        self.durable: DurableAudit = FailingOnce(durable_audit(settings))
        self.letters = dead_letters(settings, self.client)
        self.letters.audit = self.durable

    def log(self, slug: str) -> AuditLog:
        return RedisAuditLog(self.client, env=self.settings.env, slug=slug, durable=self.durable)

    def lose(self) -> None:
        delete_environment_keys(self.client, self.settings.env)

    def rebuild(self) -> RebuildReport:
        return rebuild_state(self.settings, self.client)

    def fail_next_audit_write(self) -> None:
        assert isinstance(self.durable, FailingOnce)
        self.durable.fail_next = True


class TestKafkaRedisDurableState(DurableStateContract):
    settings: Settings

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings = make_settings(dead_letter_record_max_bytes=PART_MAX_BYTES)
        provision_internal(self.settings)
        yield
        cleanup_environment(self.settings)

    def make_state(self) -> OperatorState:
        return RealState(self.settings)
