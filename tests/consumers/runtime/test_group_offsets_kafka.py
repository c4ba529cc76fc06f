"""The group's committed offsets of a quiet partition reach its end, on the real broker and Redis,
after commits the group refused (a coordinator in the middle of a rebalance answers
REBALANCE_IN_PROGRESS or ILLEGAL_GENERATION): lag tooling, and the chaos matrix's drain, read
lag 0 once a subscription has caught up, and stay there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

from consumers.lag import group_lag
from consumers.redis_conn import connect
from consumers.runtime.kafka_transport import KafkaTransport
from consumers.runtime.types import TP
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import Subscription, open_subscription
from streams.admin import admin_client
from streams.envelopes import Event
from streams.workload import slotted_events, workload
from tests.support.runtime_processes import publish, runtime_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BOUND_S = 30.0  # against a hang only: each wait ends as soon as its condition holds
EVENTS = 10


class _RefusingGroup:
    """A member's real consumer, but while ``refusing`` the group refuses every asynchronous
    commit (as a coordinator in the middle of a rebalance answers, REBALANCE_IN_PROGRESS):
    nothing of it is stored, and its refusal is held. ``release`` stops refusing and lets the
    held refusals reach the commit callback inside the next consume, where librdkafka serves
    its answers."""

    def __init__(self, transport: KafkaTransport) -> None:
        self.real = transport.consumer
        self.answer = transport._on_commit
        self.refusing = True
        self.asked: list[tuple[TP, int]] = []  # in the order asked
        self.refused: list[tuple[TP, int]] = []
        self._held: list[TopicPartition] = []
        self._due = False

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous, "the transport commits group offsets asynchronously"
        asked = [(TP(p.topic, p.partition), p.offset) for p in offsets]
        self.asked.extend(asked)
        if self.refusing:
            self.refused.extend(asked)
            self._held.extend(TopicPartition(p.topic, p.partition, p.offset) for p in offsets)
            return
        self.real.commit(offsets=offsets, asynchronous=True)

    def release(self) -> None:
        self.refusing = False
        self._due = True

    def consume(self, num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
        if self._due:
            self._due = False
            held, self._held = self._held, []
            self.answer(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS), held
            )
        return list(self.real.consume(num_messages, timeout=timeout))

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def of(self, tp: TP) -> list[int]:
        """The offsets asked for ``tp``, in order."""
        return [offset for t, offset in self.asked if t == tp]


def _refusing(subscription: Subscription) -> _RefusingGroup:
    transport = subscription.runner.transport
    assert isinstance(transport, KafkaTransport)
    refusing = _RefusingGroup(transport)
    transport.consumer = cast(confluent_kafka.Consumer, refusing)
    return refusing


@pytest.fixture
def rs(settings: Settings) -> Iterator[Settings]:
    s = runtime_settings(settings)
    provision_environment(s)
    yield s


def _events(run: str) -> list[Event]:
    """``EVENTS`` events of one project: all on one partition."""
    return slotted_events(workload(run, 1, EVENTS), tenant_id="t")


def _applied(s: Settings) -> int:
    return sum(read_ledger(connect(s.redis_url, timeout=5), s.env)["counts"].values())


def _lag(s: Settings) -> dict[TP, tuple[int | None, int]]:
    """The ledger group's (committed offset, log end) of every partition it has yet to catch up."""
    base = s.kafka_config()
    found = group_lag(admin_client(base), base, s.topology.subscription_reads("ledger"), 10)
    return {TP(p.topic, p.partition): (p.committed, p.end) for p in found if p.lag}


def _caught_up(subscription: Subscription, s: Settings, applied: int) -> None:
    runner = subscription.runner

    def done() -> bool:
        runner.run_once(timeout=0.1)
        return _applied(s) == applied and runner.idle()

    wait_until(done, BOUND_S, f"the ledger caught up with {applied} events")


def test_a_refused_commit_is_not_asked_again_over_a_later_one_and_the_group_reads_lag_0(
    rs: Settings,
) -> None:
    """A commit the group refused is asked again at the next poll; but the poll that serves the
    refusal can also read a record and ask for the offset after it. Asked again then, the
    refused offset lands last and leaves the group behind for good: the partition is quiet
    from there on, and its owner has asked for its end already (so it never asks again)."""
    events = _events("refused")
    publish(rs, events[:-1])
    subscription = open_subscription(rs, "ledger")
    try:
        runner = subscription.runner
        refusing = _refusing(subscription)
        _caught_up(subscription, rs, EVENTS - 1)
        (tp,) = {t for t, offset in refusing.asked if offset > 0}
        assert refusing.of(tp)[-1] == EVENTS - 1, "read to its end; every commit refused"
        publish(rs, events[-1:])
        refusing.release()
        # Its refusals are served, then the last record comes (the poll waits for it).
        assert runner.run_once(timeout=BOUND_S) == 1
        assert refusing.of(tp)[-1] == EVENTS, "the offset after the last record, asked"
        for _ in range(3):  # a refused offset still due is asked again at a poll's start
            runner.run_once(timeout=0.1)
        last = refusing.of(tp)[-1]

        def landed() -> bool:
            stored = runner.transport.committed([tp])[tp]
            return stored is not None and stored.offset == last

        # The broker keeps the last offset asked: once it has landed, that is what stays.
        wait_until(landed, BOUND_S, f"{tp}'s last offset asked, {last}, stored")
        assert last == EVENTS, f"asked for {tp}, in order: {refusing.of(tp)}"
        assert _lag(rs) == {}
        assert _applied(rs) == EVENTS
    finally:
        subscription.close()


def test_a_new_owner_of_a_quiet_partition_commits_where_the_cursor_resumes_it(
    rs: Settings,
) -> None:
    """The first owner applies everything and records its cursor in Redis, but the group
    refuses every offset it asks, on its way out too (revoked in the middle of a rebalance: a
    refusal then is not asked again, the partition is no longer its own). The next owner
    resumes after the cursor, reads nothing, and still tells the group where the partition
    stands."""
    publish(rs, _events("handover"))
    first = open_subscription(rs, "ledger")
    try:
        refusing = _refusing(first)
        _caught_up(first, rs, EVENTS)
    finally:
        first.close()
    assert EVENTS in [offset for _, offset in refusing.refused], "its offsets, all refused"
    assert refusing.refused == refusing.asked
    assert _lag(rs), "the first owner's offsets were all refused: the group is behind"
    second = open_subscription(rs, "ledger")
    try:
        runner = second.runner

        def reads_lag_0() -> bool:
            runner.run_once(timeout=0.1)
            return runner.idle() and not _lag(rs)

        wait_until(reads_lag_0, BOUND_S, "the new owner's group at lag 0", lambda: str(_lag(rs)))
        assert runner.stats.applied == 0 and _applied(rs) == EVENTS
    finally:
        second.close()
