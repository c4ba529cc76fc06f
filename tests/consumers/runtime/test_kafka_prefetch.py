"""A consumer's prefetch is bounded by the setting (at librdkafka's default of 64 MB a ledger
peaked at 382 MB over 500,000 events, at 8 MB at 165 MB)."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest

from consumers.runtime.kafka_transport import KafkaTransport
from router.settings import Settings


def test_the_transport_gives_librdkafka_the_prefetch_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = confluent_kafka.Consumer

    def consumer(config: dict[str, Any]) -> confluent_kafka.Consumer:
        made.append(config)
        return real(config)  # librdkafka checks every property here

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    settings = Settings(consumer_prefetch_kbytes=2048)
    transport = KafkaTransport(
        settings.kafka_config(),
        group_id="g",
        protocol="classic",
        session_timeout_ms=10_000,
        prefetch_kbytes=settings.consumer_prefetch_kbytes,
    )
    transport.consumer.close()
    assert made[0]["queued.max.messages.kbytes"] == 2048


def test_the_default_bounds_it_at_8_mb() -> None:
    assert Settings().consumer_prefetch_kbytes == 8_192
