"""The names state lives under, pinned: topic names, consumer-group names, transactional ids and
Redis keys. Running processes and stored state use them, so a change here strands state written
before it (a view, claims, a producer lease) or breaks fencing between an old process and a new
one. Written out literally on purpose: if one of these fails, the change must come with a
migration, not a new expected value."""

from __future__ import annotations

import redis

from consumers.runtime.audit_records import MemoryAudit
from consumers.runtime.controls import RedisAuditLog
from consumers.runtime.dead_letters import KafkaRedisDeadLetters
from consumers.runtime.producer_lease import ProducerLease
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.state_rebuild import lock_key, marker_key
from consumers.runtime.types import TP
from consumers.subscriptions.causal_router.budget import RedisCommandBudget, RedisDailyCounter
from consumers.subscriptions.causal_router.maintenance import MaintenanceTick
from router.wiring.analytics import rollup_app_id
from router.wiring.workers import worker_slug
from router.workers.helpers import RedisIndexStates, RedisWorkflowRegistry
from router.workers.stores import RedisCommandLedger, RedisWorkerMetrics
from streams.clock import ManualClock
from streams.producer import Producer
from streams.pump.kafka import feed_key, pump_transactional_id
from streams.topology import (
    QUEUE_PURPOSES,
    audit_topic,
    dead_letter_topic,
    group_id,
    metrics_topic,
    pump_checkpoint_topic,
    queue_name,
    redelivery_topic,
    retry_topic,
    stream_name,
    transactional_id,
)
from tests.support.environment import make_settings

ENV = "pin"


def _client() -> redis.Redis[bytes]:
    # Never connected: the objects below only compute their key names.
    return redis.Redis(host="127.0.0.1", port=1)


def test_topic_names() -> None:
    assert [stream_name(i, ENV) for i in (0, 7)] == [
        "rhumbatron_events_00_pin",
        "rhumbatron_events_07_pin",
    ]
    assert [queue_name(p, ENV) for p in QUEUE_PURPOSES] == [
        "rhumbatron-agent-wakeups-pin",
        "rhumbatron-integration-pin",
        "rhumbatron-indexing-pin",
        "rhumbatron-verification-pin",
        "rhumbatron-release-pin",
        "rhumbatron-dead-letter-pin",
    ]
    assert retry_topic("integration", ENV) == "rhumbatron-integration-retry-pin"
    assert dead_letter_topic(ENV) == "rhumbatron_dead_letters_pin"
    assert metrics_topic(ENV) == "rhumbatron_event_metrics_pin"
    assert audit_topic(ENV) == "rhumbatron_audit_pin"
    assert pump_checkpoint_topic(ENV) == "rhumbatron_pump_checkpoints_pin"
    assert redelivery_topic("project-view-projector", ENV) == (
        "rhumbatron_redelivery_project_view_projector_pin"
    )


def test_group_names_and_transactional_ids() -> None:
    assert group_id("causal-router", ENV) == "rhumbatron-causal-router-pin"
    assert worker_slug("integration") == "worker-integration"
    assert group_id(worker_slug("integration"), ENV) == "rhumbatron-worker-integration-pin"
    assert transactional_id("causal-router", ENV, 3) == "rhumbatron-causal-router-pin-3"
    assert transactional_id(worker_slug("indexing"), ENV, 0) == "rhumbatron-worker-indexing-pin-0"
    assert rollup_app_id(make_settings(env=ENV)) == "rhumbatron-analytics-rollup-pin"
    # The pump's id and checkpoint key per feed: its URL without the query (or a trailing /).
    feed = "http://feed.example/v1/changes/?after=3"
    assert pump_transactional_id(ENV, feed) == "rhumbatron-pump-pin-b78fb87f706791d0"
    assert feed_key(feed) == "http://feed.example/v1/changes"


def test_the_redelivery_partition_mapping() -> None:
    topology = make_settings(env=ENV, streams=8, partitions=3).topology
    assert topology.redelivery_partition("rhumbatron_events_00_pin", 2) == 2
    assert topology.redelivery_partition("rhumbatron_events_05_pin", 1) == 16
    assert topology.redelivery_partition("rhumbatron-integration-pin", 0) is None
    assert topology.redelivery_spec("ledger").partitions == 24


def test_redis_keys_of_the_runtime() -> None:
    client = _client()
    store = RedisStore(
        client,
        env=ENV,
        slug="project-view-projector",
        clock=ManualClock(),
        claim_ttl_ms=86_400_000,
    )
    tp = TP("rhumbatron_events_03_pin", 1)
    assert store.prefix(tp) == "rh:pin:{project-view-projector|rhumbatron_events_03_pin|1}:"
    assert store.key(tp, "view:p1") == (
        "rh:pin:{project-view-projector|rhumbatron_events_03_pin|1}:x:view:p1"
    )
    letters = KafkaRedisDeadLetters(
        Producer({"bootstrap.servers": "127.0.0.1:1"}),  # lazy: never connects here
        client,
        env=ENV,
        topic=dead_letter_topic(ENV),
        reason_max_bytes=1000,
        record_max_bytes=900_000,
        flush_timeout=1.0,
        audit=MemoryAudit(),
    )
    assert letters.prefix == "rh:pin:{dead-letters}:"
    assert marker_key(ENV) == "rh:pin:{dead-letters}:complete"
    assert lock_key(ENV) == "rh:pin:{dead-letters}:rebuild-lock"
    assert ProducerLease(client, env=ENV, slug="causal-router", ttl_s=30).prefix == (
        "rh:pin:{slots}:causal-router:"
    )
    assert RedisAuditLog(client, env=ENV, slug="ledger").key == "rh:pin:{audit}:ledger"


def test_redis_keys_of_the_router_and_the_workers() -> None:
    client = _client()
    assert RedisDailyCounter(client, env=ENV, ttl_s=1).prefix == "rh:pin:causal-router:"
    assert RedisCommandBudget(client, env=ENV, cap=1, ttl_s=1).prefix == (
        "rh:pin:causal-router:commands:"
    )
    tick = MaintenanceTick(
        client,
        env=ENV,
        at_utc="04:17",
        cap=1,
        ttl_s=1.0,
        lock_ttl_s=1,
        read_states=lambda: {},
        send=lambda *_: None,
        clock=ManualClock(),
    )
    assert (tick.day_key, tick.marks_key, tick.lock_prefix) == (
        "rh:pin:causal-router:maintenance:day",
        "rh:pin:causal-router:maintenance:marks",
        "rh:pin:causal-router:maintenance:lock:",
    )
    assert RedisCommandLedger(client, env=ENV, ttl_ms=1).prefix == "rh:pin:{workers}:done:"
    assert RedisWorkerMetrics(client, env=ENV).prefix == "rh:pin:{workers}:metrics:"
    assert RedisIndexStates(client, env=ENV).prefix == "rh:pin:{workers}:index:"
    assert RedisWorkflowRegistry(client, env=ENV, ttl_s=1).prefix == "rh:pin:{workers}:workflow:"
