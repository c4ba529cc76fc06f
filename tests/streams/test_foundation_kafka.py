"""The foundation against the real broker and Redis started by infra/local.sh."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import orjson
import pytest
from confluent_kafka.admin import NewTopic

from router.settings import Settings
from streams.admin import (
    admin_client,
    describe_configs,
    describe_topology,
    ensure_topics,
    provision,
)
from streams.errors import DeliveryFailed, TopologyError
from streams.producer import Producer, send_to_streams
from streams.topology import TopicSpec
from streams.workload import project_ids, slotted_events, workload
from tests.support.environment import make_settings
from tests.support.kafka import murmur2_partition, read_all

pytestmark = pytest.mark.integration


def _provision(s: Settings):
    base = s.kafka_config()
    return provision(
        admin_client(base), base, s.topology.all_specs(), topology=s.topology, timeout=20
    )


def test_provisioning_twice_is_a_no_op(settings: Settings) -> None:
    first = _provision(settings)
    # streams, queues, dead letters, metric points and the audit topic
    assert len(first.created) == 8 + 6 + 3
    base = settings.kafka_config()
    before = describe_topology(admin_client(base), base, settings.topology, 10)
    second = _provision(settings)
    assert second.created == [] and second.reconfigured == [] and second.warnings == []
    assert sorted(second.existing) == sorted(first.created)
    assert describe_topology(admin_client(base), base, settings.topology, 10) == before
    assert [s["retention_ms"] for s in before["streams"]] == [604_800_000] * 8
    assert [q["retention_ms"] for q in before["queues"]] == [86_400_000] * 6
    assert {s["partitions"] for s in before["streams"]} == {settings.partitions}


def test_provisioning_restores_drifted_retention(settings: Settings) -> None:
    _provision(settings)
    base = settings.kafka_config()
    admin = admin_client(base)
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    name = settings.topology.stream_names()[3]
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        name,
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for f in admin.incremental_alter_configs([resource]).values():
        f.result()

    # Config changes reach the broker's metadata cache asynchronously; wait until it shows.
    deadline = time.monotonic() + 30
    while describe_configs(admin, base, [name], 10)[name]["retention.ms"] != "1000":
        assert time.monotonic() < deadline, "the altered retention never showed"
        time.sleep(0.1)
    report = _provision(settings)
    assert report.reconfigured == [name]
    streams = describe_topology(admin, base, settings.topology, 10)["streams"]
    assert streams[3]["retention_ms"] == 604_800_000


def test_ensure_topics_creates_what_is_missing_serves_it_and_changes_nothing_that_exists(
    settings: Settings,
) -> None:
    base = settings.kafka_config()
    admin = admin_client(base)
    present, absent = (f"rhumbatron-ensure-{n}-{settings.env}" for n in ("present", "absent"))
    for f in admin.create_topics(
        [NewTopic(present, 1, 1, config={"retention.ms": "1000"})]
    ).values():
        f.result()
    specs = [
        TopicSpec(present, 3, 1, {"retention.ms": "60000"}, kind="internal"),
        TopicSpec(absent, 3, 1, {"cleanup.policy": "compact,delete", "retention.ms": "60000"}),
    ]
    assert ensure_topics(admin, base, specs, timeout=30) == [absent]
    # Served on return: every partition has a leader and answers a produce at once.
    topics = admin.list_topics(timeout=10).topics
    assert len(topics[absent].partitions) == 3
    assert all(p.leader >= 0 for p in topics[absent].partitions.values())
    producer = Producer(base)
    for partition in range(3):
        producer.produce(absent, b"v", key="k", partition=partition)
    producer.flush(10)  # raises DeliveryFailed naming any record the broker refused
    # What existed is left as it was: its partitions and its configuration.
    assert len(topics[present].partitions) == 1
    configs = describe_configs(admin, base, [present, absent], 10)
    assert configs[present]["retention.ms"] == "1000"
    assert configs[absent]["cleanup.policy"] == "compact,delete"
    assert ensure_topics(admin, base, specs, timeout=30) == []


def test_provisioning_refuses_a_plan_over_the_stream_limit(settings: Settings) -> None:
    base = settings.kafka_config()
    admin = admin_client(base)
    extra = [NewTopic(f"rhumbatron_events_{i:02d}_{settings.env}", 1, 1) for i in range(8, 21)]
    for f in admin.create_topics(extra).values():
        f.result()
    # A created topic shows in metadata a moment later on a loaded broker; provisioning can only
    # count what metadata shows, so wait until it shows all of them.
    names = {t.topic for t in extra}
    deadline = time.monotonic() + 30
    while not names <= set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "created topics never showed in metadata"
        time.sleep(0.2)
    with pytest.raises(TopologyError, match="21 streams .* over the limit of 20"):
        _provision(settings)
    existing = admin.list_topics(timeout=10).topics
    assert f"rhumbatron_events_00_{settings.env}" not in existing  # nothing was created


def test_ten_thousand_events_round_trip_on_their_hashed_streams_in_slot_order(
    settings: Settings,
) -> None:
    _provision(settings)
    events = slotted_events(workload("rt", 200, 10_000), tenant_id="tenant-1")
    counts = send_to_streams(
        Producer(settings.kafka_config()),
        events,
        stream_for=settings.topology.stream_for,
        max_bytes=settings.max_envelope_bytes,
        flush_timeout=60,
    )
    assert sum(counts.values()) == 10_000
    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=10_000)
    assert len(messages) == 10_000
    slots: dict[str, list[int]] = defaultdict(list)
    for message in messages:
        value = orjson.loads(message.value() or b"")
        project = value["projectId"]
        assert message.key() == project.encode()
        assert message.topic() == settings.topology.stream_for(project)
        assert message.partition() == murmur2_partition(project, settings.partitions)
        headers = dict(message.headers() or [])
        assert headers["event_id"] == value["eventId"].encode()
        assert headers["event_type"] == value["eventType"].encode()
        assert headers["content_type"] == b"application/json"
        slots[project].append(value["slot"])
    assert set(slots) == set(project_ids("rt", 200))
    for project, seen in slots.items():
        assert seen == list(range(1, 51)), project


def test_a_record_the_broker_refuses_is_reported_not_dropped(settings: Settings) -> None:
    base = settings.kafka_config()
    admin = admin_client(base)
    topic = f"small_{settings.env}"
    for f in admin.create_topics(
        [NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})]
    ).values():
        f.result()
    producer = Producer(base, extra={"compression.type": "none"})
    producer.produce(topic, b"x" * 5000, key="p1")  # over the topic's limit: the broker refuses
    with pytest.raises(DeliveryFailed) as info:
        producer.flush(30)
    assert [f.key for f in info.value.failures] == ["p1"]
    assert "MSG_SIZE_TOO_LARGE" in info.value.failures[0].error
    producer.produce(topic, b"{}", key="p2")  # the producer stays usable after a refused record
    producer.flush(30)
    # Over the client's own limit: refused at once, synchronously.
    with pytest.raises(DeliveryFailed, match="too large"):
        producer.produce(topic, b"x" * (2 * 1024 * 1024), key="p3")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _env_for(s: Settings, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(
        RHUMBATRON_ENV=s.env,
        RHUMBATRON_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        RHUMBATRON_REDIS_URL=s.redis_url,
        RHUMBATRON_PARTITIONS=str(s.partitions),
        RHUMBATRON_QUEUE_PARTITIONS=str(s.queue_partitions),
    )
    env.update(extra)
    return env


def test_cli_provision_topology_produce_status(settings: Settings) -> None:
    env = _env_for(settings)
    assert _cli("provision", env=env).returncode == 0
    out = _cli("topology", "--json", env=env)
    assert out.returncode == 0, out.stderr
    topo = orjson.loads(out.stdout)
    assert [s["name"] for s in topo["streams"]] == settings.topology.stream_names()
    assert all(
        set(s) == {"name", "partitions", "retention_ms"} for s in topo["streams"] + topo["queues"]
    )
    assert [q["name"] for q in topo["queues"]] == settings.topology.queue_names()
    produced = _cli("produce", "--projects", "5", "--events", "40", "--json", env=env)
    assert produced.returncode == 0, produced.stderr
    assert orjson.loads(produced.stdout)["events"] == 40
    status = _cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert "topics" in orjson.loads(status.stdout)


def _one_line_error(stderr: str) -> str:
    """What main() promises for our errors: exactly one line, ``rhumbatron: …``, no traceback."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rhumbatron: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    ("command", "override", "address"),
    [
        (
            ("status", "--json"),
            {"RHUMBATRON_KAFKA_BOOTSTRAP": "127.0.0.1:9"},
            "Kafka at 127.0.0.1:9",
        ),
        (
            ("status", "--json"),
            {"RHUMBATRON_REDIS_URL": "redis://127.0.0.1:9/0"},
            "Redis at 127.0.0.1:9",
        ),
        (("provision",), {"RHUMBATRON_KAFKA_BOOTSTRAP": "127.0.0.1:9"}, "Kafka at 127.0.0.1:9"),
        (
            ("dead-letters", "list"),
            {"RHUMBATRON_REDIS_URL": "redis://127.0.0.1:9/0"},
            "Redis at 127.0.0.1:9",
        ),
    ],
)
def test_unreachable_servers_are_named_and_the_command_exits_nonzero(
    command: tuple[str, ...], override: dict[str, str], address: str
) -> None:
    s = make_settings()
    env = _env_for(s, RHUMBATRON_CONNECT_TIMEOUT_S="3", **override)
    result = _cli(*command, env=env)  # _cli's subprocess timeout bounds it: no hang
    assert result.returncode != 0
    line = _one_line_error(result.stderr)
    assert address in line and "unreachable" in line


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("RHUMBATRON_PARTITIONS", "abc", "valid integer"),
        ("RHUMBATRON_CONNECT_TIMEOUT_S", "-1", "greater than 0"),
        ("RHUMBATRON_WORKER_SLOT_TTL_S", "soon", "valid integer"),  # an old name, still read
    ],
)
def test_a_wrong_setting_is_one_line_naming_the_variable(
    variable: str, value: str, problem: str
) -> None:
    env = _env_for(make_settings(), **{variable: value})
    result = _cli("topology", env=env)
    assert result.returncode != 0
    line = _one_line_error(result.stderr)
    assert f"{variable}={value!r}" in line and problem in line
