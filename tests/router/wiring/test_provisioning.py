"""What each runtime command needs on the broker is exactly what ``rhumbatron provision``
creates (the runtime creates nothing), and missing topics are named compactly."""

from __future__ import annotations

import pytest

from router.wiring.processors import check_subscription, subscription_slugs
from router.wiring.provisioning import (
    compact_names,
    environment_specs,
    pump_topics,
    subscription_topics,
    worker_topics,
)
from streams.errors import ConfigurationError
from streams.topology import QUEUE_PURPOSES
from tests.support.environment import make_settings


def test_the_plan_holds_every_topic_a_runtime_command_checks_for() -> None:
    topology = make_settings(env="dev").topology
    planned = [spec.name for spec in environment_specs(topology)]
    # streams, queues, internal topics (dead letters, metrics, audit), each queue's retry topic
    # and its tiers, the redelivery topics, the pump's checkpoints
    retry = 6 * (1 + len(make_settings().retry_tiers_s))
    assert len(planned) == len(set(planned)) == 8 + 6 + 3 + retry + 5 + 1
    needed = {
        *pump_topics(topology),
        *(
            name
            for slug in subscription_slugs(make_settings())
            for name in subscription_topics(topology, slug)
        ),
        *(name for purpose in QUEUE_PURPOSES for name in worker_topics(topology, purpose)),
        *worker_topics(topology, "dead-letter", streams=True),
    }
    assert needed == set(planned)  # nothing the runtime needs is left out, nothing is extra
    # 8 streams, 6 queues, 3 internal topics, its redelivery topic
    assert len(subscription_topics(topology, "ledger")) == 18


def test_a_queue_of_your_own_is_in_the_plan_with_its_retry_topics() -> None:
    s = make_settings(env="dev", queues={"payments": {}}, retry_tiers_s=[5, 60])
    planned = {spec.name: spec for spec in environment_specs(s.topology)}
    mine = [
        "rhumbatron-payments-dev",
        "rhumbatron-payments-retry-dev",
        "rhumbatron-payments-retry-5s-dev",
        "rhumbatron-payments-retry-60s-dev",
    ]
    assert all(planned[name].kind == "queue" for name in mine)
    assert {planned[name].partitions for name in mine} == {s.queue_partitions}
    assert len(planned) == len(environment_specs(make_settings(retry_tiers_s=[5, 60]).topology)) + 4
    # Its worker checks for the same topics, and every other worker may send to its queue.
    assert set(mine) <= set(worker_topics(s.topology, "payments"))
    assert "rhumbatron-payments-dev" in worker_topics(s.topology, "integration")


def test_a_test_processor_gets_its_redelivery_topic_in_the_plan() -> None:
    topology = make_settings(env="dev").topology
    names = [spec.name for spec in environment_specs(topology, ["kafka-counter"])]
    assert "rhumbatron_redelivery_kafka_counter_dev" in names


def test_missing_topics_are_named_with_runs_of_numbers_folded() -> None:
    topology = make_settings(env="t1a2").topology
    names = [*topology.stream_names(), *topology.queue_names()[:2], "rhumbatron_events_09_t1a2"]
    assert compact_names(names) == (
        "rhumbatron_events_00-07_t1a2, rhumbatron-agent-wakeups-t1a2, "
        "rhumbatron-integration-t1a2, rhumbatron_events_09_t1a2"
    )
    assert compact_names(["a_03_x", "a_04_x", "a_06_x", "b"]) == "a_03-04_x, a_06_x, b"
    assert compact_names([]) == ""


def test_an_unknown_subscription_is_refused_before_any_topic_is_looked_at() -> None:
    with pytest.raises(ConfigurationError, match="unknown subscription 'ledgr'; known: "):
        check_subscription(make_settings(), "ledgr")
