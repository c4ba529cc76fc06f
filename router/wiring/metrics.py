"""The metrics of one long-running process: its meter provider, its readers, and the router's own
instruments (the runtime's are in consumers/runtime/metrics.py, the publisher's in
streams/outbox/publisher.py).

:func:`start` installs a meter provider (OpenTelemetry metrics SDK) with the readers asked for:

- **Prometheus** (opentelemetry-exporter-prometheus) when ``metrics_port`` is set: it collects
  into a registry of this process's own, which the process's endpoint (router/wiring/probes.py)
  serves as ``/metrics``. Instrumentation-scope labels are left off, so a series carries the
  labels the catalog names and no more; ``target_info`` carries the resource.
- **OTLP over HTTP/protobuf** (a periodic reader; interval ``OTEL_METRIC_EXPORT_INTERVAL``) when
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set or
  ``OTEL_METRICS_EXPORTER`` names ``otlp``; ``console`` prints them to stderr, ``none`` (or
  ``OTEL_SDK_DISABLED=true``) exports nothing.

With no reader nothing is installed: the API's instruments stay no-op. One provider serves the
whole process: a second :func:`start` in it (the demo runs several roles in one process) adds its
readers to the provider the first installed, under the first one's resource.

The instruments are observable wherever the code already counts (the workers' ``WorkerStats``,
the causal router's ``RouterStats``), so the loops pay nothing for them:

- ``rhumbatron_worker_attempts_total{queue,outcome}``: ``done``, ``retried``, ``dead_lettered``
  (a command's last failed attempt, expired or undecodable: dead-lettered or, for indexing,
  recorded with the project's index state);
- ``rhumbatron_false_wakeups_total{queue}``: agent wakes ended at once as stale;
- ``rhumbatron_commands_total{command_type}``, ``rhumbatron_commands_capped_total{command_type}``;
- ``rhumbatron_classifier_calls_total{outcome}``: ``answered`` (wake or skip, confidently),
  ``abstained``, ``capped`` (not asked: the day's calls are used up), ``failed`` (an error or a
  timeout).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from prometheus_client import CollectorRegistry

from consumers.subscriptions.causal_router.processor import RouterStats
from router.settings import Settings
from router.wiring.telemetry import named_exporters, resource
from router.workers.worker import WorkerStats
from streams.errors import ConfigurationError

log = logging.getLogger("rhumbatron.metrics")

EXPORTERS = ("otlp", "console", "prometheus", "none")
OTLP_PROTOCOL = "http/protobuf"
# How long a stopping process waits for its last metrics to reach the collector: it must not hang
# on one that is gone (the exporter's own timeout, OTEL_EXPORTER_OTLP_TIMEOUT, is 10 s).
FLUSH_TIMEOUT_S = 5.0

# A worker's outcomes (router/workers/worker.py and the handlers' own labels) as attempts.
RETRIED = frozenset({"retried"})
DEAD_LETTERED = frozenset(
    {
        "dead_lettered",
        "expired",
        "undecodable",
        "exhausted_recorded",
        "expired_recorded",
        "undecodable_recorded",
    }
)
NOT_ATTEMPTS = frozenset({"duplicate", "dropped", "failed"})  # "failed" counts the retried too
FALSE_WAKEUP = "false_wakeup"
# The classifier's outcomes (consumers/subscriptions/causal_router/classifier.py) by kind.
CLASSIFIER_KINDS = {
    "wake": "answered",
    "skip": "answered",
    "abstain": "abstained",
    "capped": "capped",
    "error": "failed",
    "timeout": "failed",
}


@dataclass
class ProcessMetrics:
    """What :func:`start` installed; :meth:`close` sends what is left and detaches the readers."""

    service: str
    provider: MeterProvider | None = None
    readers: list[MetricReader] = field(default_factory=list)
    registry: CollectorRegistry | None = None  # what /metrics serves; None: no endpoint asked

    def close(self) -> None:
        provider, self.provider = self.provider, None
        if provider is None:
            return
        for reader in self.readers:
            try:
                if isinstance(reader, PeriodicExportingMetricReader):
                    # Stopped in place: its last export reads the provider on the way out (a
                    # removed reader would have nothing to read); stopped, it reads no more.
                    reader.shutdown(timeout_millis=FLUSH_TIMEOUT_S * 1000)
                else:
                    provider.remove_metric_reader(reader)
            except Exception as exc:  # a collector gone at shutdown must not fail the command
                log.warning("metrics: reader %s did not stop cleanly: %s", reader, exc)


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def exporters(settings: Settings, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The metric exporters asked for: ``prometheus`` when ``metrics_port`` is set, and what
    the standard variables name; () for none."""
    env = os.environ if environ is None else environ
    if _env(env, "OTEL_SDK_DISABLED").lower() == "true":
        return ("prometheus",) if settings.metrics_port is not None else ()
    named = named_exporters("OTEL_METRICS_EXPORTER", "metric", EXPORTERS, env)
    chosen: tuple[str, ...] = ()
    if named is not None:
        if "prometheus" in named and settings.metrics_port is None:
            raise ConfigurationError(
                f"OTEL_METRICS_EXPORTER={_env(env, 'OTEL_METRICS_EXPORTER')!r} names prometheus, "
                "but no endpoint serves it: set RHUMBATRON_METRICS_PORT (0 for any free port)"
            )
        chosen = tuple(n for n in named if n != "prometheus")
    elif _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or _env(
        env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
    ):
        chosen = ("otlp",)
    return (("prometheus",) if settings.metrics_port is not None else ()) + chosen


def _reader(name: str, env: Mapping[str, str]) -> MetricReader:
    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr))
    protocol = (
        _env(env, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or _env(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
    ).lower()
    if protocol and protocol != OTLP_PROTOCOL:
        raise ConfigurationError(
            f"OTLP protocol {protocol!r} (OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL): this release "
            f"exports metrics over {OTLP_PROTOCOL} only"
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    # endpoint, headers, timeout, compression, interval: the OTEL_* variables
    return PeriodicExportingMetricReader(OTLPMetricExporter())


def start(
    settings: Settings, role: str, environ: Mapping[str, str] | None = None
) -> ProcessMetrics:
    """Install the meter provider of process role ``role`` with the readers asked for."""
    env = os.environ if environ is None else environ
    service = f"rhumbatron-{role}"
    chosen = exporters(settings, env)
    if not chosen:
        return ProcessMetrics(service)
    registry: CollectorRegistry | None = None
    readers: list[MetricReader] = []
    for name in chosen:
        if name == "prometheus":
            from opentelemetry.exporter.prometheus import PrometheusMetricReader

            registry = CollectorRegistry(auto_describe=True)
            readers.append(PrometheusMetricReader(scope_info_enabled=False, registry=registry))
        else:
            readers.append(_reader(name, env))
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):
        provider = current
    else:
        # The tracer provider's resource (router/wiring/telemetry.py): one service, one name.
        # No exemplars unless OTEL_METRICS_EXEMPLAR_FILTER asks: the SDK's default filter looks
        # up the current span on every measurement, nearly half the cost of a histogram sample
        # (one per event applied), and our histograms record outside any span anyway.
        exemplars = None if _env(env, "OTEL_METRICS_EXEMPLAR_FILTER") else AlwaysOffExemplarFilter()
        provider = MeterProvider(
            resource=resource(settings, role), shutdown_on_exit=False, exemplar_filter=exemplars
        )
        metrics.set_meter_provider(provider)
    for reader in readers:
        provider.add_metric_reader(reader)
    log.info("metrics: %s exporting to %s", service, ", ".join(chosen))
    return ProcessMetrics(service, provider, readers, registry)


# -- the router's instruments ------------------------------------------------------------------


T = TypeVar("T")


class _Watched(Generic[T]):
    """Objects whose counters an observable instrument reads, under a label value each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[str, T]] = []

    def add(self, label: str, item: T) -> None:
        with self._lock:
            if not any(i is item for _, i in self._items):
                self._items.append((label, item))

    def items(self) -> list[tuple[str, T]]:
        with self._lock:
            return list(self._items)


def _observe(
    read: Callable[[], Counter[tuple[tuple[str, str], ...]]],
) -> Callable[[CallbackOptions], Iterator[Observation]]:
    def observe(_: CallbackOptions) -> Iterator[Observation]:
        for labels, value in sorted(read().items()):
            yield Observation(value, dict(labels))

    return observe


class WorkerInstruments:
    """The command workers' attempts and false wakeups, read from each worker's stats."""

    def __init__(self, meter: Meter) -> None:
        self._workers: _Watched[WorkerStats] = _Watched()
        meter.create_observable_counter(
            "rhumbatron_worker_attempts",
            callbacks=[_observe(self._attempts)],
            unit="",
            description="command attempts by outcome (done, retried, dead_lettered)",
        )
        meter.create_observable_counter(
            "rhumbatron_false_wakeups",
            callbacks=[_observe(self._false_wakeups)],
            unit="",
            description="agent wakes found stale and ended at once",
        )

    def watch(self, queue: str, stats: WorkerStats) -> None:
        self._workers.add(queue, stats)

    def _attempts(self) -> Counter[tuple[tuple[str, str], ...]]:
        totals: Counter[tuple[tuple[str, str], ...]] = Counter()
        for queue, stats in self._workers.items():
            for kind in ("done", "retried", "dead_lettered"):
                totals[(("outcome", kind), ("queue", queue))] += 0
            for outcome, n in list(stats.outcomes.items()):
                if outcome in NOT_ATTEMPTS:
                    continue
                kind = (
                    "retried"
                    if outcome in RETRIED
                    else "dead_lettered"
                    if outcome in DEAD_LETTERED
                    else "done"
                )
                totals[(("outcome", kind), ("queue", queue))] += n
        return totals

    def _false_wakeups(self) -> Counter[tuple[tuple[str, str], ...]]:
        totals: Counter[tuple[tuple[str, str], ...]] = Counter()
        for queue, stats in self._workers.items():
            totals[(("queue", queue),)] += stats.outcomes.get(FALSE_WAKEUP, 0)
        return totals


class RouterInstruments:
    """The causal router's commands, capped commands and classifier calls, read from each
    router processor's stats."""

    def __init__(self, meter: Meter) -> None:
        self._routers: _Watched[RouterStats] = _Watched()
        for name, description, read in (
            ("rhumbatron_commands", "commands the causal router sent, by type", self._sent),
            (
                "rhumbatron_commands_capped",
                "commands not sent: the change's daily command cap was reached",
                self._capped,
            ),
            (
                "rhumbatron_classifier_calls",
                "overlap classifier calls by outcome (answered, abstained, capped, failed)",
                self._classifier,
            ),
        ):
            meter.create_observable_counter(
                name, callbacks=[_observe(read)], unit="", description=description
            )

    def watch(self, stats: RouterStats) -> None:
        self._routers.add("causal-router", stats)

    def _by(
        self, counters: Callable[[RouterStats], Counter[str]], label: str
    ) -> Counter[tuple[tuple[str, str], ...]]:
        totals: Counter[tuple[tuple[str, str], ...]] = Counter()
        for _, stats in self._routers.items():
            for key, n in list(counters(stats).items()):
                totals[((label, key),)] += n
        return totals

    def _sent(self) -> Counter[tuple[tuple[str, str], ...]]:
        return self._by(lambda s: s.sent, "command_type")

    def _capped(self) -> Counter[tuple[tuple[str, str], ...]]:
        return self._by(lambda s: s.capped, "command_type")

    def _classifier(self) -> Counter[tuple[tuple[str, str], ...]]:
        totals: Counter[tuple[tuple[str, str], ...]] = Counter()
        for labels, n in self._by(lambda s: s.classifier, "outcome").items():
            kind = CLASSIFIER_KINDS.get(labels[0][1], "failed")
            totals[(("outcome", kind),)] += n
        return totals


# The process's instruments, on the global meter provider: the API's proxy until start installs
# one, which they then follow.
_workers = WorkerInstruments(metrics.get_meter("rhumbatron.workers"))
_routers = RouterInstruments(metrics.get_meter("rhumbatron.causal_router"))


def worker_instruments() -> WorkerInstruments:
    """The process's worker instruments, on the global meter provider."""
    return _workers


def router_instruments() -> RouterInstruments:
    """The process's causal-router instruments, on the global meter provider."""
    return _routers
