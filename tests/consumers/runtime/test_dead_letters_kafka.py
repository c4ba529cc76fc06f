"""The dead-letter store contract against the real store: the durable record on the Kafka topic,
the index in Redis, built as the runtime builds it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from confluent_kafka.admin import NewTopic

from consumers.runtime.dead_letters import DeadLetterStore, Entry, KafkaRedisDeadLetters
from consumers.runtime.kafka_transport import assign_only_consumer
from router.settings import Settings
from router.wiring.subscription import dead_letters, redis_client
from streams.admin import admin_client
from streams.headers import (
    ATTEMPTS,
    DEAD_LETTER_ID,
    DEAD_LETTER_KIND,
    ERROR,
    ERROR_TYPE,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    SUBSCRIPTION,
)
from streams.producer import Producer
from streams.topology import dead_letter_topic
from tests.contracts.dead_letters import SOURCE, DeadLetterStoreContract, letter
from tests.contracts.transport import eventually
from tests.support.environment import cleanup_environment, make_settings

pytestmark = pytest.mark.integration

# The failing view's producer talks to nothing; this long it waits for an acknowledgement.
UNREACHABLE_FLUSH_S = 1.0


class TestKafkaRedisDeadLetters(DeadLetterStoreContract):
    settings: Settings

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings = make_settings()
        admin = admin_client(self.settings.kafka_config())
        # The dead-letter topic, and the audit topic the index's durable copy goes to.
        topics = [
            NewTopic(spec.name, spec.partitions, spec.replication_factor, config=spec.config)
            for spec in self.settings.topology.internal_specs()
        ]
        for future in admin.create_topics(topics).values():
            future.result()
        yield
        cleanup_environment(self.settings)

    def make_store(self) -> DeadLetterStore:
        return dead_letters(self.settings, redis_client(self.settings))

    def failing_view(self, store: DeadLetterStore) -> DeadLetterStore:
        real = store
        assert isinstance(real, KafkaRedisDeadLetters)
        return KafkaRedisDeadLetters(
            Producer({"bootstrap.servers": "127.0.0.1:1"}),
            real.client,
            env=self.settings.env,
            topic=real.topic,
            flush_timeout=UNREACHABLE_FLUSH_S,
            reason_max_bytes=real.reason_max_bytes,
            record_max_bytes=real.record_max_bytes,
            audit=real.audit,
        )


def test_the_topic_holds_the_original_bytes_and_headers_a_tee_not_a_swallow() -> None:
    settings = make_settings()
    admin = admin_client(settings.kafka_config())
    topics = [
        NewTopic(spec.name, spec.partitions, spec.replication_factor, config=spec.config)
        for spec in settings.topology.internal_specs()
    ]
    for future in admin.create_topics(topics).values():
        future.result()
    try:
        store = dead_letters(settings, redis_client(settings))
        # The entry's own rh.error (a command's worker wrote one) gives way to the letter's.
        original: list[tuple[str, bytes | None]] = [
            ("event_id", b"e3"),
            ("x", b"\x80"),
            (ERROR, b"the worker's words"),
        ]
        d = letter(3, entries=[Entry(3, b"\xff\x00raw", None, original)])
        store.write([d])
        consumer = assign_only_consumer(settings.kafka_config(), "dead-letter-tee")
        try:
            consumer.subscribe([dead_letter_topic(settings.env)])
            got = eventually(
                lambda: [m for m in consumer.consume(10, 0.5) if m.error() is None],
                bool,
                "the dead-letter record",
            )
        finally:
            consumer.close()
        (record,) = got
        headers = cast(list[tuple[str, bytes]], record.headers() or [])
        assert record.value() == b"\xff\x00raw" and record.key() == f"{d.id}:3".encode()
        assert headers[:2] == [("event_id", b"e3"), ("x", b"\x80")]
        named = dict(headers[2:])
        assert len(named) == len(headers[2:]), "a header of ours is repeated"
        assert named == {
            DEAD_LETTER_ID: d.id.encode(),
            DEAD_LETTER_KIND: b"event-batch",
            ERROR: b"boom",
            ERROR_TYPE: b"ValueError",
            ATTEMPTS: b"5",
            ORIGIN_TOPIC: SOURCE.encode(),
            ORIGIN_PARTITION: b"1",
            ORIGIN_OFFSET: b"3",
            SUBSCRIPTION: b"ledger",
        }
    finally:
        cleanup_environment(settings)
