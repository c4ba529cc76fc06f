"""The operator's scrape when its sources are down: the scrape still answers, each source that
could not be read says so in ``rhumbatron_scrape_error`` and its families are left out."""

from __future__ import annotations

import socket

from prometheus_client.parser import text_string_to_metric_families

from router.operator.metrics import registry_for, render
from router.operator.service import OperatorService
from tests.support.environment import make_settings


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_source_that_cannot_be_read_is_an_error_gauge_not_a_failed_scrape() -> None:
    port = _closed_port()
    s = make_settings(
        kafka_bootstrap=f"127.0.0.1:{port}",
        redis_url=f"redis://127.0.0.1:{port}/0",
        connect_timeout_s=1.0,
    )
    service = OperatorService(s)
    try:
        text = render(registry_for(service)).decode()
    finally:
        service.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    scraped = families["rhumbatron_scrape_error"].samples
    errors = {sample.labels["source"]: sample.value for sample in scraped}
    # Kafka and Redis are down; the outbox (a file not there yet) is read as absent, not failed.
    assert errors == {"kafka-lag": 1, "outboxes": 0, "dead-letters": 1, "workers": 1}
    assert "rhumbatron_consumer_lag" not in families
    assert "rhumbatron_dead_letters" not in families
    assert "rhumbatron_worker" not in families and "rhumbatron_worker_total" not in families
