"""Kafka failover on a private 3-node cluster (infra/local.sh cluster-up, through
PrivateServices): a broker killed with SIGKILL, no controlled shutdown.

- The leader of the busiest stream partition is killed while the fleet's publisher and two ledger
  members run. They carry on against the two survivors, with no member restarted: every event's
  effect once and in order per project, nothing pending, and the group's lag back at 0. The
  killed broker started again changes nothing.
- A process asking its group's lag (as consume, worker and serve do while they run) outlives the
  group coordinator's broker killed mid-run: consumers.lag does not use librdkafka's admin
  ListConsumerGroupOffsets, whose coordinator request aborts the process when the coordinator's
  connection drops (confluentinc/librdkafka#4605).

What the first rests on: the streams and the internal topics (offsets, transaction state) have
three replicas and min.insync.replicas 2 (infra/local.sh's cluster properties, replication_factor
3 here), and the producers write with acks=all and idempotence (streams/kafka_config.py), so a
record the old leader acknowledged is on a survivor that can take over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from consumers.lag import group_lag
from router.fleet import read_status, status_path
from router.settings import Settings
from router.wiring.groups import group_reads
from router.wiring.provisioning import provision_environment
from streams.admin import admin_client, describe_configs
from streams.kafka_config import client_config
from streams.outbox.store import RowState
from streams.topology import group_id
from streams.workload import workload, write_workload
from tests.support.environment import ROOT, cleanup_environment, make_settings, subprocess_env
from tests.support.infra import PrivateServices
from tests.support.ledger_oracle import applied, assert_applied_once_in_order
from tests.support.outbox import outbox_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]

NODES = (1, 2, 3)
PROJECTS, EVENTS = 12, 2400
MEMBERS = {"publisher-1", "ledger-1", "ledger-2"}
SAMPLE_S = 0.25  # how often the published and applied counts are read to find the pauses
LAG_TIMEOUT_S = 5.0  # each lag request's bound in the probe: several answers per outage
PROBE_S = 40.0  # the probe's run: the kill 3 s in, the coordinator moved well before its end


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateServices]:
    with PrivateServices(redis=False, cluster=True) as services:
        yield services


@pytest.fixture
def whole(cluster: PrivateServices) -> Iterator[PrivateServices]:
    """The cluster; afterwards every node running again, whatever the test killed."""
    yield cluster
    for node in NODES:
        cluster.kafka_start(str(node))


def _settings(cluster: PrivateServices, **kw: Any) -> Settings:
    return make_settings(kafka_bootstrap=cluster.cluster_bootstrap, replication_factor=3, **kw)


@pytest.fixture
def fleet_settings(whole: PrivateServices) -> Iterator[Settings]:
    s = _settings(
        whole,
        fleet_subscriptions={
            "project-view-projector": 0,
            "causal-router": 0,
            "audit-archiver": 0,
            "analytics-projector": 0,
            "ledger": 2,
        },
        fleet_dead_letter_consumer=False,
        fleet_analytics_rollup=False,
        fleet_operator_server=False,
        fleet_restart_backoff_s=0.2,
        fleet_stop_timeout_s=60.0,
        session_timeout_ms=6000,
        batch_size=50,
        batch_size_behind=50,
    )
    provision_environment(s)
    yield s
    cleanup_environment(s)


def _survivors(cluster: PrivateServices, s: Settings, victim: int) -> AdminClient:
    """An admin client that bootstraps from the nodes still running only."""
    others = ",".join(f"127.0.0.1:{cluster.kafka_port + n - 1}" for n in NODES if n != victim)
    return admin_client({**s.kafka_config(), "bootstrap.servers": others})


def _members(s: Settings) -> dict[str, Any]:
    found = read_status(status_path(s))
    return {m.name: m for m in found.members} if found else {}


def _coordinator(admin: AdminClient, group: str) -> int:
    return int(admin.describe_consumer_groups([group])[group].result().coordinator.id)


def _both_assigned(admin: AdminClient, group: str) -> bool:
    """Both ledger members in the group, each with partitions: the first rebalance is over.
    Asked only while every broker runs (librdkafka#4605: see consumers.lag)."""
    try:
        described = admin.describe_consumer_groups([group])[group].result()
    except KafkaException:  # the group's coordinator still loading it (NOT_COORDINATOR)
        return False
    return len(described.members) == 2 and all(
        m.assignment.topic_partitions for m in described.members
    )


def _lag(admin: AdminClient, s: Settings, group: str) -> int:
    reads = group_reads(s.topology, group)
    return sum(p.lag for p in group_lag(admin, s.kafka_config(), reads, s.connect_timeout_s))


def _busiest(admin: AdminClient, s: Settings) -> tuple[TopicPartition, int]:
    """The stream partition holding the most records, and how many."""
    request = {
        TopicPartition(t, p): OffsetSpec.latest()
        for t in s.topology.stream_names()
        for p in range(s.partitions)
    }
    ends = {
        tp: future.result().offset
        for tp, future in admin.list_offsets(request, request_timeout=10).items()
    }
    tp = max(ends, key=lambda k: ends[k])
    return tp, ends[tp]


def _leader(admin: AdminClient, tp: TopicPartition) -> int:
    """The partition's leader's node id, -1 while it has none (or the metadata does not come)."""
    try:
        topic = admin.list_topics(tp.topic, timeout=2).topics[tp.topic]
    except Exception:  # a metadata request to the dead node times out: ask again
        return -1
    return int(topic.partitions[tp.partition].leader)


def _longest_pause(samples: list[tuple[float, int]], since: float, total: int) -> float:
    """The longest time, after ``since``, a sampled count stood still short of ``total``."""
    longest, last_change = 0.0, since
    previous = None
    for at, count in samples:
        if at < since:
            previous = count
            continue
        if count != previous:
            longest = max(longest, at - last_change)
            last_change, previous = at, count
        if count >= total:
            break
    return longest


def test_killing_a_busy_partitions_leader_loses_nothing_and_duplicates_no_effect(
    whole: PrivateServices, fleet_settings: Settings, tmp_path: Path
) -> None:
    cluster, s = whole, fleet_settings
    started = time.monotonic()
    admin = admin_client(s.kafka_config())
    streams = s.topology.stream_names()
    group = group_id("ledger", s.env)
    metadata = admin.list_topics(timeout=10).topics
    replicas = {len(p.replicas) for t in streams for p in metadata[t].partitions.values()}
    assert replicas == {3}, f"the streams' replica counts: {replicas}"
    configs = describe_configs(admin, s.kafka_config(), streams, 30)
    assert {c["min.insync.replicas"] for c in configs.values()} == {"2"}

    outbox = tmp_path / "outbox.db"
    drafts = workload("failover", PROJECTS, EVENTS)
    write_workload(outbox_for(s, outbox), drafts[: EVENTS // 2], writers=2, events_per_write=5)
    log = tmp_path / "fleet.log"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "fleet", "--outbox", str(outbox)],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    published: list[tuple[float, int]] = []
    samples: list[tuple[float, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        store = outbox_for(s, outbox)  # a connection of this thread's own
        try:
            while not sampling.is_set():
                published.append((time.monotonic(), store.counts().get(RowState.PUBLISHED, 0)))
                samples.append((time.monotonic(), applied(s)))
                time.sleep(SAMPLE_S)
        finally:
            store.close()

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        wait_until(
            lambda: (
                set(_members(s)) == MEMBERS
                and all(m.state == "running" for m in _members(s).values())
            ),
            120,
            "every member running",
        )
        sampler.start()
        wait_until(lambda: _both_assigned(admin, group), 120, "both ledger members assigned")
        wait_until(lambda: applied(s) >= EVENTS // 8, 120, "the ledger applying")
        offsets = admin.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
        assert {len(p.replicas) for p in offsets.partitions.values()} == {3}

        tp, records = _busiest(admin, s)
        victim = _leader(admin, tp)
        assert victim in NODES, f"{tp.topic}[{tp.partition}] has no leader"
        coordinator = _coordinator(admin, group)
        killed_at = time.monotonic()
        cluster.kafka_kill(str(victim))
        # The second half is written while the leader is down: the publisher carries on.
        write_workload(outbox_for(s, outbox), drafts[EVENTS // 2 :], writers=2, events_per_write=5)
        survivors = _survivors(cluster, s, victim)
        wait_until(lambda: _leader(survivors, tp) not in (-1, victim), 120, "a new leader elected")
        elected_s = time.monotonic() - killed_at

        wait_until(lambda: applied(s) >= EVENTS, 300, "every event applied")
        applied_s = time.monotonic() - killed_at
        sampling.set()
        sampler.join()
        pause_s = _longest_pause(samples, killed_at, EVENTS)
        publish_pause_s = _longest_pause(published, killed_at, EVENTS)
        wait_until(lambda: _lag(survivors, s, group) == 0, 180, "the ledger's group at lag 0")
        assert_applied_once_in_order(s, drafts)
        assert {n: m.restarts for n, m in _members(s).items()} == dict.fromkeys(MEMBERS, 0), (
            log.read_text()[-5000:]
        )

        cluster.kafka_start(str(victim))
        wait_until(
            lambda: all(
                victim in p.isrs
                for t in admin.list_topics(timeout=10).topics.values()
                if t.topic in streams
                for p in t.partitions.values()
            ),
            120,
            f"node {victim} back in every stream partition's in-sync replicas",
        )
        assert _lag(admin, s, group) == 0
        assert_applied_once_in_order(s, drafts)
        assert {n: m.restarts for n, m in _members(s).items()} == dict.fromkeys(MEMBERS, 0)
    finally:
        sampling.set()
        fleet.send_signal(signal.SIGTERM)
        code = fleet.wait(timeout=120)
    assert code == 0, log.read_text()[-5000:]
    print(
        f"\nkilled node {victim}, leader of {tp.topic}[{tp.partition}] ({records} records)"
        f"{', the group coordinator' if victim == coordinator else ''}: new leader in "
        f"{elected_s:.1f} s; every event applied {applied_s:.1f} s after the kill; longest pause "
        f"in applying {pause_s:.1f} s, in publishing {publish_pause_s:.1f} s; whole run {time.monotonic() - started:.1f} s"
    )


# Asks the group's lag through consumers.lag every 0.2 s for argv[2] seconds, as a running
# command's progress line does; prints each answer's (wall time, answered) as JSON.
PROBE = """
import json, sys, time
from consumers.lag import group_lag
from router.settings import Settings
from router.wiring.groups import group_reads
from streams.admin import admin_client

s = Settings()
base = s.kafka_config()
admin = admin_client(base)
reads = group_reads(s.topology, sys.argv[1])
until = time.monotonic() + float(sys.argv[2])
answers = []
while time.monotonic() < until:
    try:
        group_lag(admin, base, reads, float(sys.argv[3]))
        answers.append((time.time(), True))
    except Exception:
        answers.append((time.time(), False))
    time.sleep(0.2)
print(json.dumps(answers))
"""


@pytest.fixture
def lag_settings(whole: PrivateServices) -> Iterator[Settings]:
    s = _settings(whole)
    provision_environment(s)
    yield s
    cleanup_environment(s)


def test_a_lag_probe_outlives_its_group_coordinators_broker_killed(
    whole: PrivateServices, lag_settings: Settings
) -> None:
    cluster, s = whole, lag_settings
    group = group_id("ledger", s.env)
    committer = Consumer(client_config(s.kafka_config(), "consumer", group_id=group))
    committer.commit(
        offsets=[
            TopicPartition(t, p, 0) for t in s.topology.stream_names() for p in range(s.partitions)
        ],
        asynchronous=False,
    )
    committer.close()
    admin = admin_client(s.kafka_config())
    victim = _coordinator(admin, group)
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, group, str(PROBE_S), str(LAG_TIMEOUT_S)],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    killed_at = time.time()
    cluster.kafka_kill(str(victim))
    out, err = probe.communicate(timeout=PROBE_S + 60)
    assert probe.returncode == 0, f"the lag probe exited {probe.returncode}:\n{err[-3000:]}"
    answers: list[tuple[float, bool]] = json.loads(out)
    assert any(ok for at, ok in answers if at < killed_at), answers
    after = [(at, ok) for at, ok in answers if at > killed_at]
    failed = next((at for at, ok in after if not ok), killed_at)
    again = [at for at, ok in after if ok and at >= failed]
    assert again, f"no lag answered after the coordinator's broker was killed: {answers}"
    print(
        f"\nlag probe: {sum(not ok for _, ok in after)} of {len(after)} asks failed after the "
        f"coordinator (node {victim}) was killed; answered again {again[0] - killed_at:.1f} s "
        "after the kill"
    )
