"""The row state machine, driven through the real publisher and store (SQLite and PostgreSQL, one
contract) with an injected clock and an in-memory Kafka: every transition, the backoff sequence, the 10th row-level
failure, an outage far longer than ten backoffs, no producer, and a failed row holding its
project until an operator retries or skips it."""

from __future__ import annotations

import pytest

from streams.clock import ManualClock
from streams.errors import ConfigurationError, OutboxError
from streams.outbox import ops
from streams.outbox.publisher import Publisher
from streams.outbox.states import (
    Deferred,
    NoStream,
    Ordering,
    Published,
    RowFault,
    backoff_s,
    transition,
)
from streams.outbox.store import CommitSignal, OutboxRow, OutboxStore, RowState
from tests.support.outbox import (
    HANG,
    OK,
    OUTAGE,
    ROW,
    OutboxBackend,
    SimulatedKafka,
    append_all,
    drafts,
    policy,
)
from tests.support.waiting import wait_until

STREAM = "rhumbatron_events_00_t"


def _stream_for(project_id: str) -> str:
    return STREAM


def _row(**overrides: object) -> OutboxRow:
    values: dict[str, object] = {
        "event_id": "evt_" + "0" * 32,
        "project_id": "p",
        "slot": 1,
        "event_type": "task.completed",
        "envelope": b"{}",
        "trace_context": {},
        "state": RowState.PENDING,
        "attempts": 0,
        "deferrals": 0,
        "next_attempt_at": None,
        "last_error": None,
        "created_at": 0.0,
    }
    values.update(overrides)
    return OutboxRow(**values)  # type: ignore[arg-type]


class Rig:
    """A store, a simulated Kafka, a manual clock and a publisher over them."""

    def __init__(
        self,
        backend: OutboxBackend,
        script=None,
        *,
        ordering: Ordering = Ordering.SERIAL,
        **policy_overrides,
    ):
        self.clock = ManualClock()
        self.store: OutboxStore = backend.store(clock=self.clock)
        self.kafka = SimulatedKafka(clock=self.clock)
        if script is not None:
            self.kafka.script = script
        self.senders = 0

        def factory() -> SimulatedKafka:
            self.senders += 1
            return self.kafka

        self.publisher = Publisher(
            self.store,
            factory,
            stream_for=_stream_for,
            policy=policy(ordering=ordering, **policy_overrides),
            clock=self.clock,
        )

    def row(self, event_id: str) -> OutboxRow:
        found = self.store.get(event_id)
        assert found is not None
        return found

    def now(self) -> float:
        return self.clock.now().timestamp()

    def close(self) -> None:
        self.publisher.close()


@pytest.fixture
def rigs(outbox_backend: OutboxBackend):
    made: list[Rig] = []

    def make(*args, **kwargs) -> Rig:
        rig = Rig(outbox_backend, *args, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


# -- pure parts -----------------------------------------------------------------------------------
def test_backoff_doubles_from_one_second_up_to_the_cap() -> None:
    p = policy()
    assert [backoff_s(n, p) for n in range(1, 13)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        300,
        300,
        300,
    ]
    assert backoff_s(10_000, p) == 300  # a day-long outage does not overflow


def test_transitions_from_pending() -> None:
    p = policy()
    row = _row(attempts=2, deferrals=1)
    published = transition(row, Published(), p, 100.0)
    assert (published.state, published.published_at) == (RowState.PUBLISHED, 100.0)

    fault = transition(row, RowFault("MSG_SIZE_TOO_LARGE"), p, 100.0)
    assert (fault.state, fault.attempts, fault.deferrals) == (RowState.RETRY_WAIT, 3, 1)
    assert fault.next_attempt_at == 100.0 + backoff_s(4, p)
    assert fault.last_error == "MSG_SIZE_TOO_LARGE"

    outage = transition(row, Deferred("_MSG_TIMED_OUT"), p, 100.0)
    assert (outage.state, outage.attempts, outage.deferrals) == (RowState.RETRY_WAIT, 2, 2)
    assert outage.next_attempt_at == 100.0 + backoff_s(4, p)

    nostream = transition(row, NoStream("rhumbatron_events_03_x"), p, 100.0)
    assert nostream.state is RowState.FAILED and nostream.attempts == 2
    assert "rhumbatron_events_03_x" in (nostream.last_error or "")
    assert "rhumbatron provision" in (nostream.last_error or "")


def test_the_tenth_row_level_failure_fails_the_row() -> None:
    p = policy()
    ninth = transition(_row(attempts=8), RowFault("rejected"), p, 0.0)
    assert ninth.state is RowState.RETRY_WAIT and ninth.attempts == 9
    tenth = transition(_row(attempts=9, deferrals=40), RowFault("rejected"), p, 0.0)
    assert tenth.state is RowState.FAILED and tenth.attempts == 10
    assert tenth.last_error == "rejected (row-level failure 10 of 10)"
    # Outages never fail a row, however many.
    many = transition(_row(attempts=9, deferrals=10_000), Deferred("down"), p, 0.0)
    assert many.state is RowState.RETRY_WAIT and many.attempts == 9


@pytest.mark.parametrize(
    ("field", "value"),
    [("rows_per_project", 0), ("backoff_initial_s", 0), ("delivery_timeout_s", -1)],
)
def test_policy_refuses_non_positive_numbers(field: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match="must be greater than 0"):
        policy(**{field: value})


def test_policy_refuses_a_cap_below_the_first_wait() -> None:
    with pytest.raises(ConfigurationError, match="outbox_backoff_max_s"):
        policy(backoff_initial_s=10, backoff_max_s=5)


# -- through the publisher ------------------------------------------------------------------------
def test_pending_to_published(rigs) -> None:
    rig = rigs()
    items = drafts("proj-a", 3)
    append_all(rig.store, items)
    report = rig.publisher.run_pass()
    assert (report.sent, report.published) == (3, 3)
    assert all(rig.row(d.event_id).state is RowState.PUBLISHED for d in items)
    assert rig.row(items[0].event_id).published_at == rig.now()
    assert [v for v in rig.kafka.keys_in_order()["proj-a"]] == [
        rig.row(d.event_id).envelope for d in items
    ]


@pytest.mark.parametrize("ordering", list(Ordering))
def test_row_faults_back_off_1_2_4_and_the_tenth_fails_the_row(rigs, ordering) -> None:
    items = drafts("proj-a", 3)
    bad = items[0].event_id
    rig = rigs(lambda key, value, nth: ROW if bad.encode() in value else OK, ordering=ordering)
    append_all(rig.store, items)
    waits = []
    for attempt in range(1, 11):
        rig.publisher.run_pass()
        row = rig.row(bad)
        assert row.attempts == attempt and row.deferrals == 0
        if attempt == 10:
            break
        assert row.state is RowState.RETRY_WAIT
        waits.append(round((row.next_attempt_at or 0) - rig.now(), 6))
        produced = rig.kafka.produced
        rig.clock.advance(waits[-1] - 0.001)  # not yet due: nothing is sent
        assert rig.publisher.run_pass().idle
        assert rig.kafka.produced == produced
        assert rig.row(bad).state is RowState.RETRY_WAIT
        rig.clock.advance(0.001)
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    failed = rig.row(bad)
    assert failed.state is RowState.FAILED
    assert "row-level failure 10 of 10" in (failed.last_error or "")
    # The rows behind it were never sent and used no attempts.
    for later in items[1:]:
        row = rig.row(later.event_id)
        assert (row.state, row.attempts, row.deferrals) == (RowState.PENDING, 0, 0)
    assert rig.kafka.keys_in_order() == {}


@pytest.mark.parametrize("verdict", [OUTAGE, HANG])
def test_an_outage_far_longer_than_ten_backoffs_fails_nothing(rigs, verdict) -> None:
    down = True
    rig = rigs(
        lambda key, value, nth: verdict if down else OK,
        backoff_initial_s=0.5,
        backoff_max_s=2.0,
        delivery_timeout_s=1.0,
    )
    items = drafts("proj-a", 2) + drafts("proj-b", 2)
    append_all(rig.store, items)
    started = rig.now()
    passes = 0
    while rig.now() - started < 3600:  # an hour of outage, ten backoffs are ~12 s
        rig.publisher.run_pass()
        passes += 1
        counts = rig.store.counts()
        assert counts[RowState.FAILED] == 0
        due = rig.store.next_due_at()
        assert due is not None
        rig.clock.advance(max(due - rig.now(), 0))
    assert passes > 100
    head = rig.row(items[0].event_id)
    assert head.attempts == 0 and head.deferrals == passes
    assert head.state is RowState.RETRY_WAIT
    down = False
    rig.clock.advance(2.0)
    while not rig.publisher.drained():
        rig.publisher.run_pass()
        rig.clock.advance(2.0)
    assert all(rig.row(d.event_id).state is RowState.PUBLISHED for d in items)
    assert all(rig.row(d.event_id).attempts == 0 for d in items)


def test_no_producer_for_the_stream_fails_at_once(rigs) -> None:
    rig = rigs()
    rig.kafka.topics = {"rhumbatron_events_07_t"}  # not STREAM
    items = drafts("proj-a", 2)
    append_all(rig.store, items)
    rig.publisher.run_pass()
    head = rig.row(items[0].event_id)
    assert head.state is RowState.FAILED and head.attempts == 0
    assert "no producer for stream 'rhumbatron_events_00_t'" in (head.last_error or "")
    assert rig.row(items[1].event_id).state is RowState.PENDING
    assert rig.kafka.produced == 0


def _fail_first_ten(rig: Rig, event_id: str) -> None:
    for _ in range(10):
        rig.publisher.run_pass()
        due = rig.row(event_id).next_attempt_at
        if due is not None:
            rig.clock.advance(due - rig.now())
    assert rig.row(event_id).state is RowState.FAILED


def test_a_failed_row_holds_its_project_and_retry_releases_it(rigs) -> None:
    poisoned = True
    a = drafts("proj-a", 3)
    rig = rigs(lambda key, value, nth: ROW if poisoned and a[1].event_id.encode() in value else OK)
    append_all(rig.store, a)
    _fail_first_ten(rig, a[1].event_id)
    b = drafts("proj-b", 2)
    append_all(rig.store, b)
    for _ in range(3):
        rig.publisher.run_pass()
    assert rig.row(a[0].event_id).state is RowState.PUBLISHED
    assert rig.row(a[2].event_id).state is RowState.PENDING  # held back
    assert all(rig.row(d.event_id).state is RowState.PUBLISHED for d in b)  # others flow
    held = rig.store.held_projects(10)
    assert [(h.project_id, h.event_id, h.slot, h.waiting) for h in held] == [
        ("proj-a", a[1].event_id, 2, 1)
    ]
    stats = ops.stats(rig.store, now=rig.now(), row_limit=10).as_dict()
    assert stats["failed"] == 1 and stats["held_projects"][0]["project_id"] == "proj-a"
    assert stats["failed_rows"][0]["last_error"].startswith("MSG_SIZE_TOO_LARGE")

    poisoned = False
    before = ops.retry(rig.store, a[1].event_id, who="alice", now=rig.now())
    assert before.state is RowState.FAILED
    retried = rig.row(a[1].event_id)
    assert (retried.state, retried.attempts, retried.deferrals) == (RowState.PENDING, 0, 0)
    rig.publisher.run_pass()
    assert all(rig.row(d.event_id).state is RowState.PUBLISHED for d in a)
    assert rig.store.held_projects(10) == []
    values = rig.kafka.keys_in_order()["proj-a"]
    assert values == [rig.row(d.event_id).envelope for d in a]
    [entry] = rig.store.audit_log(a[1].event_id, 10)
    assert (entry.who, entry.action, entry.from_state) == ("alice", "retry", RowState.FAILED)
    assert (entry.last_error or "").startswith("MSG_SIZE_TOO_LARGE")


def test_skip_releases_a_held_project_without_sending_the_row(rigs) -> None:
    a = drafts("proj-a", 3)
    rig = rigs(lambda key, value, nth: ROW if a[1].event_id.encode() in value else OK)
    append_all(rig.store, a)
    _fail_first_ten(rig, a[1].event_id)
    ops.skip(rig.store, a[1].event_id, reason="poison payload", who="bob", now=rig.now())
    rig.publisher.run_pass()
    assert rig.row(a[1].event_id).state is RowState.SKIPPED
    assert rig.row(a[2].event_id).state is RowState.PUBLISHED
    values = rig.kafka.keys_in_order()["proj-a"]
    assert values == [rig.row(a[0].event_id).envelope, rig.row(a[2].event_id).envelope]
    [entry] = rig.store.audit_log(None, 10)
    assert (entry.who, entry.action, entry.reason, entry.slot) == (
        "bob",
        "skip",
        "poison payload",
        2,
    )
    assert rig.store.counts()[RowState.SKIPPED] == 1


def test_operators_cannot_retry_or_skip_rows_in_other_states(rigs) -> None:
    rig = rigs()
    items = drafts("proj-a", 1)
    append_all(rig.store, items)
    with pytest.raises(OutboxError, match="it is pending; only a failed or retry_wait row"):
        ops.retry(rig.store, items[0].event_id, who="x", now=0)
    rig.publisher.run_pass()
    with pytest.raises(OutboxError, match="it is published"):
        ops.skip(rig.store, items[0].event_id, reason="r", who="x", now=0)
    with pytest.raises(OutboxError, match="needs a reason"):
        ops.skip(rig.store, items[0].event_id, reason=" ", who="x", now=0)
    with pytest.raises(OutboxError, match="no row with event id evt_nope"):
        ops.retry(rig.store, "evt_nope", who="x", now=0)
    assert rig.store.audit_log(None, 10) == []


def test_retry_wait_goes_back_to_pending_when_due(rigs) -> None:
    rig = rigs(lambda key, value, nth: OUTAGE if nth == 1 else OK)
    items = drafts("proj-a", 1)
    append_all(rig.store, items)
    rig.publisher.run_pass()
    row = rig.row(items[0].event_id)
    assert row.state is RowState.RETRY_WAIT and row.deferrals == 1
    assert rig.store.release_due(rig.now()) == 0
    rig.clock.advance(1.0)
    assert rig.store.release_due(rig.now()) == 1
    assert rig.row(items[0].event_id).state is RowState.PENDING
    rig.publisher.run_pass()
    assert rig.row(items[0].event_id).state is RowState.PUBLISHED


def test_a_pass_cut_short_by_the_cap_lets_the_next_projects_go_first(rigs) -> None:
    rig = rigs(rows_per_pass=20, rows_per_project=1)
    items = {f"proj-{n:02d}": drafts(f"proj-{n:02d}", 3) for n in range(30)}
    for batch in items.values():
        append_all(rig.store, batch)
    assert rig.publisher.run_pass().sent == 20
    assert rig.publisher.run_pass().sent == 20
    # Projects 20-29 were not starved by 00-19, which still had rows.
    for n in range(30):
        first = rig.row(items[f"proj-{n:02d}"][0].event_id)
        assert first.state is RowState.PUBLISHED, n


def test_a_commit_in_the_same_process_wakes_a_sleeping_publisher(
    outbox_backend: OutboxBackend,
) -> None:
    """With an hour-long poll interval, only the commit signal can make the publisher look."""
    import threading

    class WatchedSignal(CommitSignal):
        """Says when the publisher has begun waiting (its first, empty pass is over)."""

        def __init__(self) -> None:
            super().__init__()
            self.waiting = threading.Event()

        def wait(self, seen: int, timeout: float) -> bool:
            self.waiting.set()
            return super().wait(seen, timeout)

    store = outbox_backend.store()
    signal = store.commits = WatchedSignal()
    kafka = SimulatedKafka()
    stop = threading.Event()
    with Publisher(
        store, lambda: kafka, stream_for=_stream_for, policy=policy(poll_interval_s=3600)
    ) as publisher:
        runner = threading.Thread(target=publisher.run, kwargs={"stop": stop}, daemon=True)
        runner.start()
        try:
            assert signal.waiting.wait(60), "the publisher never finished its first pass"
            assert store.counts()[RowState.PUBLISHED] == 0
            append_all(store, drafts("proj-a", 2))
            wait_until(  # a bound far below the poll interval
                lambda: store.counts()[RowState.PUBLISHED] == 2,
                60,
                "the commit woke the publisher and it published both rows",
            )
        finally:
            stop.set()
            store.commits.notify()  # let it see the stop at once
            runner.join(30)
    assert not runner.is_alive()
