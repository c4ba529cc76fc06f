"""The runtime's metrics, read with an in-memory metric reader from a runner on the in-memory
transport: every counter says what the runner's stats say, dead letters split by kind, and the
end-to-end latency is one sample per applied event, measured from the event's timestamp."""

from __future__ import annotations

from datetime import timedelta

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from consumers.runtime.metrics import RuntimeInstruments
from consumers.runtime.runner import Runner
from consumers.runtime.types import Processor
from tests.consumers.runtime.test_parts import Parts
from tests.support.runtime_harness import World, event

Points = dict[str, dict[tuple[tuple[str, str], ...], object]]


def _instrumented(
    world: World, processor: Processor | None = None
) -> tuple[Runner, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    instruments = RuntimeInstruments(MeterProvider([reader]).get_meter("test"))
    runner = world.runner(processor)
    runner.instruments = instruments  # in place of the process-wide ones the runner registered
    instruments.watch(runner.processor.slug, runner.stats)
    return runner, reader


def _points(reader: InMemoryMetricReader) -> Points:
    data = reader.get_metrics_data()
    assert data is not None
    points: Points = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    labels = tuple(sorted((k, str(v)) for k, v in attributes.items()))
                    assert isinstance(point, (HistogramDataPoint, NumberDataPoint))
                    value = point if isinstance(point, HistogramDataPoint) else point.value
                    points.setdefault(metric.name, {})[labels] = value
    return points


def test_the_counters_read_the_runners_stats_and_split_dead_letters_by_kind() -> None:
    world = World()
    tp = world.tp_of("alpha")
    for n in range(1, 7):
        world.publish(event("alpha", n, fail=(n == 3)))
    world.publish(event("alpha", 2))  # a copy of an applied event
    world.publish_raw(tp, b"\xff\x00 not json")
    world.publish_raw(tp, b'{"eventId": "nope"}')
    runner, reader = _instrumented(world)
    world.drain(runner)

    points = _points(reader)
    ledger = (("subscription", "ledger"),)
    stats = runner.stats
    assert stats.applied == 5 and stats.duplicates == 1 and stats.poison_dead_lettered == 2
    assert points["rhumbatron_events_applied"] == {ledger: stats.applied}
    assert points["rhumbatron_events_duplicate"] == {ledger: stats.duplicates}
    assert points["rhumbatron_events_filtered"] == {ledger: stats.filtered}
    assert points["rhumbatron_batch_failures"] == {ledger: stats.failures}
    assert points["rhumbatron_fenced"] == {ledger: 0}
    kinds = {dict(k)["kind"]: v for k, v in points["rhumbatron_dead_lettered"].items()}
    assert kinds == {"poison": 2, "event-batch": 1}
    assert {letter.kind for letter in world.dead.list()} == {"poison", "event-batch"}


def test_end_to_end_latency_is_one_sample_per_applied_event_from_its_timestamp() -> None:
    world = World()
    events = [event("alpha", n) for n in range(1, 4)]
    for ev in events:
        world.publish(ev)
    # The runner commits a minute after the events were stamped.
    world.clock.advance((events[-1].timestamp + timedelta(minutes=1) - world.clock.now()).seconds)
    runner, reader = _instrumented(world)
    world.drain(runner)

    latency = _points(reader)["rhumbatron_end_to_end_latency"][(("subscription", "ledger"),)]
    assert isinstance(latency, HistogramDataPoint)
    assert latency.count == len(events) == runner.stats.applied
    now = world.clock.now()
    expected = [(now - ev.timestamp).total_seconds() for ev in events]
    assert abs(latency.sum - sum(expected)) < 1e-3
    assert latency.min >= 60


def test_a_files_subscriptions_latency_is_measured_when_its_part_is_written() -> None:
    world = World()
    for n in range(1, 5):
        world.publish(event("alpha", n))
    processor = Parts(size=2)
    runner, reader = _instrumented(world, processor)
    world.drain(runner)

    assert processor.writes >= 1
    latency = _points(reader)["rhumbatron_end_to_end_latency"][(("subscription", "parts"),)]
    assert isinstance(latency, HistogramDataPoint) and latency.count == 4
