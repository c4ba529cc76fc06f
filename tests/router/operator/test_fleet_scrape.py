"""Scraping a real run on the real broker: the operator server's fleet-wide ``/metrics`` and the
``/metrics`` of a subscription process (``rhumbatron consume`` with its own endpoint), while the
process works through events and injected poison records. The lag the operator reports is above
0 before the consumer runs and falls to 0 once it has caught up; the dead letters it counts are
the poison records injected; the process's own counters say what it applied and dead-lettered,
on its endpoint and in what it exported over OTLP (to a receiver in the test)."""

from __future__ import annotations

import re
import select
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from router.operator.service import OperatorService
from router.settings import Settings
from streams.producer import Producer
from streams.topology import group_id
from streams.workload import slotted_events, workload
from tests.support.environment import cleanup_environment, make_settings
from tests.support.operator import running_server
from tests.support.otlp import attributes_of, otlp_receiver
from tests.support.runtime_processes import (
    cli,
    publish,
    runtime_settings,
    start_consume_cli,
)

pytestmark = pytest.mark.integration

SLUG = "project-view-projector"
POISON = 3
WAIT_S = 120.0  # a bound against a hang, not a timing claim

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def s() -> Iterator[Settings]:
    settings = runtime_settings(make_settings())
    yield settings
    cleanup_environment(settings)


def _scrape(url: str) -> Samples:
    answer = httpx.get(url, timeout=30)
    assert answer.status_code == 200, answer.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def _lag(samples: Samples, subscription: str) -> float | None:
    found = [
        v
        for (name, labels), v in samples.items()
        if name == "rhumbatron_consumer_lag" and ("subscription", subscription) in labels
    ]
    return sum(found) if found else None


def _endpoint(proc: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The process's endpoint, from the line it prints at start, and the lines before it."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if not ready:
            continue
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"metrics endpoint (http://\S+)/metrics", line)
        if found:
            return found.group(1), seen
    raise AssertionError(f"no metrics endpoint printed:\n{''.join(seen)[-3000:]}")


def _exported_applied(requests: list[Any]) -> list[tuple[str, str, int]]:
    """(service, subscription, value) of every rhumbatron_events_applied point exported."""
    found = []
    for request in requests:
        for resource in request.resource_metrics:
            service = attributes_of(resource.resource.attributes)["service.name"]
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != "rhumbatron_events_applied":
                        continue
                    for point in metric.sum.data_points:
                        labels = attributes_of(point.attributes)
                        found.append((service, labels["subscription"], point.as_int))
    return found


def _group_at_start(s: Settings) -> None:
    """The subscription's group, committed at the start of every stream partition, as a member
    that has not yet read anything leaves it."""
    config = {**s.kafka_config(), "group.id": group_id(SLUG, s.env), "enable.auto.commit": False}
    consumer = Consumer(config)
    try:
        streams = s.topology.stream_names()
        offsets = [TopicPartition(t, p, 0) for t in streams for p in range(s.partitions)]
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _poison(s: Settings, n: int) -> None:
    producer = Producer(s.kafka_config())
    for i in range(n):
        stream = s.topology.stream_names()[i % len(s.topology.stream_names())]
        producer.produce(stream, b"\x00 not an envelope %d" % i, key=f"poison-{i}")
    producer.flush(60)


def test_a_scrape_during_a_run_sees_lag_fall_to_zero_and_the_poison_dead_lettered(
    s: Settings,
) -> None:
    cli(s, "provision")
    _group_at_start(s)  # the operator reports the lag of groups that exist
    events = slotted_events(workload("scrape", 6, 60), tenant_id="t")
    publish(s, events)
    _poison(s, POISON)

    with otlp_receiver() as receiver, running_server(OperatorService(s)) as operator:
        fleet = operator.rstrip("/") + "/metrics"
        before = _scrape(fleet)
        assert _lag(before, SLUG) == len(events) + POISON
        assert before.get(
            ("rhumbatron_dead_letters", (("kind", "poison"), ("status", "open")))
        ) in (
            None,
            0,
        )

        proc = start_consume_cli(
            s,
            SLUG,
            until_idle=4,
            RHUMBATRON_METRICS_PORT="0",
            # metrics alone over OTLP (traces follow OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{receiver.endpoint}/v1/metrics",
        )
        try:
            url, _ = _endpoint(proc)
            lags = []
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                lag = _lag(_scrape(fleet), SLUG)
                lags.append(lag)
                if lag == 0:
                    break
                time.sleep(0.2)
            assert lags[-1] == 0, lags
            own = _scrape(url + "/metrics")
            health = httpx.get(url + "/healthz", timeout=10)
            ready = httpx.get(url + "/readyz", timeout=10)
            _, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        after = _scrape(fleet)
        exported = _exported_applied(receiver.metrics())

    assert proc.returncode == 0, err[-3000:]
    assert health.status_code == 200 and ready.status_code == 200, (health.text, ready.text)
    pvp = (("subscription", SLUG),)
    applied = int(re.findall(r"(\d+) applied", err)[-1])
    assert own[("rhumbatron_events_applied_total", pvp)] == applied == len(events)
    assert own[("rhumbatron_dead_lettered_total", (("kind", "poison"), *pvp))] == POISON
    assert own[("rhumbatron_dead_lettered_total", (("kind", "event-batch"), *pvp))] == 0
    assert own[("rhumbatron_end_to_end_latency_seconds_count", pvp)] == len(events)
    # The last export, at the process's end, carries the final count under its service name.
    assert exported[-1] == (f"rhumbatron-{SLUG}", SLUG, len(events)), exported
    assert after[("rhumbatron_dead_letters", (("kind", "poison"), ("status", "open")))] == POISON
    assert _lag(after, SLUG) == 0
    errors = {dict(k)["source"]: v for (n, k), v in after.items() if n == "rhumbatron_scrape_error"}
    assert errors == {"kafka-lag": 0, "outboxes": 0, "dead-letters": 0, "workers": 0}
