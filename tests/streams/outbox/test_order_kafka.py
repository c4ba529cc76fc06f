"""Order under failure against the real broker, over both outbox backends (SQLite and
PostgreSQL): 10,000 events over 200 projects published while sends fail at the producer boundary
(row faults, outages, local refusals), for both ordering strategies; and a real rejection by the
broker (a record over the topic's size limit), which fails that row alone and holds only its
project."""

from __future__ import annotations

import base64
import dataclasses
import os
import time
from collections import defaultdict

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from router.settings import Settings
from router.wiring.outbox import build_publisher, kafka_senders, publisher_policy
from streams.admin import admin_client, describe_configs, provision
from streams.outbox import ops
from streams.outbox.states import Ordering
from streams.outbox.store import RowState
from streams.workload import workload
from tests.support.environment import cleanup_environment, make_settings
from tests.support.kafka import events_of, read_all
from tests.support.outbox import FaultInjectingSender, OutboxBackend, drafts, write_drafts

pytestmark = pytest.mark.integration

FAST_RETRIES = {
    "outbox_backoff_initial_s": 0.05,
    "outbox_backoff_max_s": 0.2,
    "outbox_delivery_timeout_s": 10.0,
}


@pytest.fixture
def fast_settings(request: pytest.FixtureRequest):
    ordering = getattr(request, "param", "serial")
    s = make_settings(outbox_ordering=ordering, **FAST_RETRIES)
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    yield s
    cleanup_environment(s)


def _slots_by_project(settings: Settings, expect: int) -> dict[str, list[int]]:
    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=expect)
    slots: dict[str, list[int]] = defaultdict(list)
    for event in events_of(messages):
        slots[event.project_id].append(event.slot or 0)
    return slots


@pytest.mark.parametrize("fast_settings", ["serial", "pipelined"], indirect=True)
def test_ten_thousand_events_keep_slot_order_while_sends_fail(
    fast_settings: Settings, outbox_backend: OutboxBackend
) -> None:
    s = fast_settings
    store = outbox_backend.store()
    assert write_drafts(store, workload("order", 200, 10_000), writers=4, per_write=5) == 10_000
    policy = publisher_policy(s)
    real = kafka_senders(s, policy)
    injectors: list[FaultInjectingSender] = []

    def senders() -> FaultInjectingSender:
        injector = FaultInjectingSender(
            real(),
            partitions=s.partitions,
            seed=len(injectors),
            gapless=policy.ordering is Ordering.PIPELINED,
            row_rate=0.01,
            outage_rate=0.01,
            refuse_rate=0.005,
        )
        injectors.append(injector)
        return injector

    with build_publisher(s, store, senders=senders) as publisher:
        totals = publisher.run(until_empty=True)
    injected = {k: sum(i.injected[k] for i in injectors) for k in injectors[0].injected}
    assert injected["row"] > 20 and injected["outage"] > 20 and injected["refused"] > 10
    assert totals.published == 10_000 and totals.failed == 0
    assert totals.row_faults >= injected["row"] and totals.deferred >= injected["outage"]
    assert totals.order_violations == 0
    counts = store.counts()
    assert counts[RowState.PUBLISHED] == 10_000 and counts[RowState.FAILED] == 0

    slots = _slots_by_project(s, 10_000)
    assert len(slots) == 200
    for project, found in slots.items():
        # Complete, in slot order, and no duplicate: nothing crashed in this test.
        assert found == list(range(1, len(found) + 1)), project
    assert sum(len(found) for found in slots.values()) == 10_000


@pytest.mark.parametrize("fast_settings", ["serial", "pipelined"], indirect=True)
def test_a_record_the_broker_rejects_fails_alone_and_holds_only_its_project(
    fast_settings: Settings, outbox_backend: OutboxBackend
) -> None:
    s = fast_settings
    target = s.topology.stream_for("proj-big")
    base = s.kafka_config()
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        target,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = admin_client(base)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    deadline = time.monotonic() + 30  # topic configs reach the broker's cache asynchronously
    while describe_configs(admin, base, [target], 10)[target]["max.message.bytes"] != "20000":
        assert time.monotonic() < deadline, "the lowered size limit never showed"
        time.sleep(0.1)
    store = outbox_backend.store()
    big = dataclasses.replace(
        # Random bytes: compression cannot bring it under the limit.
        drafts("proj-big", 1)[0],
        payload={"agentId": "agent-test", "blob": base64.b64encode(os.urandom(30_000)).decode()},
    )
    items = {
        "proj-big": [*drafts("proj-big", 3), big, *drafts("proj-big", 3)],
        # Others on the same stream share batches with the big record.
        **{
            p: drafts(p, 20)
            for p in (f"proj-{n}" for n in range(200))
            if s.topology.stream_for(p) == target
        },
    }
    for project, batch in items.items():
        with store.transaction() as unit:
            unit.append(project, batch, tenant_id="t")
    with build_publisher(s, store) as publisher:
        totals = publisher.run(until_empty=True)
    failed = store.get(big.event_id)
    assert failed is not None and failed.state is RowState.FAILED
    assert failed.attempts == s.outbox_max_row_attempts
    assert "MSG_SIZE_TOO_LARGE" in (failed.last_error or "")
    held = store.held_projects(10)
    assert [(h.project_id, h.slot, h.waiting) for h in held] == [("proj-big", 4, 3)]
    # Every other row was published, though some shared a rejected batch along the way.
    counts = store.counts()
    total = sum(len(b) for b in items.values())
    assert counts[RowState.PUBLISHED] == total - 4 and counts[RowState.FAILED] == 1
    assert totals.order_violations == 0
    if s.outbox_ordering == "pipelined":
        # The gapless producer turns each rejection into a fatal error rather than a gap.
        assert totals.producers_replaced >= s.outbox_max_row_attempts
    else:
        assert totals.producers_replaced == 0

    ops.skip(store, big.event_id, reason="over the topic's size limit", who="test", now=0)
    with build_publisher(s, store) as publisher:
        publisher.run(until_empty=True)
    assert store.counts()[RowState.PUBLISHED] == total - 1
    slots = _slots_by_project(s, total - 1)
    assert slots["proj-big"] == [1, 2, 3, 5, 6, 7]  # the skipped slot is a visible gap
    for project, found in slots.items():
        if project != "proj-big":
            assert found == list(range(1, 21)), project
