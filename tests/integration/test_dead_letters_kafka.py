"""The dead-letter store contract against the real store: the durable record on the Kafka topic,
the index in Redis, built as the runtime builds it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic

from consumers.runtime.dead_letters import DeadLetterStore, KafkaRedisDeadLetters
from router.runtime import dead_letters, redis_client
from router.settings import Settings
from streams.admin import admin_client
from streams.producer import Producer
from tests.conftest import cleanup_environment, make_settings
from tests.contracts.dead_letters import DeadLetterStoreContract

pytestmark = pytest.mark.integration

# The failing view's producer talks to nothing; this long it waits for an acknowledgement.
UNREACHABLE_FLUSH_S = 1.0


class TestKafkaRedisDeadLetters(DeadLetterStoreContract):
    settings: Settings

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings = make_settings()
        spec = self.settings.topology.internal_specs()[0]
        admin = admin_client(self.settings.kafka_config())
        topics = [NewTopic(spec.name, spec.partitions, spec.replication_factor, config=spec.config)]
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
        )
