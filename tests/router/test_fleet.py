"""The fleet's plan and its supervisor's logic (restarts, backoff, giving up, the bounded stop)
over fake children on a manual clock: pure logic, no process started. tests/router/
test_fleet_processes.py runs the real fleet on the broker and Redis."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from router.fleet import (
    FleetStatus,
    Member,
    RestartPolicy,
    Supervisor,
    plan,
    read_status,
    status_path,
)
from router.settings import Settings
from streams.errors import ConfigurationError, InstanceIdHeld


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(state_dir=tmp_path, **kw)  # type: ignore[arg-type]


# -- the plan -----------------------------------------------------------------------------------------
def test_the_default_plan_runs_the_whole_router(tmp_path: Path) -> None:
    members = plan(_settings(tmp_path), ["/tmp/a.sqlite", "postgresql://db/x"])
    assert [m.name for m in members] == [
        "publisher-1",
        "publisher-2",
        "project-view-projector-1",
        "causal-router-1",
        "audit-archiver-1",
        "analytics-projector-1",
        "dead-letter-consumer",
        "analytics-rollup",
        "operator-server",
    ]
    assert members[1].argv == ("publish", "--outbox", "postgresql://db/x")
    assert members[2].argv == ("consume", "--subscription", "project-view-projector")
    assert members[2].subscription == "project-view-projector"
    assert all(m.env["RHUMBATRON_PROCESS_NAME"] == m.name for m in members)
    assert not any("RHUMBATRON_METRICS_PORT" in m.env for m in members)


def test_the_causal_router_leaves_an_outbox_a_publisher_member_publishes_to_it(
    tmp_path: Path,
) -> None:
    shared = "postgresql://app@db/orders"
    members = {m.name: m for m in plan(_settings(tmp_path, router_outbox_path=shared), [shared])}
    assert members["causal-router-1"].env["RHUMBATRON_ROUTER_PUBLISH_OUTBOX"] == "false"
    assert members["publisher-1"].argv == ("publish", "--outbox", shared)
    # An outbox of its own (by default, the environment's file): the router publishes it.
    members = {m.name: m for m in plan(_settings(tmp_path), [shared])}
    assert "RHUMBATRON_ROUTER_PUBLISH_OUTBOX" not in members["causal-router-1"].env


def test_a_plan_names_each_process_and_gives_each_its_own_probe_port(tmp_path: Path) -> None:
    s = _settings(
        tmp_path,
        fleet_subscriptions={"causal-router": 3, "ledger": 1},
        fleet_workers={"agent-wakeups": "ok"},
        fleet_worker_processes=2,
        fleet_outboxes=["/x.sqlite"],
        fleet_feed="http://127.0.0.1:9/feed",
        fleet_operator_server=False,
        fleet_analytics_rollup=False,
        fleet_dead_letter_consumer=False,
        fleet_metrics_port_base=9300,
    )
    members = plan(s, ["/x.sqlite"])  # named twice: one publisher
    assert [(m.name, m.env["RHUMBATRON_METRICS_PORT"]) for m in members] == [
        ("publisher-1", "9300"),
        ("pump", "9301"),
        ("causal-router-1", "9302"),
        ("causal-router-2", "9303"),
        ("causal-router-3", "9304"),
        ("ledger-1", "9305"),
        ("worker-agent-wakeups-1", "9306"),
        ("worker-agent-wakeups-2", "9307"),
    ]
    assert members[1].argv == ("pump", "--feed", "http://127.0.0.1:9/feed")
    assert members[6].argv == ("worker", "--queue", "agent-wakeups", "--handler", "ok")


def test_a_queue_of_your_own_gets_its_workers(tmp_path: Path) -> None:
    s = _settings(
        tmp_path,
        queues={"payments": {"retries": 5}},
        fleet_workers={"payments": "ok", "indexing": "http://127.0.0.1:9/index"},
        fleet_worker_processes=2,
        fleet_dead_letter_consumer=False,
        fleet_analytics_rollup=False,
        fleet_operator_server=False,
    )
    workers = [m for m in plan(s) if m.argv[0] == "worker"]
    assert [(m.name, m.argv) for m in workers] == [
        ("worker-payments-1", ("worker", "--queue", "payments", "--handler", "ok")),
        ("worker-payments-2", ("worker", "--queue", "payments", "--handler", "ok")),
        ("worker-indexing-1", ("worker", "--queue", "indexing", "--http", "http://127.0.0.1:9/index")),
        ("worker-indexing-2", ("worker", "--queue", "indexing", "--http", "http://127.0.0.1:9/index")),
    ]  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        plan(_settings(tmp_path, fleet_workers={"payments": "ok"}))
    assert str(refused.value).startswith(
        "RHUMBATRON_FLEET_WORKERS: unknown queue 'payments'; known: agent-wakeups, "
    )
    assert "[queues.<name>]" in str(refused.value)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"fleet_subscriptions": {"projector": 1}}, "unknown subscription 'projector'"),
        ({"fleet_subscriptions": {"ledger": 33}}, "ledger=33: must be 0 to 32"),
        ({"fleet_subscriptions": {"ledger": -1}}, "ledger=-1: must be 0 to 32"),
        ({"fleet_workers": {"wakeups": "ok"}}, "unknown queue 'wakeups'"),
        ({"fleet_workers": {"integration": "nope"}}, "no handler of that name is installed"),
    ],
)
def test_a_wrong_plan_is_refused_naming_the_setting(
    tmp_path: Path, kw: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigurationError, match="RHUMBATRON_FLEET_") as caught:
        plan(_settings(tmp_path, partitions=4, **kw))
    assert says in str(caught.value)


def test_the_process_name_is_in_the_kafka_client_id(tmp_path: Path) -> None:
    assert _settings(tmp_path).kafka_config()["client.id"] == "rhumbatron-dev"
    named = _settings(tmp_path, process_name="causal-router-2")
    assert named.kafka_config()["client.id"] == "rhumbatron-dev-causal-router-2"


def test_restart_waits_double_up_to_their_cap() -> None:
    policy = RestartPolicy(backoff_s=1.0, backoff_max_s=5.0, max_restarts=9, window_s=60)
    assert [policy.wait_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


# -- the supervisor -------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeChild:
    """A started member: exits when the test says, or on SIGTERM unless it ignores it."""

    pids = iter(range(1000, 100_000))

    def __init__(self, member: Member, *, ignores_term: bool = False) -> None:
        self.member = member
        self.pid = next(self.pids)
        self.code: int | None = None
        self.signals: list[int] = []
        self.ignores_term = ignores_term

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM and not self.ignores_term:
            self.code = 0

    def kill(self) -> None:
        self.code = -9


class Spawner:
    def __init__(self, stubborn: set[str] | None = None) -> None:
        self.started: list[FakeChild] = []
        self.stubborn = stubborn or set()

    def __call__(self, member: Member) -> FakeChild:
        child = FakeChild(member, ignores_term=member.name in self.stubborn)
        self.started.append(child)
        return child

    def current(self, name: str) -> FakeChild:
        return [c for c in self.started if c.member.name == name][-1]


MEMBERS = [Member("publisher-1", ("publish",)), Member("ledger-1", ("consume",), {}, "ledger")]


def _supervisor(
    tmp_path: Path, spawner: Spawner, clock: Clock, **kw: object
) -> tuple[Supervisor, Path]:
    s = _settings(
        tmp_path,
        fleet_restart_backoff_s=1.0,
        fleet_restart_backoff_max_s=4.0,
        fleet_max_restarts=3,
        fleet_restart_window_s=100.0,
        fleet_stop_timeout_s=10.0,
        **kw,
    )
    path = status_path(s)
    sup = Supervisor(
        s, MEMBERS, spawn=spawner, clock=clock, wall=clock, sleep=clock.sleep, status_file=path
    )
    for slot in sup.slots:
        sup._start(slot)
    return sup, path


def _status(path: Path) -> FleetStatus:
    found = read_status(path)
    assert found is not None
    return found


def test_a_crashed_member_is_restarted_after_a_doubling_backoff(tmp_path: Path) -> None:
    spawner, clock = Spawner(), Clock()
    sup, path = _supervisor(tmp_path, spawner, clock)
    first = spawner.current("ledger-1")
    first.code = 1
    assert sup.step() is False
    assert _status(path).members[1].state == "backoff"
    assert _status(path).members[1].last_exit == 1
    clock.now = 0.9
    sup.step()
    assert spawner.current("ledger-1") is first  # not before its backoff (1 s)
    clock.now = 1.0
    sup.step()
    second = spawner.current("ledger-1")
    assert second is not first
    member = _status(path).members[1]
    assert (member.state, member.pid, member.restarts) == ("running", second.pid, 1)
    second.code = 1
    clock.now = 5.0
    sup.step()
    clock.now = 6.9
    sup.step()
    assert spawner.current("ledger-1") is second  # the second wait is 2 s
    clock.now = 7.0
    sup.step()
    assert spawner.current("ledger-1") is not second
    assert spawner.current("publisher-1").signals == []  # the others are left alone


def test_a_member_restarting_too_often_stops_the_fleet_with_exit_1(tmp_path: Path) -> None:
    spawner, clock = Spawner(), Clock()
    sup, path = _supervisor(tmp_path, spawner, clock)
    for _ in range(3):  # fleet_max_restarts
        spawner.current("ledger-1").code = 2
        sup.step()
        clock.now += 10
        sup.step()
    assert len([c for c in spawner.started if c.member.name == "ledger-1"]) == 4
    spawner.current("ledger-1").code = 2
    assert sup.step() is True  # given up on
    assert _status(path).state == "failed"
    assert _status(path).members[1].state == "failed"
    assert sup.stop_all() == []  # what run does next
    assert spawner.current("publisher-1").signals == [signal.SIGTERM]
    assert _status(path).state == "failed"


def test_a_member_whose_static_id_is_held_waits_it_out_without_counting(tmp_path: Path) -> None:
    """Exit 75 (InstanceIdHeld: KIP-848 keeps a killed static member's id until its session
    expires) is a wait of fleet_instance_held_wait_s, not a crash: far more of them than
    fleet_max_restarts do not give up; a crash after them counts as the first; held for longer
    than fleet_instance_held_max_s in a row, it is given up on."""
    spawner, clock = Spawner(), Clock()
    sup, path = _supervisor(
        tmp_path, spawner, clock, fleet_instance_held_wait_s=5.0, fleet_instance_held_max_s=60.0
    )
    for _ in range(8):  # fleet_max_restarts is 3
        spawner.current("ledger-1").code = InstanceIdHeld.EXIT_CODE
        assert sup.step() is False
        assert _status(path).members[1].state == "held"
        clock.now += 4.9
        before = spawner.current("ledger-1")
        sup.step()
        assert spawner.current("ledger-1") is before  # not before its wait
        clock.now += 0.1
        sup.step()
        assert spawner.current("ledger-1") is not before
    assert _status(path).members[1].state == "running"
    spawner.current("ledger-1").code = 1  # a crash: the first of fleet_max_restarts
    sup.step()
    assert _status(path).members[1].state == "backoff"
    clock.now += 1.0
    sup.step()
    for _ in range(13):  # 13 times 5 s: past fleet_instance_held_max_s (60 s) in a row
        spawner.current("ledger-1").code = InstanceIdHeld.EXIT_CODE
        assert sup.step() is False
        clock.now += 5.0
        sup.step()
    spawner.current("ledger-1").code = InstanceIdHeld.EXIT_CODE
    assert sup.step() is True
    assert _status(path).members[1].state == "failed"


def test_restarts_outside_the_window_do_not_count(tmp_path: Path) -> None:
    spawner, clock = Spawner(), Clock()
    sup, _ = _supervisor(tmp_path, spawner, clock)
    for _ in range(10):  # far more than fleet_max_restarts, each 200 s after the last
        spawner.current("ledger-1").code = 1
        assert sup.step() is False
        clock.now += 200
        sup.step()
    assert len([c for c in spawner.started if c.member.name == "ledger-1"]) == 11


def test_a_stop_terms_every_member_and_kills_only_those_past_the_timeout(tmp_path: Path) -> None:
    spawner, clock = Spawner(stubborn={"ledger-1"}), Clock()
    sup, path = _supervisor(tmp_path, spawner, clock)
    assert sup.stop_all() == ["ledger-1"]
    assert clock.now >= 10.0  # it waited fleet_stop_timeout_s
    ledger, publisher = spawner.current("ledger-1"), spawner.current("publisher-1")
    assert ledger.signals == [signal.SIGTERM] and ledger.code == -9
    assert publisher.signals == [signal.SIGTERM] and publisher.code == 0
    found = _status(path)
    assert found.state == "stopped"
    assert [(m.state, m.last_exit) for m in found.members] == [("stopped", 0), ("stopped", -9)]


def test_run_returns_0_after_a_stop_and_1_when_it_had_to_kill(tmp_path: Path) -> None:
    for stubborn, expected in ((set(), 0), ({"publisher-1"}, 1)):
        spawner, clock = Spawner(stubborn), Clock()
        s = _settings(tmp_path, fleet_stop_timeout_s=1.0)
        sup = Supervisor(s, MEMBERS, spawn=spawner, clock=clock, wall=clock, sleep=clock.sleep)
        stop = threading.Event()
        stop.set()
        assert sup.run(stop, interval_s=0) == expected
        assert len(spawner.started) == 2


def test_a_member_that_cannot_start_counts_as_a_crash(tmp_path: Path) -> None:
    calls = []

    def failing(member: Member) -> FakeChild:
        calls.append(member.name)
        raise OSError("no such file")

    s = _settings(tmp_path, fleet_max_restarts=1, fleet_restart_backoff_s=0.01)
    sup = Supervisor(s, MEMBERS[:1], spawn=failing)  # the real clock: backoffs of 10 ms
    stop = threading.Event()
    threading.Timer(5.0, stop.set).start()  # a guard: the fleet must give up by itself
    assert sup.run(stop, interval_s=0.001) == 1
    assert calls == ["publisher-1", "publisher-1"]
    assert sup.status.state == "failed"


def test_static_membership_names_each_group_member_of_the_fleet(tmp_path: Path) -> None:
    s = _settings(
        tmp_path,
        fleet_static_membership=True,
        fleet_instance_prefix="host-a",
        fleet_subscriptions={"ledger": 2},
        fleet_workers={"indexing": "ok"},
    )
    ids = {m.name: m.env.get("RHUMBATRON_GROUP_INSTANCE_ID") for m in plan(s, ["/o.sqlite"])}
    assert ids == {
        "publisher-1": None,
        "ledger-1": "host-a-ledger-1",
        "ledger-2": "host-a-ledger-2",
        "worker-indexing-1": "host-a-worker-indexing-1",
        "dead-letter-consumer": "host-a-dead-letter-consumer",
        "analytics-rollup": None,
        "operator-server": None,
    }
    assert all(
        v is None
        for v in (
            m.env.get("RHUMBATRON_GROUP_INSTANCE_ID")
            for m in plan(_settings(tmp_path, fleet_subscriptions={"ledger": 2}))
        )
    )


def test_a_group_instance_id_makes_the_consumer_a_static_member() -> None:
    from streams.kafka_config import client_config

    base = Settings(group_instance_id="host-a-ledger-1").kafka_config()
    static = client_config(base, "consumer", group_id="g", instance_id="host-a-ledger-1")
    assert static["group.instance.id"] == "host-a-ledger-1"
    assert "group.instance.id" not in client_config(base, "consumer", group_id="g")
    assert "group.instance.id" not in client_config(base, "reader")
