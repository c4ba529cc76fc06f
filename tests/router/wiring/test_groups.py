"""Which topics each consumer group reads: the set its lag is computed over."""

from __future__ import annotations

from router.wiring.analytics import rollup_app_id
from router.wiring.groups import group_reads
from router.wiring.workers import DEAD_LETTER_QUEUE, worker_policy, worker_slug
from streams.topology import dead_letter_topic, group_id, metrics_topic, redelivery_topic
from tests.support.environment import make_settings


def test_a_subscription_reads_the_streams_and_its_own_redelivery_topic() -> None:
    s = make_settings(streams=2)
    reads = group_reads(s.topology, group_id("ledger", s.env))
    assert reads.kind == "subscription" and reads.name == "ledger"
    assert reads.subscribed == tuple(s.topology.stream_names())
    assert reads.assigned == (redelivery_topic("ledger", s.env),)
    assert dead_letter_topic(s.env) not in (*reads.subscribed, *reads.assigned)


def test_a_worker_and_the_dead_letter_consumer_read_their_queue_and_retry_topics() -> None:
    s = make_settings()
    for purpose in ("integration", DEAD_LETTER_QUEUE):
        policy = worker_policy(s, purpose)
        reads = group_reads(s.topology, group_id(worker_slug(purpose), s.env))
        assert reads.kind == "command-worker"
        assert reads.subscribed == (policy.queue_topic, *policy.retry_topics)  # what it subscribes
        assert len(policy.retry_topics) == 1 + len(s.retry_tiers_s)
        assert reads.assigned == ()


def test_the_worker_of_a_queue_of_your_own_reads_its_queue_and_retry_topics() -> None:
    s = make_settings(queues={"payments": {"retries": 5}})
    reads = group_reads(s.topology, f"rhumbatron-worker-payments-{s.env}")
    assert (reads.kind, reads.name) == ("command-worker", "worker-payments")
    assert reads.subscribed == (
        f"rhumbatron-payments-{s.env}",
        f"rhumbatron-payments-retry-{s.env}",
        *(f"rhumbatron-payments-retry-{t}s-{s.env}" for t in s.retry_tiers_s),
    )
    # Without the queue in the settings, no worker of the environment has that group.
    assert group_reads(make_settings(env=s.env).topology, reads.group).kind != "command-worker"


def test_a_group_no_wiring_builds_is_shown_only_where_it_committed() -> None:
    s = make_settings()
    reads = group_reads(s.topology, f"rhumbatron-Not_A_Slug-{s.env}")
    assert reads.kind == "other" and reads.subscribed == ()
    assert set(s.topology.stream_names()) <= set(reads.assigned)


def test_the_rollup_reads_the_metric_points_only() -> None:
    # Its group is faust's app id; read as a subscription it would lag by the whole streams.
    s = make_settings()
    reads = group_reads(s.topology, rollup_app_id(s))
    assert reads.kind == "rollup" and reads.name == "analytics-rollup"
    assert reads.subscribed == (metrics_topic(s.env),) and reads.assigned == ()
