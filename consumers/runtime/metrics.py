"""The subscription runtime's metrics, on the OpenTelemetry metrics API.

The counters are *observable*: each collection (a scrape of the process's ``/metrics``, an OTLP
export) reads the :class:`~consumers.runtime.runner_base.Stats` every runner keeps anyway, so the
consume loop pays nothing for them. Only the end-to-end latency histogram has a recording point:
the runner hands it the applied events' timestamps once their batch has committed.

Names as Prometheus prints them (the exporter adds ``_total`` to a counter and ``_seconds`` for
the unit ``s``), each labelled by ``subscription``:

- ``rhumbatron_events_applied_total``, ``rhumbatron_events_duplicate_total`` (copies skipped),
  ``rhumbatron_events_filtered_total`` (not of a type the subscription reads);
- ``rhumbatron_batch_failures_total`` (failed batch attempts);
- ``rhumbatron_dead_lettered_total{kind}``: ``poison`` (records that do not decode) and
  ``event-batch`` (a batch that failed up to the limit: one letter however many events);
- ``rhumbatron_fenced_total``: writes refused because another process owns the partition now;
- ``rhumbatron_parked_projects{topic, partition}``: a gauge, the projects parked in each partition
  the process owns (an event of theirs is newer than the subscription's code knows:
  consumers.runtime.parking), 0 for a partition with none;
- ``rhumbatron_end_to_end_latency_seconds``: event timestamp to its effect committed.

With no meter provider installed (telemetry off) the API's instruments do nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from consumers.runtime.runner_base import Stats
from consumers.runtime.types import TP

# Seconds, from a local run's tens of milliseconds to a consumer that fell minutes behind.
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0
)  # fmt: skip

_COUNTERS: tuple[tuple[str, str, Callable[[Stats], int]], ...] = (
    ("rhumbatron_events_applied", "events applied", lambda s: s.applied),
    ("rhumbatron_events_duplicate", "copies of applied events skipped", lambda s: s.duplicates),
    ("rhumbatron_events_filtered", "events of types not read", lambda s: s.filtered),
    ("rhumbatron_batch_failures", "failed batch attempts", lambda s: s.failures),
    ("rhumbatron_fenced", "writes refused: another process owns the partition", lambda s: s.fenced),
)


class RuntimeInstruments:
    """The runtime's instruments on one meter; every runner of the process registers its
    counters with :meth:`watch`."""

    def __init__(self, meter: Meter) -> None:
        self._lock = threading.Lock()
        self._watched: list[tuple[str, Stats]] = []
        self._parked: list[tuple[str, Callable[[], dict[TP, int]]]] = []
        for name, description, read in _COUNTERS:
            meter.create_observable_counter(
                name, callbacks=[self._observer(read)], unit="", description=description
            )
        meter.create_observable_counter(
            "rhumbatron_dead_lettered",
            callbacks=[self._dead_lettered],
            unit="",
            description="events dead-lettered, by kind (poison, event-batch)",
        )
        meter.create_observable_gauge(
            "rhumbatron_parked_projects",
            callbacks=[self._parked_projects],
            unit="",
            description="projects parked in a partition: an event of theirs is newer than the "
            "subscription's code knows",
        )
        self._end_to_end = meter.create_histogram(
            "rhumbatron_end_to_end_latency",
            unit="s",
            description="event timestamp to its effect committed",
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS_S),
        )

    def watch(self, subscription: str, stats: Stats) -> None:
        """Report ``stats`` under ``subscription`` from now on (runners of one subscription in
        one process add up)."""
        with self._lock:
            if not any(s is stats for _, s in self._watched):
                self._watched.append((subscription, stats))

    def watch_parked(self, subscription: str, counts: Callable[[], dict[TP, int]]) -> None:
        """Report the parked projects ``counts`` gives per partition under ``subscription``."""
        with self._lock:
            self._parked.append((subscription, counts))

    def _parked_projects(self, _: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            watched = list(self._parked)
        for subscription, counts in watched:
            for tp, n in counts().items():
                labels = {"subscription": subscription, "topic": tp.topic}
                yield Observation(n, {**labels, "partition": str(tp.partition)})

    def committed(self, subscription: str, event_times_ms: Iterable[int], now_s: float) -> None:
        """The effects of events stamped ``event_times_ms`` committed at ``now_s``."""
        attributes = {"subscription": subscription}
        for ms in event_times_ms:
            self._end_to_end.record(max(now_s - ms / 1000, 0.0), attributes)

    def _by_subscription(self, read: Callable[[Stats], int]) -> dict[str, int]:
        with self._lock:
            watched = list(self._watched)
        totals: dict[str, int] = {}
        for subscription, stats in watched:
            totals[subscription] = totals.get(subscription, 0) + read(stats)
        return totals

    def _observer(
        self, read: Callable[[Stats], int]
    ) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            for subscription, value in self._by_subscription(read).items():
                yield Observation(value, {"subscription": subscription})

        return observe

    def _dead_lettered(self, _: CallbackOptions) -> Iterator[Observation]:
        poison = self._by_subscription(lambda s: s.poison_dead_lettered)
        batches = self._by_subscription(lambda s: s.dead_lettered - s.poison_dead_lettered)
        for subscription in poison:
            yield Observation(
                poison[subscription], {"subscription": subscription, "kind": "poison"}
            )
            yield Observation(
                batches[subscription], {"subscription": subscription, "kind": "event-batch"}
            )


# The process's instruments, on the global meter provider: the API's proxy until one is
# installed (router/wiring/metrics.py), which it then follows.
_default = RuntimeInstruments(metrics.get_meter("rhumbatron.runtime"))


def runtime_instruments() -> RuntimeInstruments:
    """The process's runtime instruments, on the global meter provider."""
    return _default
