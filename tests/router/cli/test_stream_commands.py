"""``rhumbatron status`` on the real broker and Redis: each group's lag over the topics it reads."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from router.operator.service import OperatorService
from router.settings import Settings
from streams.producer import Producer
from streams.topology import dead_letter_topic, group_id, queue_name, redelivery_topic
from streams.workload import slotted_events, workload
from tests.support.environment import cleanup_environment, make_settings
from tests.support.runtime_processes import cli, consume_cli, publish, runtime_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def s() -> Iterator[Settings]:
    settings = runtime_settings(make_settings())
    yield settings
    cleanup_environment(settings)


def test_a_caught_up_subscription_lags_zero_and_only_on_the_topics_it_reads(s: Settings) -> None:
    cli(s, "provision")
    events = slotted_events(workload("caught-up", 3, 12), tenant_id="t")
    publish(s, events)
    # Records on topics the ledger never reads: the dead-letter topic and a command queue.
    producer = Producer(s.kafka_config())
    for topic in (dead_letter_topic(s.env), queue_name("integration", s.env)):
        producer.produce(topic, b"{}", key="elsewhere")
    producer.flush(30)
    done = consume_cli(s, "ledger", until_idle=3)
    assert done.returncode == 0, done.stderr[-3000:]
    reads = {*s.topology.stream_names(), redelivery_topic("ledger", s.env)}

    group = orjson.loads(cli(s, "status", "--json").stdout)["groups"][group_id("ledger", s.env)]
    outside = {(p["topic"], p["partition"]): p["lag"] for p in group["partitions"]}
    outside = {tp: lag for tp, lag in outside.items() if tp[0] not in reads}
    assert (outside, group["total_lag"]) == ({}, 0)

    (ledger,) = [g for g in OperatorService(s).lag().subscriptions if g.subscription == "ledger"]
    assert {p.topic for p in ledger.partitions} <= reads
    assert ledger.total_lag == 0
    assert sum(p.end for p in ledger.partitions) == len(events)  # all it read
