"""A publisher that finds the outbox's lease held stands by and takes over once the holder lets
go (:func:`streams.outbox.standby.take_over`), on both backends; the role gauge it reports."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from streams.errors import PublisherLocked
from streams.outbox.publisher import Publisher
from streams.outbox.standby import PublisherRole, _observe_roles, take_over
from streams.outbox.store import RowState
from tests.support.outbox import OutboxBackend, SimulatedKafka, append_all, drafts, policy

POLL_S = 0.05


def _slot(value: bytes) -> int:
    return int(orjson.loads(value)["slot"])


def _publisher(store: Any, kafka: SimulatedKafka) -> Publisher:
    return Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy())


def test_a_standby_takes_over_once_the_holder_lets_go(outbox_backend: OutboxBackend) -> None:
    kafka = SimulatedKafka()
    first_store, second_store = outbox_backend.store(), outbox_backend.store()
    first = _publisher(first_store, kafka)
    seen: list[PublisherLocked] = []
    beats: list[int] = []
    standing_by = threading.Event()
    taken: list[Publisher | None] = []

    def held(exc: PublisherLocked) -> None:
        seen.append(exc)
        standing_by.set()

    def stand_by() -> None:
        taken.append(
            take_over(
                lambda: _publisher(second_store, kafka),
                poll_s=POLL_S,
                stop=threading.Event(),
                beat_s=POLL_S,
                tick=lambda: beats.append(1),
                held=held,
            )
        )

    waiting = threading.Thread(target=stand_by)
    waiting.start()
    try:
        assert standing_by.wait(30), "the second publisher never found the lease held"
        append_all(first_store, drafts("proj-a", 3))
        first.run(until_empty=True)
        assert first.totals.published == 3
        assert not taken  # still standing by while the first holds the lease
    finally:
        first.close()  # the holder lets go
        waiting.join(30)
    assert not waiting.is_alive(), "the standby never took over"
    (second,) = taken
    assert second is not None
    with second:
        append_all(first_store, drafts("proj-a", 2, tag="after"))
        second.run(until_empty=True)
        assert second.totals.published == 2
    # Said once for the one holder, however many tries; the waiting loop beat the health.
    assert len(seen) == 1 and "already has a publisher" in str(seen[0])
    assert len(beats) >= 2
    assert first_store.counts()[RowState.PUBLISHED] == 5
    assert [_slot(v) for v in kafka.keys_in_order()["proj-a"]] == [1, 2, 3, 4, 5]


def test_a_standby_stopped_before_the_lease_frees_returns_nothing(
    outbox_backend: OutboxBackend,
) -> None:
    kafka = SimulatedKafka()
    stop = threading.Event()
    with _publisher(outbox_backend.store(), kafka):

        def held(exc: PublisherLocked) -> None:
            stop.set()  # the SIGTERM of a standby

        found = take_over(
            lambda: _publisher(outbox_backend.store(), kafka),
            poll_s=300.0,
            stop=stop,
            beat_s=POLL_S,
            held=held,
        )
    assert found is None


def test_take_over_refuses_a_beat_interval_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match=r"beat_s \(0\) must be more than 0"):
        take_over(
            lambda: pytest.fail("nothing is built with a refused beat interval"),
            poll_s=POLL_S,
            stop=threading.Event(),
            beat_s=0,
        )


def test_the_role_gauge_shows_active_then_standby_then_goes() -> None:
    def shown() -> dict[str, float]:
        return {
            str(o.attributes["outbox"]): o.value
            for o in _observe_roles(None)  # type: ignore[arg-type]
            if o.attributes and str(o.attributes["outbox"]).startswith("gauge-test")
        }

    with PublisherRole("gauge-test-a") as a, PublisherRole("gauge-test-b") as b:
        a.active()
        b.standby()
        assert shown() == {"gauge-test-a": 1, "gauge-test-b": 0}
        a.standby()
        b.active()
        assert shown() == {"gauge-test-a": 0, "gauge-test-b": 1}
    assert shown() == {}
