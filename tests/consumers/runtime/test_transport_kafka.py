"""The transport contract against confluent-kafka on the real broker: what the in-memory twin
is held to."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from consumers.runtime.kafka_transport import KafkaOutput, KafkaOutputLog, KafkaTransport
from consumers.runtime.transport import (
    AssignCallback,
    Output,
    OutputLog,
    RevokeCallback,
    Transport,
)
from router.settings import Settings
from streams.admin import admin_client, delete_topics
from streams.kafka_config import client_config
from tests.contracts.transport import (
    SETTLE_S,
    TransportContract,
    eventually,
    ignore,
    no_rebalance,
)
from tests.support.environment import make_settings

pytestmark = pytest.mark.integration


class KafkaBench:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base = settings.kafka_config()
        suffix = secrets.token_hex(5)
        self.topic = f"contract_in_{suffix}"
        self.out_topic = f"contract_out_{suffix}"
        self.group = f"contract-group-{suffix}"
        admin = admin_client(self.base)
        for future in admin.create_topics(
            [NewTopic(self.topic, 2, 1), NewTopic(self.out_topic, 2, 1)]
        ).values():
            future.result()
        self.producer = confluent_kafka.Producer(client_config(self.base, "producer"))
        # Closed at the end whatever the test did: a consumer left open keeps the process alive.
        self.closing: list[Transport | Output] = []

    def append(self, partition: int, value: bytes) -> int:
        offsets: list[int] = []

        def report(err: object, msg: confluent_kafka.Message) -> None:
            assert err is None, err
            offsets.append(msg.offset() or 0)

        # librdkafka retries a just-created topic's "unknown partition" within its timeout.
        self.producer.produce(self.topic, value, partition=partition, on_delivery=report)
        assert self.producer.flush(SETTLE_S) == 0, "the record was not delivered"
        return offsets[-1]

    def delete_before(self, partition: int, offset: int) -> None:
        admin = admin_client(self.base)
        deleted = admin.delete_records([TopicPartition(self.topic, partition, offset)])
        for future in deleted.values():
            future.result(timeout=SETTLE_S)

    def _transport(self) -> KafkaTransport:
        transport = KafkaTransport(
            self.base,
            group_id=self.group,
            protocol=self.settings.group_protocol,
            session_timeout_ms=self.settings.session_timeout_ms,
        )
        self.closing.append(transport)
        return transport

    def join(self, on_assign: AssignCallback, on_revoke: RevokeCallback) -> Transport:
        transport = self._transport()
        transport.subscribe([self.topic], on_assign, on_revoke)
        return transport

    def take_one(self, first: Transport, step: Callable[[], None]) -> Transport:
        second = self.join(no_rebalance, ignore)

        def settle() -> tuple[int, int]:
            step()
            second.poll(1, 0.1)
            return len(first.assignment()), len(second.assignment())

        eventually(settle, lambda sizes: sizes == (1, 1), "one partition each")
        return second

    def leave(self, second: Transport, first: Transport, step: Callable[[], None]) -> None:
        second.close()

        def settle() -> int:
            step()
            return len(first.assignment())

        eventually(settle, lambda size: size == 2, "both partitions back")

    def member(self) -> Transport:
        transport = self.join(no_rebalance, ignore)
        deadline = time.monotonic() + SETTLE_S
        while len(transport.assignment()) < 2:
            assert time.monotonic() < deadline, "the member got no assignment"
            transport.poll(1, 0.2)
        # What the waiting polls fetched is read again: back to where the group stands.
        for tp, mark in transport.committed(transport.assignment()).items():
            transport.seek(tp, mark.offset if mark is not None else 0)
        return transport

    def output(self) -> Output:
        output = KafkaOutput(
            self.base,
            transactional_id=f"{self.group}-{secrets.token_hex(3)}",
            transaction_timeout_ms=self.settings.transaction_timeout_ms,
        )
        self.closing.append(output)
        return output

    def output_log(self) -> OutputLog:
        return KafkaOutputLog(self.base)

    def close(self) -> None:
        for client in self.closing:
            with contextlib.suppress(RuntimeError):  # already closed by the test
                client.close()
        self.producer.flush(SETTLE_S)
        admin = admin_client(self.base)
        delete_topics(admin, self.base, [self.topic, self.out_topic], timeout=30)


class TestKafkaTransport(TransportContract):
    def make_bench(self) -> KafkaBench:
        return KafkaBench(make_settings())
