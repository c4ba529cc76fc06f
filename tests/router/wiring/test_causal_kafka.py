"""The causal router's shared pieces on the real Redis and broker: the maintenance tick (once a
day, one process, with an injected clock) and the companion publisher of the router's outbox.
(The daily caps across clients: tests/consumers/subscriptions/causal_router/test_budget_redis.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.types import JSON, TP, Progress
from consumers.subscriptions.causal_router.processor import SLUG
from router.operator.queues import read_commands
from router.settings import Settings
from router.wiring.causal import RouterCompanion, maintenance_tick, open_router_outbox
from streams.admin import admin_client, provision
from streams.clock import ManualClock
from streams.envelopes import Draft
from streams.producer import Producer
from tests.support.causal_router import Driver, History, make_router, open_test_outbox
from tests.support.kafka import events_of, read_all
from tests.support.runtime_processes import runtime_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _seed_folds(s: Settings, states: dict[str, JSON]) -> None:
    """Put folds where the runtime keeps them (as a running router would have)."""
    store = RedisStore(
        connect(s.redis_url, timeout=5),
        env=s.env,
        slug=SLUG,
        clock=ManualClock(),
        claim_ttl_ms=10**9,
    )
    by_tp: dict[TP, dict[str, JSON]] = {}
    for project, state in states.items():
        by_tp.setdefault(TP(*s.topology.partition_of(project)), {})[project] = state
    for tp, folds in by_tp.items():
        current = store.load(tp)
        store.replace_fold(
            tp,
            None,
            (current.acked_through, current.cursor_revision),
            Progress(acked_through=current.acked_through + 1),
            {**store.all_states(tp), **folds},
        )


def _promotion(h: History, change: str, generation: int) -> None:
    h.add("verification.started", change=change, candidateId=f"{change}-c", workGraphCompleted=True)
    h.add("artifact.promoted", change=change, candidateId=f"{change}-c", generation=generation)
    h.add("canonical.advanced", change=None, generation=generation)


def test_the_maintenance_tick_runs_once_a_day_in_one_process_and_queues_only_new_work(
    settings: Settings, tmp_path: Path
) -> None:
    s = runtime_settings(settings, maintenance_at_utc="04:17")
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.all_specs(), topology=s.topology, timeout=30)
    driver = Driver(make_router(open_test_outbox(tmp_path / "o.sqlite")))
    h = History(project="maint-a")
    _promotion(h, "c1", 1)
    _promotion(h, "c2", 2)
    driver.fold(h.events)
    _seed_folds(s, driver.states)

    clock = ManualClock(datetime(2026, 3, 2, 3, 0, tzinfo=UTC))
    client = connect(s.redis_url, timeout=5)
    producer = Producer(base)
    ticks = [maintenance_tick(s, client, clock, producer) for _ in range(2)]  # two processes
    assert ticks[0].run_if_due() is None  # 03:00: not yet
    clock.advance(77 * 60)  # 04:17
    plan = ticks[1].run_if_due()
    assert plan is not None
    assert [c.command_type for c in plan.commands] == ["forks.sweep", "index.purge"]
    assert ticks[0].run_if_due() is None  # the other process: today's tick is done
    clock.advance(3 * 3600)
    assert ticks[1].run_if_due() is None  # and so it stays all day

    _promotion(h, "c3", 3)  # new work arrives
    driver.fold(h.events[-3:])
    _seed_folds(s, driver.states)
    clock.advance(21 * 3600)  # the next day, 04:17
    # A tick already started elsewhere today (its lock is held): this process leaves it alone.
    client.set(f"rh:{s.env}:causal-router:maintenance:lock:2026-03-03", "other", ex=60)
    assert ticks[0].run_if_due() is None
    client.delete(f"rh:{s.env}:causal-router:maintenance:lock:2026-03-03")
    second = ticks[0].run_if_due()
    assert second is not None
    assert [(c.command_type, c.payload) for c in second.commands] == [
        ("forks.sweep", {"changeIds": ["c3"], "complete": True}),
        ("index.purge", {"keepGeneration": 3}),
    ]
    queued = read_commands(s)
    assert queued.by_type() == {"forks.sweep": 2, "index.purge": 2}
    assert queued.repeated_ids() == {}
    assert {c.command_id for c in queued.commands} == {
        c.command_id for c in plan.commands + second.commands
    }


def test_the_companion_publishes_the_routers_outbox_and_hands_over_the_lease(
    settings: Settings, tmp_path: Path
) -> None:
    s = runtime_settings(
        settings, router_outbox_path=str(tmp_path / "router.sqlite"), maintenance_enabled=False
    )
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.all_specs(), topology=s.topology, timeout=30)
    client = connect(s.redis_url, timeout=5)
    clock = ManualClock(datetime.now(UTC))
    outbox = open_router_outbox(s)
    first = RouterCompanion(s, client, clock, outbox)
    second = RouterCompanion(s, client, clock, open_router_outbox(s))  # another process on the host
    first.start()
    wait_until(first.publishing.is_set, 60, "the first companion holds the publisher lease")
    second.start()
    drafts = [
        Draft(
            event_id=f"evt_{n:032x}",
            event_type="candidate.stale",
            project_id="companion-p",
            change_id="c",
            task_id=None,
            actor="service:causal-router",
            payload={"candidateId": f"cand-{n}"},
        )
        for n in range(1, 4)
    ]
    try:
        with outbox.transaction() as unit:
            unit.append("companion-p", drafts[:2], tenant_id="t")
        stream = s.topology.stream_for("companion-p")
        got = events_of(read_all(s.kafka_bootstrap, [stream], expect=2, timeout=60))
        assert [(e.event_id, e.slot) for e in got] == [
            (d.event_id, n) for n, d in enumerate(drafts[:2], 1)
        ]
        assert not second.publishing.is_set()
        first.close()  # the first process exits: the second takes over the lease
        wait_until(second.publishing.is_set, 60, "the second companion took over the lease")
        with outbox.transaction() as unit:
            unit.append("companion-p", drafts[2:], tenant_id="t")
        got = events_of(read_all(s.kafka_bootstrap, [stream], expect=3, timeout=60))
        assert [e.event_id for e in got] == [d.event_id for d in drafts]
    finally:
        first.close()
        second.close()
    with outbox.publisher_lease():  # both closed: the lease is free again
        pass
