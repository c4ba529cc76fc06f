"""The pump's metrics read its stats: pages, events, batches, rejections and retries as counters,
the checkpoint's sequence, and the seconds since the feed was last read to its end."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from router.wiring.pump import PumpInstruments
from streams.pump.identity import Checkpoint
from streams.pump.pump import PumpStats
from tests.support.pump import IDENTITY


def values(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: point.value  # type: ignore[union-attr]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }


def test_the_instruments_read_the_pumps_stats() -> None:
    reader = InMemoryMetricReader()
    instruments = PumpInstruments(MeterProvider([reader]).get_meter("test"))
    instruments.clock = lambda: 100.0
    stats = PumpStats(pages=3, events=250, batches=3, rejections=1, retries=2)
    instruments.watch(stats)
    seen = values(reader)
    assert {k: seen[k] for k in seen if k.endswith(("pages", "events", "batches"))} == {
        "rhumbatron_pump_pages": 3,
        "rhumbatron_pump_events": 250,
        "rhumbatron_pump_batches": 3,
    }
    assert seen["rhumbatron_pump_rejections"] == 1 and seen["rhumbatron_pump_retries"] == 2
    # No checkpoint yet and never caught up: no sequence, no lag.
    assert "rhumbatron_pump_checkpoint_sequence" not in seen
    assert "rhumbatron_pump_feed_lag_seconds" not in seen
    stats.checkpoint, stats.caught_up_at = Checkpoint(IDENTITY, 4_242), 90.0
    seen = values(reader)
    assert seen["rhumbatron_pump_checkpoint_sequence"] == 4_242
    assert seen["rhumbatron_pump_feed_lag_seconds"] == 10.0
