"""A consumer's prefetch is bounded by the settings: what it fetches ahead of its polls, and how
long it waits to fetch again once that is full (librdkafka's defaults, 64 MB and a second, made
a ledger peak at 382 MB over 500,000 events; 2 MB and 10 ms, 109 MB, as fast)."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest

from consumers.runtime.kafka_transport import KafkaTransport
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from streams.topology import group_id


def _made_configs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = []
    real = confluent_kafka.Consumer

    def consumer(config: dict[str, Any]) -> confluent_kafka.Consumer:
        made.append(config)
        return real(config)  # librdkafka checks every property here

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    return made


def test_the_transport_gives_librdkafka_the_prefetch_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _made_configs(monkeypatch)
    transport = KafkaTransport(
        Settings().kafka_config(),
        group_id="g",
        protocol="classic",
        session_timeout_ms=10_000,
        prefetch_kbytes=4096,
        fetch_backoff_ms=25,
    )
    transport.consumer.close()
    assert made[0]["queued.max.messages.kbytes"] == 4096
    assert made[0]["fetch.queue.backoff.ms"] == 25


@pytest.mark.integration
def test_a_subscription_takes_them_from_the_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings.model_copy(
        update={"consumer_prefetch_kbytes": 1024, "consumer_fetch_backoff_ms": 5}
    )
    provision_environment(s)
    made = _made_configs(monkeypatch)
    subscription = open_subscription(s, "ledger")
    subscription.close()
    consumers = [c for c in made if c.get("group.id") == group_id("ledger", s.env)]
    assert consumers, "the subscription opened no consumer of its group"
    assert all(c["queued.max.messages.kbytes"] == 1024 for c in consumers)
    assert all(c["fetch.queue.backoff.ms"] == 5 for c in consumers)


def test_the_defaults_bound_it_at_2_mb_and_fetch_again_after_10_ms() -> None:
    assert Settings().consumer_prefetch_kbytes == 2_048
    assert Settings().consumer_fetch_backoff_ms == 10
