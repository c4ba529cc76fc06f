"""The fleet-wide Prometheus scrape of the operator server (``GET /metrics``), computed on each
scrape from the same service code as the API:

- ``rhumbatron_consumer_lag{subscription,group,topic,partition}``: records behind the log end
  (from the one place lag is computed);
- ``rhumbatron_outbox_rows{outbox,state}``, ``rhumbatron_outbox_held_projects{outbox}``,
  ``rhumbatron_outbox_oldest_pending_seconds{outbox}``;
- ``rhumbatron_dead_letters{kind,status}``;
- ``rhumbatron_worker_total{queue,counter}``: the command workers' counters summed over their
  processes (ok, retried, dead_lettered, false_wakeup, ...);
- ``rhumbatron_scrape_error{source}``: 1 when that source could not be read for this scrape (Kafka
  or Redis down, an outbox file missing); its families are then left out rather than failing
  the scrape.

Written as a prometheus-client *custom collector* (``collect()`` yields the families) rather than
on the OpenTelemetry SDK: every value here is read from Kafka, Redis and the outboxes when the
scrape comes, and a source that fails must drop its families and raise its error gauge *in that
same scrape*. The OTel Prometheus exporter serves what observable callbacks reported, with no
way for a callback to say "this source is down" beside its own instrument, and it would keep
a family's last label sets between collections; a collector states each scrape whole. Each
process's own counters (router/wiring/metrics.py) are OpenTelemetry instruments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.operator.service import OperatorService

Family = GaugeMetricFamily | CounterMetricFamily
# What reads one source (named by its rhumbatron_scrape_error label) into its families.
Reader = Callable[[], list[Family]]


def _gauge(name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
    # Label names in alphabetical order, as the scrape has always printed them (a series keeps
    # one spelling for the tools that match it as text).
    return GaugeMetricFamily(name, help_text, labels=labels)


class FleetCollector(Collector):
    """The operator's scrape: each source read afresh on every ``collect``."""

    def __init__(self, service: OperatorService) -> None:
        self.service = service

    def collect(self) -> Iterator[Family]:
        errors = _gauge(
            "rhumbatron_scrape_error",
            "1 when a source could not be read for this scrape",
            ["source"],
        )
        sources: list[tuple[str, Reader]] = [
            ("kafka-lag", self._lag),
            ("outboxes", self._outboxes),
            ("dead-letters", self._dead_letters),
            ("workers", self._workers),
        ]
        for source, read in sources:
            try:
                families = read()
            except Exception:  # a down dependency must not fail the whole scrape
                errors.add_metric([source], 1)
                continue
            errors.add_metric([source], 0)
            yield from families
        yield errors

    def _lag(self) -> list[Family]:
        family = _gauge(
            "rhumbatron_consumer_lag",
            "records behind the log end, per group and partition",
            ["group", "partition", "subscription", "topic"],
        )
        for s in self.service.lag().subscriptions:
            for p in s.partitions:
                family.add_metric([s.group, str(p.partition), s.subscription, p.topic], p.lag)
        return [family]

    def _outboxes(self) -> list[Family]:
        rows = _gauge("rhumbatron_outbox_rows", "outbox rows by state", ["outbox", "state"])
        held = _gauge(
            "rhumbatron_outbox_held_projects", "projects held back by a failed row", ["outbox"]
        )
        oldest = _gauge(
            "rhumbatron_outbox_oldest_pending_seconds",
            "age of the oldest pending row (0: none)",
            ["outbox"],
        )
        for report in self.service.outboxes():
            if not report.present or report.error:
                continue
            for state, n in report.counts.items():
                rows.add_metric([report.outbox, state], n)
            held.add_metric([report.outbox], len(report.held_projects))
            oldest.add_metric([report.outbox], report.oldest_pending_age_s or 0.0)
        return [rows, held, oldest]

    def _dead_letters(self) -> list[Family]:
        service = self.service
        letters = service.letters().list(limit=service.settings.operator_dead_letter_scan_limit)
        counts = Counter((d.kind.value, d.status.value) for d in letters)
        family = _gauge(
            "rhumbatron_dead_letters", "dead letters by kind and status", ["kind", "status"]
        )
        for (kind, status), n in sorted(counts.items()):
            family.add_metric([kind, status], n)
        return [family]

    def _workers(self) -> list[Family]:
        from router.wiring.workers import worker_figures

        queues = worker_figures(self.service.settings, self.service.redis())["queues"]
        family = CounterMetricFamily(
            "rhumbatron_worker_total",
            "command worker counters (ok, retried, dead_lettered, false_wakeup, ...)",
            labels=["counter", "queue"],
        )
        for queue, counters in sorted(queues.items()):
            for counter, value in sorted(counters.items()):
                family.add_metric([counter, queue], value)
        return [family]


def registry_for(service: OperatorService) -> CollectorRegistry:
    """A registry of the operator's own (not the process-global one): what ``/metrics`` serves."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
