"""How long an idle publisher waits between passes: short right after a pass that sent rows (writers
in other processes are only seen by polling), doubling on each idle pass up to the poll interval;
and an idle pass takes no write lock (retries are released only when one is due)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import ValidationError

from router.settings import Settings
from streams.clock import ManualClock
from streams.outbox.publisher import IdleWait, Publisher
from streams.outbox.store import CommitSignal, RowState
from tests.support.outbox import OutboxBackend, SimulatedKafka, append_all, drafts, policy


def test_the_wait_starts_short_after_rows_were_sent_and_doubles_up_to_the_interval() -> None:
    wait = IdleWait(0.1, 1.0)
    assert wait.idle() == 1.0  # nothing sent yet: polled as an idle outbox
    wait.sent()
    assert [wait.idle() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    wait.sent()
    assert wait.idle() == 0.1


@pytest.mark.parametrize(("shortest", "longest"), [(2.0, 1.0), (0.0, 1.0), (-1.0, 1.0)])
def test_a_shortest_wait_outside_the_interval_is_refused_naming_the_settings(
    shortest: float, longest: float
) -> None:
    with pytest.raises(ValueError, match="outbox_poll_min_interval_s .* outbox_poll_interval_s"):
        IdleWait(shortest, longest)


def test_settings_refuse_a_shortest_wait_of_zero() -> None:
    with pytest.raises(ValidationError, match="outbox_poll_min_interval_s"):
        Settings(outbox_poll_min_interval_s=0)


class RecordedWaits(CommitSignal):
    """Records each wait the publisher asks for and returns at once; stops it after ``limit``."""

    def __init__(self, stop: threading.Event, limit: int) -> None:
        super().__init__()
        self.stop = stop
        self.limit = limit
        self.waits: list[float] = []

    def wait(self, seen: int, timeout: float) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.stop.set()
        return False


def run_until_waits(store: Any, clock: ManualClock, waits: int, **kwargs: Any) -> list[float]:
    """Run a publisher over ``store`` until it has asked to wait ``waits`` times; those waits."""
    stop = threading.Event()
    signal = store.commits = RecordedWaits(stop, limit=waits)
    kafka = SimulatedKafka(clock=clock)
    with Publisher(
        store,
        lambda: kafka,
        stream_for=lambda project_id: "stream",
        policy=policy(poll_interval_s=1.0),
        clock=clock,
        **kwargs,
    ) as publisher:
        publisher.run(stop=stop)
    return signal.waits


def test_after_a_pass_that_sent_rows_the_publisher_polls_soon_then_less_and_less(
    outbox_backend: OutboxBackend,
) -> None:
    clock = ManualClock()
    store = outbox_backend.store(clock=clock)
    append_all(store, drafts("proj-a", 3))
    released: list[float] = []
    release_due = store.release_due

    def counted_release(now: float) -> int:
        released.append(now)
        return int(release_due(now))

    store.release_due = counted_release
    waits = run_until_waits(store, clock, 5, poll_min_s=0.1)
    assert store.counts()[RowState.PUBLISHED] == 3
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert released == []  # no retry was due: no pass took the write lock to release one


def test_a_publisher_built_without_a_shortest_wait_polls_at_the_interval(
    outbox_backend: OutboxBackend,
) -> None:
    clock = ManualClock()
    store = outbox_backend.store(clock=clock)
    append_all(store, drafts("proj-a", 1))
    assert run_until_waits(store, clock, 2) == [1.0, 1.0]
