"""Both ordering strategies against an in-memory gapless Kafka, over both outbox backends: what a failure in a project's
window does to the rows after it, isolated retries, abandoning on the delivery deadline, a fatal
producer, and — over random fault scripts — that every project's events reach the log complete
and in slot order."""

from __future__ import annotations

import logging

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.clock import ManualClock
from streams.outbox import ops
from streams.outbox.publisher import Publisher
from streams.outbox.states import Ordering
from streams.outbox.store import RowState
from tests.support.outbox import (
    FATAL,
    HANG,
    OK,
    OUTAGE,
    REFUSE,
    ROW,
    OutboxBackend,
    SimulatedKafka,
    append_all,
    drafts,
    policy,
)


def _slot(value: bytes) -> int:
    return int(orjson.loads(value)["slot"])


def _publisher(store, kafka_or_factory, clock, ordering, **overrides) -> Publisher:
    factory = kafka_or_factory if callable(kafka_or_factory) else (lambda: kafka_or_factory)
    return Publisher(
        store,
        factory,
        stream_for=lambda project: "rhumbatron_events_00_t",
        policy=policy(ordering=ordering, **overrides),
        clock=clock,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock, outbox_backend: OutboxBackend):
    return outbox_backend.store(clock=clock)


@pytest.mark.parametrize("ordering", list(Ordering))
@pytest.mark.parametrize("verdict", [ROW, OUTAGE, REFUSE])
def test_rows_after_a_failure_in_the_window_are_left_untouched(
    store, clock, ordering, verdict
) -> None:
    items = drafts("proj-a", 10)
    fail_at = items[4].event_id.encode()
    failures: list[int] = []

    def script(key: str, value: bytes, nth: int) -> str:
        if fail_at in value and not failures:
            failures.append(nth)
            return str(verdict)
        return OK

    kafka = SimulatedKafka(script=script, clock=clock)
    append_all(store, items)
    with _publisher(store, kafka, clock, ordering) as publisher:
        publisher.run_pass()
        states = [store.get(d.event_id) for d in items]
        assert [r.state for r in states if r] == [RowState.PUBLISHED] * 4 + [
            RowState.RETRY_WAIT
        ] + [RowState.PENDING] * 5
        failed = states[4]
        assert failed is not None
        if verdict == OUTAGE:
            assert (failed.attempts, failed.deferrals) == (0, 1)
        else:
            assert (failed.attempts, failed.deferrals) == (1, 0)
        for later in states[5:]:
            assert later is not None and (later.attempts, later.deferrals) == (0, 0)
        assert [_slot(v) for v in kafka.keys_in_order()["proj-a"]] == [1, 2, 3, 4]
        if verdict == REFUSE and ordering is Ordering.PIPELINED:
            assert kafka.produced == 5  # nothing after a refused row is even handed over
        clock.advance(2)
        publisher.run_pass()
        publisher.run_pass()
    assert [_slot(v) for v in kafka.keys_in_order()["proj-a"]] == list(range(1, 11))


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_head_that_failed_on_its_own_is_retried_alone(store, clock, ordering) -> None:
    a, b = drafts("proj-a", 3), drafts("proj-b", 3)
    outstanding_when_sent: list[int] = []
    kafka = SimulatedKafka(clock=clock)

    def script(key: str, value: bytes, nth: int) -> str:
        if a[0].event_id.encode() in value:
            outstanding_when_sent.append(kafka.outstanding())
            return ROW if len(outstanding_when_sent) == 1 else OK
        return OK

    kafka.script = script
    append_all(store, a + b)
    with _publisher(store, kafka, clock, ordering) as publisher:
        publisher.run_pass()
        head = store.get(a[0].event_id)
        assert head is not None and head.attempts == 1
        append_all(store, drafts("proj-b", 3))
        clock.advance(1)
        publisher.run_pass()
    # The second try had nothing else outstanding beside it.
    assert outstanding_when_sent[1] == 0
    assert [_slot(v) for v in kafka.keys_in_order()["proj-a"]] == [1, 2, 3]
    assert [_slot(v) for v in kafka.keys_in_order()["proj-b"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("ordering", list(Ordering))
def test_unanswered_records_are_abandoned_after_the_delivery_timeout(
    store, clock, ordering
) -> None:
    items = drafts("proj-a", 5) + drafts("proj-b", 5)
    down = [True]
    kafka = SimulatedKafka(script=lambda key, value, nth: HANG if down[0] else OK, clock=clock)
    append_all(store, items)
    with _publisher(store, kafka, clock, ordering, delivery_timeout_s=7.0) as publisher:
        started = clock.monotonic()
        publisher.run_pass()
        assert 7.0 < clock.monotonic() - started < 7.5
        counts = store.counts()
        assert counts[RowState.RETRY_WAIT] == 2  # the head of each project
        assert counts[RowState.PENDING] == 8 and counts[RowState.FAILED] == 0
        assert publisher.totals.deferred == 2
        down[0] = False
        clock.advance(1)
        publisher.run_pass()
    assert store.counts()[RowState.PUBLISHED] == 10


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_fatal_producer_is_replaced_and_nothing_is_charged(store, clock, ordering) -> None:
    made: list[SimulatedKafka] = []

    def factory() -> SimulatedKafka:
        verdicts = {3: FATAL} if not made else {}
        kafka = SimulatedKafka(script=lambda key, value, nth: verdicts.get(nth, OK), clock=clock)
        made.append(kafka)
        return kafka

    items = drafts("proj-a", 6)
    append_all(store, items)
    with _publisher(store, factory, clock, ordering) as publisher:
        publisher.run_pass()
        assert publisher.totals.producers_replaced == 1
        assert made[0].closed
        rows = [store.get(d.event_id) for d in items]
        assert all(r is not None and r.attempts == 0 for r in rows)
        clock.advance(1)
        publisher.run_pass()
    assert len(made) == 2
    first = [_slot(v) for v in made[0].keys_in_order()["proj-a"]]
    second = [_slot(v) for v in made[1].keys_in_order()["proj-a"]]
    assert first + second == [1, 2, 3, 4, 5, 6]


def test_an_acknowledged_row_after_a_failed_one_is_reported_as_an_order_violation(
    store, clock, caplog
) -> None:
    """A producer without the gapless guarantee can acknowledge slot 3 after slot 2 failed; the
    publisher must notice (it is why pipelining needs the guarantee)."""

    class NotGapless(SimulatedKafka):
        def poll(self, timeout: float) -> None:
            # Each record on its own: a failure does not fail the records after it.
            queue, self._queue = self._queue, type(self._queue)()
            for record in queue:
                if record.verdict == ROW:
                    self._queue.append(record)
                    super().poll(0)
                    self._queue.clear()
                else:
                    self._queue.append(record)
                    super().poll(0)

    items = drafts("proj-a", 4)
    kafka = NotGapless(
        script=lambda key, value, nth: ROW if items[1].event_id.encode() in value else OK,
        clock=clock,
    )
    append_all(store, items)
    with (
        caplog.at_level(logging.ERROR, logger="rhumbatron.outbox.publisher"),
        _publisher(store, kafka, clock, Ordering.PIPELINED) as publisher,
    ):
        publisher.run_pass()
    assert publisher.totals.order_violations == 2
    assert "order violation: project proj-a slot 3 was acknowledged after slot 2 failed" in (
        caplog.text
    )


# -- order under random faults ------------------------------------------------------------------
VERDICTS = st.sampled_from([OK, OK, OK, OK, ROW, OUTAGE, REFUSE, HANG, FATAL])


FAULT_CASES = {
    "ordering": st.sampled_from(list(Ordering)),
    "sizes": st.lists(st.integers(1, 12), min_size=1, max_size=5),
    "verdicts": st.lists(VERDICTS, min_size=1, max_size=80),
    "rows_per_project": st.integers(1, 6),
}
_FIXTURES_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=200, deadline=None, suppress_health_check=_FIXTURES_OK)
@given(**FAULT_CASES)
def test_random_faults_never_reorder_or_lose_a_project_event(
    tmp_path, ordering, sizes, verdicts, rows_per_project
) -> None:
    backend = OutboxBackend("sqlite", tmp_path)
    try:
        _random_faults(backend, ordering, sizes, verdicts, rows_per_project)
    finally:
        backend.close()


# The same property on PostgreSQL, with fewer examples: each one costs real round trips.
@pytest.mark.integration
@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURES_OK)
@given(**FAULT_CASES)
def test_random_faults_never_reorder_or_lose_a_project_event_on_postgres(
    postgres_backend, ordering, sizes, verdicts, rows_per_project
) -> None:
    _random_faults(postgres_backend, ordering, sizes, verdicts, rows_per_project)


@pytest.fixture
def postgres_backend(tmp_path):
    backend = OutboxBackend("postgres", tmp_path)
    yield backend
    backend.close()


def _random_faults(outbox_backend, ordering, sizes, verdicts, rows_per_project) -> None:
    # One outbox for the test, emptied for each example.
    outbox_backend.reset()
    clock = ManualClock()
    store = outbox_backend.store(clock=clock)
    made: list[SimulatedKafka] = []
    script_of = iter(verdicts)

    def factory() -> SimulatedKafka:
        kafka = SimulatedKafka(
            script=lambda key, value, nth: next(script_of, OK), clock=clock, partitions=2
        )
        made.append(kafka)
        return kafka

    projects = {f"proj-{n}": drafts(f"proj-{n}", size) for n, size in enumerate(sizes)}
    for items in projects.values():
        append_all(store, items)
    with _publisher(
        store,
        factory,
        clock,
        ordering,
        rows_per_project=rows_per_project,
        delivery_timeout_s=3.0,
        max_row_attempts=3,
    ) as publisher:
        for _ in range(500):
            if publisher.drained():
                failed = store.rows_in_state(RowState.FAILED, 100)
                if not failed:
                    break
                for row in failed:
                    ops.retry(store, row.event_id, who="test", now=clock.now().timestamp())
            publisher.run_pass()
            due = store.next_due_at()
            if due is not None:
                clock.advance(max(due - clock.now().timestamp(), 0.0))
        assert publisher.totals.order_violations == 0
    assert store.counts()[RowState.PUBLISHED] == sum(sizes)
    logs: dict[str, list[int]] = {}
    for kafka in made:  # producers succeed one another: their logs concatenate in time
        for key, values in kafka.keys_in_order().items():
            logs.setdefault(key, []).extend(_slot(v) for v in values)
    for project, items in projects.items():
        assert logs[project] == list(range(1, len(items) + 1))  # no duplicates without crashes
    store.close()
