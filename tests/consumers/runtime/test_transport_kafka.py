"""The transport contract against confluent-kafka on the real broker: what the in-memory twin
is held to."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from typing import cast

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
from consumers.runtime.types import TP
from router.settings import Settings
from streams.admin import admin_client, delete_topics
from streams.errors import ConfigurationError
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


class _RefusesFirstCommit:
    """A member's real consumer, but the group refuses its first asynchronous commit (as a
    coordinator in the middle of a rebalance answers, REBALANCE_IN_PROGRESS): nothing of it is
    committed, and the refusal reaches the commit callback at the next poll, as librdkafka's
    answers do."""

    def __init__(self, transport: KafkaTransport) -> None:
        self.real = transport.consumer
        self.answer = transport._on_commit
        self.refused: list[TopicPartition] | None = None
        self.asked: list[list[tuple[int, int]]] = []  # (partition, offset) of each commit

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous, "the transport commits group offsets asynchronously"
        self.asked.append([(p.partition, p.offset) for p in offsets])
        if len(self.asked) == 1:
            self.refused = [TopicPartition(p.topic, p.partition, p.offset) for p in offsets]
            return
        self.real.commit(offsets=offsets, asynchronous=True)

    def consume(self, num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
        if self.refused is not None:
            refused, self.refused = self.refused, None
            self.answer(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS),
                refused,
            )
        return list(self.real.consume(num_messages, timeout=timeout))

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def _refusing_member(bench: KafkaBench) -> tuple[KafkaTransport, _RefusesFirstCommit]:
    member = bench.member()
    assert isinstance(member, KafkaTransport)
    refusing = _RefusesFirstCommit(member)
    member.consumer = cast(confluent_kafka.Consumer, refusing)
    return member, refusing


@pytest.fixture
def bench() -> Iterator[KafkaBench]:
    made = KafkaBench(make_settings())
    try:
        yield made
    finally:
        made.close()


def test_an_offset_commit_the_group_refused_is_asked_again_at_the_next_poll(
    bench: KafkaBench,
) -> None:
    """A partition read to its end commits once; refused (a rebalance was under way) and never
    asked again, its lag would stay until its next record."""
    bench.append(0, b"v")
    member, refusing = _refusing_member(bench)
    tp = TP(bench.topic, 0)
    member.commit_offsets({tp: 1}, {})

    def committed() -> int | None:
        member.poll(1, 0.1)
        got = member.committed([tp])[tp]
        return got.offset if got else None

    assert eventually(committed, lambda c: c == 1, "the refused offset, asked again") == 1
    assert refusing.asked == [[(0, 1)], [(0, 1)]]


def test_a_refused_offset_already_superseded_is_not_asked_again(bench: KafkaBench) -> None:
    for _ in range(2):
        bench.append(0, b"v")
    member, refusing = _refusing_member(bench)
    tp = TP(bench.topic, 0)
    member.commit_offsets({tp: 1}, {})  # refused
    member.commit_offsets({tp: 2}, {})  # asked before the refusal is known

    def committed() -> int | None:
        member.poll(1, 0.1)
        got = member.committed([tp])[tp]
        return got.offset if got else None

    eventually(committed, lambda c: c == 2, "the later offset")
    for _ in range(3):
        member.poll(1, 0.1)
    assert refusing.asked == [[(0, 1)], [(0, 2)]]  # never back to 1
    assert committed() == 2


def test_a_session_timeout_the_broker_refuses_ends_the_poll_naming_the_setting(
    bench: KafkaBench,
) -> None:
    """The broker's floor is group.min.session.timeout.ms (6 s by default); below it librdkafka
    would ask to join again every few seconds, for ever, and the process would idle unassigned."""
    transport = KafkaTransport(
        bench.base, group_id=bench.group, protocol="classic", session_timeout_ms=3000
    )
    bench.closing.append(transport)
    transport.subscribe([bench.topic], no_rebalance, ignore)
    deadline = time.monotonic() + 60
    with pytest.raises(ConfigurationError) as refused:
        while time.monotonic() < deadline:
            transport.poll(10, 0.5)
    message = str(refused.value)
    assert "session_timeout_ms=3000" in message and "group.min.session.timeout.ms" in message
    assert bench.group in message
