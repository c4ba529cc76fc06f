"""The runtime on the real broker and Redis, with subscription processes run as subprocesses."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

import orjson
import pytest

from consumers.redis_conn import connect
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from streams.envelopes import Event
from streams.headers import ATTEMPTS, SUBSCRIPTION
from streams.producer import Producer
from streams.workload import slotted_events, workload
from tests.support.kafka import read_all
from tests.support.runtime_processes import cli, publish, run, runtime_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def rs(settings: Settings) -> Settings:
    return runtime_settings(settings)


def _ledger(s: Settings) -> dict[str, Any]:
    return read_ledger(connect(s.redis_url, timeout=5), s.env)


def _drill(events: list[Event], index: int) -> Event:
    e = events[index]
    events[index] = e.model_copy(update={"payload": {**e.payload, "drill": "fail"}})
    return events[index]


def test_every_event_published_twice_has_one_effect(rs: Settings) -> None:
    events = slotted_events(workload("dup", 40, 400), tenant_id="t")
    cli(rs, "provision")
    publish(rs, events)
    publish(rs, events)
    stats = run(rs, "ledger")
    ledger = _ledger(rs)
    assert ledger["counts"] == {e.event_id: 1 for e in events}
    assert all(slots == list(range(1, 11)) for slots in ledger["projects"].values())
    assert stats["duplicates"] == 400 and stats["applied"] == 400


def test_one_poison_event_in_a_batch_of_ten_is_dead_lettered_after_exactly_five_attempts(
    rs: Settings,
) -> None:
    events = slotted_events(workload("poison", 1, 10), tenant_id="t")
    bad = _drill(events, 4)
    cli(rs, "provision")
    publish(rs, events)
    stats = run(rs, "ledger")
    letters = orjson.loads(cli(rs, "dead-letters", "list", "--json").stdout)
    assert len(letters) == 1
    letter = letters[0]
    assert (
        letter["attempts"] == 5
        and letter["events"] == [bad.event_id]
        and letter["kind"] == "event-batch"
    )
    assert "DrillFailure" in letter["error_type"] and letter["subscription"] == "ledger"
    assert stats["failures"] == 5 and stats["dead_lettered"] == 1
    ledger = _ledger(rs)
    assert ledger["counts"] == {e.event_id: 1 for e in events if e is not bad}
    assert ledger["projects"] == {events[0].project_id: [1, 2, 3, 4, 6, 7, 8, 9, 10]}
    shown = orjson.loads(cli(rs, "dead-letters", "show", letter["id"]).stdout)
    assert shown["entries"][0]["event_id"] == bad.event_id
    # The durable record: the original bytes on the dead-letter topic, with the letter's headers.
    (record,) = read_all(
        rs.kafka_bootstrap, [f"rhumbatron_dead_letters_{rs.env}"], expect=1, timeout=20
    )
    headers = dict(record.headers() or [])
    assert orjson.loads(record.value() or b"")["eventId"] == bad.event_id
    assert headers[ATTEMPTS] == b"5" and headers[SUBSCRIPTION] == b"ledger"


def test_garbage_bytes_are_dead_lettered_and_the_partition_keeps_moving(rs: Settings) -> None:
    events = slotted_events(workload("garbage", 1, 6), tenant_id="t")
    project = events[0].project_id
    cli(rs, "provision")
    publish(rs, events[:3])
    producer = Producer(rs.kafka_config())
    topic = rs.topology.stream_for(project)
    for raw in (b"\x00\x01\x02", b"{not json", b'{"eventId": 3}'):
        producer.produce(topic, raw, key=project)  # same key: same partition as the project
    producer.flush(30)
    publish(rs, events[3:])
    stats = run(rs, "ledger")
    assert _ledger(rs)["projects"] == {project: [1, 2, 3, 4, 5, 6]}
    letters = orjson.loads(cli(rs, "dead-letters", "list", "--json").stdout)
    assert sorted(letter["kind"] for letter in letters) == ["poison"] * 3
    assert stats["poison"] == 3 and stats["failures"] == 0


def test_dead_letter_retry_applies_the_event_once(rs: Settings) -> None:
    events = slotted_events(workload("retry", 1, 5), tenant_id="t")
    bad = _drill(events, 2)
    cli(rs, "provision")
    publish(rs, events)
    run(rs, "flaky-ledger", RHUMBATRON_TEST_DRILL_FAILS="1")
    (letter,) = orjson.loads(cli(rs, "dead-letters", "list", "--json").stdout)
    assert _ledger_counts(rs, "flaky-ledger").get(bad.event_id) is None
    cli(rs, "dead-letters", "retry", letter["id"], "--who", "oncall", "--reason", "cause fixed")
    second = cli(rs, "dead-letters", "retry", letter["id"], check=False)
    assert second.returncode != 0 and "already handled" in second.stderr
    stats = run(rs, "flaky-ledger")
    assert stats["redelivered"] == 1
    assert _ledger_counts(rs, "flaky-ledger") == {e.event_id: 1 for e in events}
    shown = orjson.loads(cli(rs, "dead-letters", "show", letter["id"]).stdout)
    assert shown["status"] == "retried" and shown["audit"][0]["who"] == "oncall"


def _ledger_counts(s: Settings, slug: str) -> dict[str, int]:
    client = connect(s.redis_url, timeout=5)
    counts: Tally[str] = Tally()
    for key in client.scan_iter(match=f"rh:{s.env}:{{{slug}|*:x:ledger:counts"):
        for event_id, n in client.hgetall(key).items():
            counts[event_id.decode()] += int(n)
    return dict(counts)


def test_kafka_effects_are_exactly_once_for_read_committed_readers(rs: Settings) -> None:
    events = slotted_events(workload("kfx", 20, 200), tenant_id="t")
    cli(rs, "provision")
    from confluent_kafka.admin import NewTopic

    from streams.admin import admin_client

    admin = admin_client(rs.kafka_config())
    for f in admin.create_topics([NewTopic(f"out_{rs.env}", 2, 1)]).values():
        f.result()
    publish(rs, events)
    publish(rs, events[:50])
    stats = run(rs, "kafka-counter")
    out = read_all(rs.kafka_bootstrap, [f"out_{rs.env}"], expect=200, timeout=30)
    bodies = [orjson.loads(m.value() or b"") for m in out]
    assert Tally(b["event"] for b in bodies) == {e.event_id: 1 for e in events}
    assert stats["transactions"] >= 1
    last_count = {
        b["project"]: max(x["count"] for x in bodies if x["project"] == b["project"])
        for b in bodies
    }
    assert set(last_count.values()) == {10}  # the fold counted every event once


def test_subscription_controls_from_the_cli(rs: Settings) -> None:
    events = slotted_events(workload("ctl", 1, 4), tenant_id="t")
    cli(rs, "provision")
    publish(rs, events)
    run(rs, "ledger")
    topic = rs.topology.stream_for(events[0].project_id)
    progress = orjson.loads(cli(rs, "subscription", "progress", "--subscription", "ledger").stdout)
    partition = next(
        int(k.split("[")[1][:-1])
        for k, v in progress.items()
        if k.startswith(topic) and int(v["acked_through"]) >= 0
    )
    refused = cli(
        rs,
        "subscription",
        "reprocess-from",
        "--subscription",
        "ledger",
        "--topic",
        topic,
        "--partition",
        str(partition),
        "--offset",
        "2",
        "--expected-revision",
        "5",
        "--reason",
        "x",
        check=False,
    )
    assert refused.returncode == 2 and "revision 0, not 5" in refused.stderr
    cli(
        rs,
        "subscription",
        "reprocess-from",
        "--subscription",
        "ledger",
        "--topic",
        topic,
        "--partition",
        str(partition),
        "--offset",
        "2",
        "--expected-revision",
        "0",
        "--reason",
        "rebuild view",
    )
    run(rs, "ledger")
    ledger = _ledger(rs)
    assert ledger["projects"] == {
        events[0].project_id: [1, 2, 3, 4, 3, 4]
    }  # offsets 2 and 3 re-ran
