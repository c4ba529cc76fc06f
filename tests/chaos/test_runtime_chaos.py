"""Killing, freezing and churning subscription processes on the real broker and Redis."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter as Tally
from datetime import UTC, datetime

import orjson
import pytest
from confluent_kafka.admin import NewTopic

from consumers.redis_conn import connect
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from streams.admin import admin_client
from streams.topology import group_id
from streams.workload import project_events, slotted_events, workload
from tests.support.kafka import group_assignments, read_all
from tests.support.runtime_processes import (
    cli,
    publish,
    run,
    runtime_settings,
    start,
    wait_ready,
    wait_stopped,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture
def rs(settings: Settings) -> Settings:
    return runtime_settings(settings)


def _assert_exact(s: Settings, events: list) -> None:  # type: ignore[type-arg]
    ledger = read_ledger(connect(s.redis_url, timeout=5), s.env)
    assert ledger["counts"] == {e.event_id: 1 for e in events}, (
        "an event is missing or applied twice"
    )
    per_project = Tally(e.project_id for e in events)
    assert ledger["projects"] == {p: list(range(1, n + 1)) for p, n in per_project.items()}


@pytest.mark.parametrize(
    "failpoint",
    [
        "runtime.before_store_commit@3",
        "runtime.after_store_commit@3",
        "runtime.after_offsets_commit@2",
    ],
)
def test_sigkill_mid_batch_loses_nothing_and_doubles_nothing(rs: Settings, failpoint: str) -> None:
    rs = runtime_settings(rs, batch_size=20)
    events = slotted_events(workload("kill", 30, 600), tenant_id="t")
    cli(rs, "provision")
    publish(rs, events)
    victim = start(rs, "ledger", until_idle=30, RHUMBATRON_FAILPOINTS=failpoint)
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    run(rs, "ledger")
    _assert_exact(rs, events)


@pytest.mark.parametrize(
    "failpoint",
    [
        "runtime.after_store_commit@2",
        "runtime.before_transaction_commit@2",
        "runtime.after_transaction_commit@2",
    ],
)
def test_sigkill_around_the_transaction_keeps_kafka_effects_exactly_once(
    rs: Settings, failpoint: str
) -> None:
    rs = runtime_settings(rs, batch_size=20)
    events = slotted_events(workload("killtx", 20, 300), tenant_id="t")
    cli(rs, "provision")
    admin = admin_client(rs.kafka_config())
    for f in admin.create_topics([NewTopic(f"out_{rs.env}", 2, 1)]).values():
        f.result()
    publish(rs, events)
    victim = start(rs, "kafka-counter", until_idle=30, RHUMBATRON_FAILPOINTS=failpoint)
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    stats = run(rs, "kafka-counter")
    out = read_all(rs.kafka_bootstrap, [f"out_{rs.env}"], expect=len(events), timeout=30)
    assert Tally(orjson.loads(m.value() or b"")["event"] for m in out) == {
        e.event_id: 1 for e in events
    }
    if "after_store_commit" in failpoint or "before_transaction" in failpoint:
        # Killed with a batch's effects stored as pending and not landed: only their re-send by
        # the next owner can have made the tally exact. (The transaction fail-points count
        # effects transactions alone; offsets-only commits past the markers have their own.)
        assert stats["recovered"] > 0


def test_a_consumer_frozen_past_its_session_has_its_late_writes_refused(rs: Settings) -> None:
    rs = runtime_settings(rs, batch_size=10, group_protocol="classic", session_timeout_ms=6000)
    events = slotted_events(workload("zombie", 10, 200), tenant_id="t")
    cli(rs, "provision")
    publish(rs, events)
    zombie = start(
        rs, "ledger", until_idle=10, RHUMBATRON_FAILPOINTS="runtime.before_store_commit@2:stop"
    )
    try:
        wait_stopped(zombie)
        wait_until(  # its session expires; the group moves on without it
            lambda: group_assignments(rs.kafka_bootstrap, group_id("ledger", rs.env)) == [],
            rs.session_timeout_ms / 1000 + 60,
            "the frozen consumer was dropped from the group",
        )
        run(rs, "ledger")  # a healthy process takes every partition and finishes the work
        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    stats = orjson.loads(out.strip().splitlines()[-1])
    assert stats["fenced"] >= 1, err[-2000:]
    assert "stale" in err or "fenced" in err.lower()
    _assert_exact(rs, events)


# Both protocols in `make test-slow` (65 s each); `make test` has a projector joining mid-run
# (tests/router/test_scale_out.py) under each.
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_second_consumer_joining_and_leaving_ten_times_leaves_no_gap_and_no_duplicate(
    rs: Settings, protocol: str
) -> None:
    rs = runtime_settings(rs, batch_size=25, group_protocol=protocol)
    cli(rs, "provision")
    projects = [f"churn-{protocol}-{n}" for n in range(24)]
    drafts = {p: project_events(p, 40) for p in projects}
    published: list = []  # type: ignore[type-arg]
    done = threading.Event()

    def writer() -> None:
        # Events keep arriving for the whole run, in per-project slot order.
        for step in range(40):
            batch = [
                d.to_event(tenant_id="t", timestamp=_now(), slot=step + 1)
                for d in (drafts[p][step] for p in projects)
            ]
            publish(rs, batch)
            published.extend(batch)
            time.sleep(0.15)
        done.set()

    group = group_id("ledger", rs.env)
    # The steady member runs until told to stop: one that stopped on going idle could leave while
    # the joins go on, and a join would then wait for a member that is gone.
    steady = start(rs, "ledger")
    steady_err: list[str] = []
    assert steady.stderr is not None
    drain = threading.Thread(target=lambda: steady_err.extend(steady.stderr or ()), daemon=True)
    drain.start()  # read as it is written: a full pipe would block the member mid-run
    held: list[list[bool]] = []

    def both_hold() -> bool:
        if steady.poll() is not None:
            raise AssertionError(f"the steady member exited: {''.join(steady_err)[-2000:]}")
        held.append([bool(p) for p in group_assignments(rs.kafka_bootstrap, group)])
        return held[-1] == [True, True]

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(10):
            joiner = start(rs, "ledger")
            wait_ready(joiner)  # it joins the group from here on
            held.clear()
            try:
                wait_until(both_hold, 60, "the joiner holds partitions beside the steady member")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the members held, last: {held[-3:]}") from None
            joiner.send_signal(signal.SIGTERM)
            _, err = joiner.communicate(timeout=60)
            assert joiner.returncode == 0, err[-2000:]
        thread.join()
        steady.send_signal(signal.SIGTERM)
        steady.wait(timeout=120)
        drain.join(timeout=10)
        assert steady.returncode == 0, "".join(steady_err)[-2000:]
    finally:
        done.set()
        if steady.poll() is None:
            steady.kill()
    run(rs, "ledger", until_idle=3)  # anything left when the steady member stopped
    _assert_exact(rs, published)


def _now() -> datetime:
    return datetime.now(UTC)
