"""A process's own endpoint (``/metrics``, ``/healthz``, ``/readyz``) on a real socket, its health
states, the settings that place it, the exporters the standard variables choose, and the names
the Prometheus exporter prints for every instrument (the catalog the dashboards and alert rules
query: docs/observability.md)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections import Counter

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumers.runtime.metrics import RuntimeInstruments
from consumers.runtime.runner_base import Stats
from consumers.subscriptions.causal_router.processor import RouterStats
from router.settings import Settings
from router.wiring import metrics, probes
from router.workers.worker import WorkerStats
from streams.errors import ConfigurationError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers["Content-Type"], refused.read().decode()


def test_the_endpoint_serves_metrics_and_both_probes_on_a_free_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = CollectorRegistry()
    clock = Clock()
    health = probes.ProcessHealth(stale_after_s=30, clock=clock)
    endpoint = probes.serve(Settings(metrics_port=0), health, "test", registry)
    assert endpoint is not None
    try:
        assert endpoint.port > 0
        assert (
            f"rhumbatron-test: metrics endpoint {endpoint.url}/metrics" in capsys.readouterr().err
        )
        from prometheus_client import Counter as PromCounter

        PromCounter("probe_test_things", "things", registry=registry).inc(3)
        status, kind, body = _get(endpoint.url + "/metrics")
        assert status == 200 and kind.startswith("text/plain")
        assert "probe_test_things_total 3.0" in body

        assert _get(endpoint.url + "/healthz")[:2] == (200, "application/json")
        clock.now += 31  # the loop stopped coming round
        status, _, body = _get(endpoint.url + "/healthz")
        said = json.loads(body)
        assert status == 503 and said["status"] == "stale"
        assert "31.0s" in said["reason"] and "health_stale_s 30" in said["reason"]
        health.beat()
        assert _get(endpoint.url + "/healthz")[0] == 200

        status, _, body = _get(endpoint.url + "/readyz")
        assert status == 503 and json.loads(body)["status"] == "starting"
        health.ready = True
        assert _get(endpoint.url + "/readyz")[0] == 200

        status, _, body = _get(endpoint.url + "/nothing")
        assert status == 404 and json.loads(body)["paths"] == list(probes.PATHS)
    finally:
        endpoint.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", endpoint.port), timeout=2)


@pytest.mark.integration
def test_readiness_asks_the_broker_and_redis_each_time() -> None:
    """Ready on the real broker and Redis; once one of them is somewhere nothing answers, not
    ready, naming it; and ready again when it answers."""
    reachable = probes.dependency_checks(Settings(probe_timeout_s=5), ("kafka", "redis"))
    health = probes.ProcessHealth(checks=reachable)
    health.ready = True
    ok, said = health.readiness()
    assert ok and said == {"status": "ready", "checked": ["kafka", "redis"]}

    gone = Settings(
        kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0", probe_timeout_s=1
    )
    health.checks = {
        "kafka": probes.dependency_checks(gone, ("kafka",))["kafka"],
        "redis": reachable["redis"],
    }
    ok, said = health.readiness()
    assert not ok and said["status"] == "unreachable" and said["failed"] == ["kafka"]
    assert "127.0.0.1:1" in str(said["reason"])
    health.checks = probes.dependency_checks(gone, ("kafka", "redis"))
    ok, said = health.readiness()
    assert not ok and said["failed"] == ["kafka", "redis"]
    health.checks = reachable
    assert health.readiness()[0]


def test_a_failing_check_makes_the_endpoint_not_ready() -> None:
    def down() -> None:
        raise ConnectionError("Connection refused")

    health = probes.ProcessHealth(checks={"redis": down})
    health.ready = True
    endpoint = probes.serve(Settings(metrics_port=0), health, "test")
    assert endpoint is not None
    try:
        status, _, body = _get(endpoint.url + "/readyz")
        said = json.loads(body)
        assert status == 503 and said["failed"] == ["redis"]
        assert said["reason"] == "redis: ConnectionError: Connection refused"
        assert _get(endpoint.url + "/healthz")[0] == 200  # alive: only not ready
    finally:
        endpoint.close()


def test_no_port_no_endpoint() -> None:
    assert probes.serve(Settings(), probes.ProcessHealth(), "test") is None


def test_a_port_in_use_is_refused_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError) as refused:
            probes.serve(Settings(metrics_port=port), probes.ProcessHealth(), "test")
    text = str(refused.value)
    assert f"metrics_port={port}" in text and "metrics_host='127.0.0.1'" in text
    assert "RHUMBATRON_METRICS_PORT" in text and "0 for any" in text


def test_a_host_that_is_not_this_machines_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"metrics_host='no-such-host\.invalid'"):
        probes.serve(
            Settings(metrics_port=0, metrics_host="no-such-host.invalid"),
            probes.ProcessHealth(),
            "t",
        )


# -- which readers: the standard variables --------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "environ", "chosen"),
    [
        (None, {}, ()),
        (0, {}, ("prometheus",)),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ("otlp",)),
        (None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, ("otlp",)),
        (9464, {"OTEL_METRICS_EXPORTER": "otlp,console"}, ("prometheus", "otlp", "console")),
        (None, {"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        (0, {"OTEL_SDK_DISABLED": "true", "OTEL_METRICS_EXPORTER": "otlp"}, ("prometheus",)),
    ],
)
def test_the_exporters_follow_the_port_and_the_standard_variables(
    port: int | None, environ: dict[str, str], chosen: tuple[str, ...]
) -> None:
    assert metrics.exporters(Settings(metrics_port=port), environ) == chosen


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"OTEL_METRICS_EXPORTER": "statsd"}, "unknown metric exporter 'statsd'"),
        ({"OTEL_METRICS_EXPORTER": "none,otlp"}, "'none' cannot be combined"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "set RHUMBATRON_METRICS_PORT"),
    ],
)
def test_a_wrong_exporter_variable_is_refused_naming_it(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigurationError, match="OTEL_METRICS_EXPORTER=") as refused:
        metrics.exporters(Settings(), environ)
    assert says in str(refused.value)


def test_nothing_is_installed_when_no_reader_is_asked_for() -> None:
    installed = metrics.start(Settings(), "test", {})
    assert installed.provider is None and installed.registry is None
    installed.close()


# -- the names as Prometheus prints them ----------------------------------------------------------


def test_every_instrument_prints_under_its_catalog_name_and_labels() -> None:
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(scope_info_enabled=False, registry=registry)
    meter = MeterProvider([reader]).get_meter("test")
    runtime = RuntimeInstruments(meter)
    runtime.watch(
        "project-view-projector", Stats(applied=4, dead_lettered=3, poison_dead_lettered=2)
    )
    runtime.committed("project-view-projector", [1_000], 3.5)
    workers = metrics.WorkerInstruments(meter)
    outcomes = Counter({"indexed": 2, "retried": 3, "failed": 3, "dead_lettered": 1})
    workers.watch("indexing", WorkerStats(outcomes=outcomes))
    workers.watch("agent-wakeups", WorkerStats(outcomes=Counter({"false_wakeup": 2, "woken": 1})))
    router = metrics.RouterInstruments(meter)
    router.watch(
        RouterStats(
            sent=Counter({"agent.wake": 5}),
            capped=Counter({"agent.wake": 1}),
            classifier=Counter({"wake": 1, "skip": 2, "abstain": 1, "timeout": 1, "capped": 4}),
        )
    )

    printed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    pvp = (("subscription", "project-view-projector"),)
    assert printed[("rhumbatron_events_applied_total", pvp)] == 4
    for name in ("duplicate", "filtered"):
        assert printed[(f"rhumbatron_events_{name}_total", pvp)] == 0
    assert printed[("rhumbatron_batch_failures_total", pvp)] == 0
    assert printed[("rhumbatron_fenced_total", pvp)] == 0
    assert printed[("rhumbatron_dead_lettered_total", (("kind", "poison"), *pvp))] == 2
    assert printed[("rhumbatron_dead_lettered_total", (("kind", "event-batch"), *pvp))] == 1
    assert printed[("rhumbatron_end_to_end_latency_seconds_count", pvp)] == 1
    assert printed[("rhumbatron_end_to_end_latency_seconds_sum", pvp)] == 2.5
    assert printed[("rhumbatron_end_to_end_latency_seconds_bucket", (("le", "2.5"), *pvp))] == 1

    def attempts(queue: str, outcome: str) -> float:
        return printed[
            ("rhumbatron_worker_attempts_total", (("outcome", outcome), ("queue", queue)))
        ]

    assert [attempts("indexing", o) for o in ("done", "retried", "dead_lettered")] == [2, 3, 1]
    assert attempts("agent-wakeups", "done") == 3
    assert printed[("rhumbatron_false_wakeups_total", (("queue", "agent-wakeups"),))] == 2
    assert printed[("rhumbatron_false_wakeups_total", (("queue", "indexing"),))] == 0
    wake = (("command_type", "agent.wake"),)
    assert printed[("rhumbatron_commands_total", wake)] == 5
    assert printed[("rhumbatron_commands_capped_total", wake)] == 1
    classifier = {
        dict(labels)["outcome"]: value
        for (name, labels), value in printed.items()
        if name == "rhumbatron_classifier_calls_total"
    }
    assert classifier == {"answered": 3, "abstained": 1, "failed": 1, "capped": 4}
    names = {name for name, _ in printed}
    assert not any("otel_scope" in k for _, labels in printed for k, _ in labels)
    assert names - {"target_info"} <= {
        *(f"rhumbatron_{n}_total" for n in CATALOG_COUNTERS),
        *(f"rhumbatron_end_to_end_latency_seconds_{s}" for s in ("bucket", "count", "sum")),
    }


CATALOG_COUNTERS = (
    "events_applied",
    "events_duplicate",
    "events_filtered",
    "batch_failures",
    "dead_lettered",
    "fenced",
    "commands",
    "commands_capped",
    "classifier_calls",
    "worker_attempts",
    "false_wakeups",
)
