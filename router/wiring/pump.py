"""The feed pump as the settings build it: the HTTP feed, the Kafka sink (its transactional id
per feed), the legacy sequence in Redis, and the pump's metrics.

- ``rhumbatron_pump_pages``, ``rhumbatron_pump_events``, ``rhumbatron_pump_batches``,
  ``rhumbatron_pump_rejections``, ``rhumbatron_pump_retries``: counters of this process;
- ``rhumbatron_pump_checkpoint_sequence``: the checkpoint's sequence;
- ``rhumbatron_pump_feed_lag_seconds``: seconds since the pump last read the feed to its end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from router.settings import Settings
from router.wiring.subscription import redis_client
from streams.errors import CheckpointError, Unreachable
from streams.pump.identity import Identity
from streams.pump.kafka import KafkaSink
from streams.pump.pump import Limits, Pump, PumpStats


class RedisLegacy:
    """The bare sequence an earlier pump kept: a decimal string at ``pump_legacy_key``."""

    def __init__(self, client: redis.Redis[bytes], key: str) -> None:
        self.client = client
        self.key = key

    def read(self) -> int | None:
        try:
            raw = self.client.get(self.key)
        except redis.RedisError as exc:
            raise Unreachable("Redis", self.key, f"reading the legacy checkpoint: {exc}") from exc
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace").strip()
        if not text.isdigit():
            raise CheckpointError(
                f"the legacy checkpoint at Redis key {self.key!r} is {text[:40]!r}, not a "
                "sequence; nothing was changed"
            )
        return int(text)

    def delete(self) -> None:
        try:
            self.client.delete(self.key)
        except redis.RedisError as exc:
            raise Unreachable("Redis", self.key, f"deleting the legacy checkpoint: {exc}") from exc


def limits(settings: Settings) -> Limits:
    return Limits(
        page_size=settings.pump_page_size,
        batch_max_events=settings.pump_batch_max_events,
        batch_max_bytes=settings.pump_batch_max_bytes,
        max_envelope_bytes=settings.max_envelope_bytes,
    )


def sink(settings: Settings, feed: str) -> KafkaSink:
    return KafkaSink(
        settings.kafka_config(),
        env=settings.env,
        feed=feed,
        stream_for=settings.topology.stream_for,
        max_envelope_bytes=settings.max_envelope_bytes,
    )


@contextmanager
def open_pump(settings: Settings, feed: str, *, attested: Identity | None = None) -> Iterator[Pump]:
    """The pump of ``feed``: its sink open (so any older pump of the feed is fenced) before the
    checkpoint is read."""
    from streams.pump.http import HttpFeed  # httpx: imported by the pump alone

    http = HttpFeed(
        feed,
        timeout_s=settings.pump_request_timeout_s,
        max_page_bytes=settings.pump_page_max_bytes,
    )
    kafka = sink(settings, feed)
    client = redis_client(settings)
    try:
        kafka.open()
        pump = Pump(
            http,
            kafka,
            limits(settings),
            legacy=RedisLegacy(client, settings.pump_legacy_key),
            attested=attested,
        )
        instruments().watch(pump.stats)
        yield pump
    finally:
        kafka.close()
        http.close()
        client.close()


class PumpInstruments:
    def __init__(self, meter: Meter) -> None:
        self._stats: list[PumpStats] = []
        self.clock = time.monotonic
        for name, description, field in (
            ("rhumbatron_pump_pages", "feed pages read", "pages"),
            ("rhumbatron_pump_events", "events published (with their checkpoint)", "events"),
            ("rhumbatron_pump_batches", "batches committed, one transaction each", "batches"),
            ("rhumbatron_pump_rejections", "feed lines refused (the pump stopped)", "rejections"),
            ("rhumbatron_pump_retries", "transient failures tried again", "retries"),
        ):
            meter.create_observable_counter(
                name, callbacks=[self._sum(field)], unit="", description=description
            )
        meter.create_observable_gauge(
            "rhumbatron_pump_checkpoint_sequence",
            callbacks=[self._sequence],
            description="the sequence of the pump's checkpoint",
        )
        meter.create_observable_gauge(
            "rhumbatron_pump_feed_lag_seconds",
            callbacks=[self._lag],
            unit="s",
            description="seconds since the pump last read the feed to its end",
        )

    def watch(self, stats: PumpStats) -> None:
        self._stats.append(stats)

    def _sum(self, field: str):  # type: ignore[no-untyped-def]
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            yield Observation(sum(getattr(s, field) for s in self._stats))

        return observe

    def _sequence(self, _: CallbackOptions) -> Iterator[Observation]:
        for stats in self._stats:
            if stats.sequence is not None:
                yield Observation(stats.sequence)

    def _lag(self, _: CallbackOptions) -> Iterator[Observation]:
        now = self.clock()
        for stats in self._stats:
            lag = stats.lag_s(now)
            if lag is not None:
                yield Observation(lag)


# On the global meter provider: the API's proxy until ``observed`` installs one, then that one.
_instruments = PumpInstruments(metrics.get_meter("rhumbatron.pump"))


def instruments() -> PumpInstruments:
    return _instruments
