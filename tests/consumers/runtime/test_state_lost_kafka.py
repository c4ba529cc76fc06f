"""Redis loses an environment's every key while its subscriptions are stopped, on the real
broker and Redis, through the consume process's own wiring (router/wiring/subscription.py):
the ledger (effects in Redis) reads its partitions again from the start into the empty Redis,
and the event it dead-lettered before is neither tried nor lettered again (its letter is back
in the index, from the audit topic); the causal router (effects on Kafka) sends no command again
for what its group committed, and its fold is whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumers.redis_conn import connect
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import Subscription, dead_letters, open_subscription
from streams.envelopes import Event
from streams.topology import dead_letter_topic
from streams.workload import slotted_events, workload
from tests.support.kafka import read_all
from tests.support.outbox import records_in
from tests.support.redis_loss import delete_environment_keys
from tests.support.runtime_processes import publish, runtime_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

BOUND_S = 60.0  # against a hang only: each wait ends as soon as its condition holds


@pytest.fixture
def rs(settings: Settings) -> Iterator[Settings]:
    s = runtime_settings(settings, max_batch_failures=3)
    provision_environment(s)
    yield s


def _events(run: str) -> tuple[list[Event], str]:
    """Three projects' events, one of them marked for the ledger's drill to fail."""
    events = slotted_events(workload(run, 3, 30), tenant_id="t")
    poison = events[4]
    events[4] = poison.model_copy(update={"payload": {**poison.payload, "drill": "fail"}})
    return events, poison.event_id


def _settled(subscription: Subscription, what: str, done: object) -> None:
    runner = subscription.runner

    def settled() -> bool:
        runner.run_once(timeout=0.1)
        return bool(done()) and runner.idle()  # type: ignore[operator]

    wait_until(settled, BOUND_S, what)


def _caught_up(subscription: Subscription) -> bool:
    runner = subscription.runner
    return bool(runner.parts) and runner.transport.caught_up(list(runner.parts))


def _ledger(s: Settings) -> dict[str, object]:
    return read_ledger(connect(s.redis_url, timeout=5), s.env)


def test_the_ledger_rebuilds_into_an_empty_redis_and_its_dead_letter_stays_one(
    rs: Settings,
) -> None:
    events, poison = _events("lost")
    publish(rs, events)
    first = open_subscription(rs, "ledger")
    try:
        _settled(
            first,
            "the ledger applied all but the poison",
            lambda: (
                sum(
                    _ledger(rs)["counts"].values()  # type: ignore[attr-defined]
                )
                == len(events) - 1
            ),
        )
        assert first.runner.stats.dead_lettered == 1
    finally:
        first.close()
    before = _ledger(rs)
    client = connect(rs.redis_url, timeout=5)
    assert delete_environment_keys(client, rs.env) > 0
    assert dead_letters(rs, client).list() == []

    second = open_subscription(rs, "ledger")
    try:
        _settled(second, "the ledger rebuilt", lambda: _ledger(rs) == before)
        assert second.runner.stats.failures == 0, "the dead-lettered event was tried again"
        assert second.runner.stats.dead_lettered == 0
    finally:
        second.close()
    [letter] = dead_letters(rs, client).list()
    assert [e.event_id for e in letter.entries] == [poison]
    topic = dead_letter_topic(rs.env)
    assert (
        len(read_all(rs.kafka_bootstrap, [topic], expect=records_in(rs.kafka_bootstrap, [topic])))
        == 1
    )


def _folds(subscription: Subscription) -> dict[str, object]:
    runner = subscription.runner
    out: dict[str, object] = {}
    for tp in runner.parts:
        out.update(runner.store.all_states(tp))
    return out


def test_the_causal_router_refolds_through_its_committed_offset_and_sends_nothing_again(
    rs: Settings,
) -> None:
    events = slotted_events(workload("refold", 4, 60), tenant_id="t")
    publish(rs, events)
    queues = rs.topology.queue_names()
    first = open_subscription(rs, "causal-router")
    try:
        _settled(first, "the router caught up", lambda: _caught_up(first))
        before = _folds(first)
    finally:
        first.close()
    sent = records_in(rs.kafka_bootstrap, queues)
    assert sent > 0 and before
    client = connect(rs.redis_url, timeout=5)
    assert delete_environment_keys(client, rs.env) > 0

    second = open_subscription(rs, "causal-router")
    try:
        _settled(
            second,
            "the router refolded",
            lambda: _caught_up(second) and _folds(second) == before,
        )
        assert second.runner.stats.applied == 0
    finally:
        second.close()
    assert records_in(rs.kafka_bootstrap, queues) == sent, "a command was sent again"
