"""Parked projects on the real broker and Redis: a ledger whose code knows version 1 parks the
project of a version-2 event (its cursor in Redis says so, the other projects are applied); a
restart with code that knows version 2 applies the parked events, and those published since, in
order, and clears the park."""

from __future__ import annotations

import dataclasses

import pytest

from consumers.runtime.types import TP, Park
from consumers.subscriptions.ledger import Ledger, read_ledger
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription, redis_client
from router.wiring.subscription import store as ledger_store
from streams.catalog import Catalog
from streams.clock import SystemClock
from tests.consumers.runtime.test_parking import NEW, OLD, TYPE, done
from tests.support.runtime_processes import publish, runtime_settings

pytestmark = pytest.mark.integration


def _consume(s: Settings, catalog: Catalog) -> None:
    sub = open_subscription(s, "ledger", processor=Ledger())
    sub.runner.policy = dataclasses.replace(sub.runner.policy, catalog=catalog)
    try:
        sub.runner.run(until_idle_s=3)
    finally:
        sub.close()


def test_a_parked_project_survives_a_restart_and_flows_once_the_consumer_is_upgraded(
    settings: Settings,
) -> None:
    s = runtime_settings(settings, batch_size=5, parked_drain_records=4)
    provision_environment(s)
    parked, others = "park-alpha", ["park-beta", "park-gamma"]
    first = [done(parked, 1), done(parked, 2, version=2), done(parked, 3)]
    first += [done(p, n) for n in range(1, 4) for p in others]
    publish(s, first)

    _consume(s, OLD)
    ledger = read_ledger(redis_client(s), s.env)
    assert ledger["projects"] == {parked: [1], **{p: [1, 2, 3] for p in others}}
    topic, partition = s.topology.partition_of(parked)
    store = ledger_store(s, redis_client(s), "ledger", SystemClock())
    park = store.load(TP(topic, partition)).parked[parked]
    assert (park.event_type, park.version) == (TYPE, 2) and isinstance(park, Park)

    publish(s, [done(parked, 4), done(parked, 5, version=2), done("park-beta", 4)])
    _consume(s, NEW)
    ledger = read_ledger(redis_client(s), s.env)
    assert ledger["projects"] == {
        parked: [1, 2, 3, 4, 5],
        "park-beta": [1, 2, 3, 4],
        "park-gamma": [1, 2, 3],
    }
    assert set(ledger["counts"].values()) == {1}
    assert store.load(TP(topic, partition)).parked == {}
