"""The causal router's shared pieces on the real Redis and broker: the daily caps counted across
clients, the maintenance tick (once a day, one process, with an injected clock), and the
companion publisher of the router's outbox."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.types import JSON, TP, Progress
from consumers.subscriptions.causal_router.budget import RedisCommandBudget, RedisDailyCounter
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

pytestmark = pytest.mark.integration


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def test_the_classifier_counter_is_shared_across_clients(settings: Settings) -> None:
    one = RedisDailyCounter(
        connect(settings.redis_url, timeout=5), env=settings.env, ttl_s=86_400 * 2
    )
    two = RedisDailyCounter(
        connect(settings.redis_url, timeout=5), env=settings.env, ttl_s=86_400 * 2
    )
    seen = [one.incr("classifier-calls:2026-03-02"), two.incr("classifier-calls:2026-03-02")]
    seen.append(one.incr("classifier-calls:2026-03-02"))
    assert seen == [1, 2, 3]
    assert two.incr("classifier-calls:2026-03-03") == 1
    ttl = one.client.ttl(f"rh:{settings.env}:causal-router:classifier-calls:2026-03-02")
    assert 86_400 < ttl <= 2 * 86_400


def test_the_command_budget_is_per_change_shared_and_idempotent_per_command(
    settings: Settings,
) -> None:
    a = RedisCommandBudget(
        connect(settings.redis_url, timeout=5), env=settings.env, cap=3, ttl_s=3600
    )
    b = RedisCommandBudget(
        connect(settings.redis_url, timeout=5), env=settings.env, cap=3, ttl_s=3600
    )
    day = "2026-03-02"
    assert [a.admit("p", "c1", day, f"cmd_{n}") for n in range(2)] == [True, True]
    assert b.admit("p", "c1", day, "cmd_2")
    assert not b.admit("p", "c1", day, "cmd_3")  # the fourth command of the change that day
    assert a.admit("p", "c1", day, "cmd_0")  # a retried decision: same id, not counted again
    assert a.used("p", "c1", day) == 3
    assert a.admit("p", "c2", day, "cmd_3")  # another change has its own budget
    assert a.admit("p", "c1", "2026-03-03", "cmd_3")  # and so has another day
    # (project, change) pairs cannot collide by spelling.
    assert a.key("a|b", "c", day) != a.key("a", "b|c", day)


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
    _wait_for(first.publishing.is_set, "the first companion holds the publisher lease")
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
        _wait_for(second.publishing.is_set, "the second companion took over the lease")
        with outbox.transaction() as unit:
            unit.append("companion-p", drafts[2:], tenant_id="t")
        got = events_of(read_all(s.kafka_bootstrap, [stream], expect=3, timeout=60))
        assert [e.event_id for e in got] == [d.event_id for d in drafts]
    finally:
        first.close()
        second.close()
    with outbox.publisher_lease():  # both closed: the lease is free again
        pass
