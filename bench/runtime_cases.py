"""Subscription runtime cases: the ``ledger`` subscription on one process against a raw
confluent-kafka consume of the same topics in the same run; Redis bytes per claim."""

from __future__ import annotations

import uuid

from bench import raw
from bench.harness import BenchEnv, case
from consumers.redis_conn import connect
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from streams.producer import Producer, send_to_streams
from streams.workload import slotted_events, workload


def _published(env: BenchEnv) -> None:
    """A fresh set of streams holding env.size events. The case gets an environment of its own:
    the run's shared one also holds what the produce and outbox cases sent (the same ids more
    than once), which would make a subscription's figure partly a dedupe figure."""
    s = env.settings = Settings(
        **{**env.settings.model_dump(), "env": f"{env.settings.env}_{uuid.uuid4().hex[:6]}"}
    )
    base = s.kafka_config()
    provision_environment(s)  # the subscriptions' redelivery topics too
    events = slotted_events(workload(uuid.uuid4().hex[:6], 500, env.size), tenant_id="tenant-bench")
    send_to_streams(
        Producer(base),
        events,
        stream_for=s.topology.stream_for,
        max_bytes=s.max_envelope_bytes,
        flush_timeout=120,
    )


@case("runtime: raw confluent-kafka consume", setup=_published)
def raw_consume(env: BenchEnv) -> int:
    s = env.settings
    return raw.raw_consume(s.kafka_bootstrap, s.topology.stream_names(), env.size)


@case(
    "runtime: ledger subscription (claims+effects+cursor)",
    baseline="runtime: raw confluent-kafka consume",
    setup=_published,
)
def ledger(env: BenchEnv) -> int:
    subscription = open_subscription(env.settings, "ledger")
    runner = subscription.runner
    try:
        runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
    finally:
        subscription.close()
    client = connect(env.settings.redis_url, timeout=5)
    claims = 0
    claim_bytes = 0
    for key in client.scan_iter(match=f"rh:{env.settings.env}:{{ledger|*claims:*"):
        claims += client.scard(key)
        claim_bytes += client.memory_usage(key, samples=0) or 0
    env.scratch["note"] = f"{claim_bytes / max(claims, 1):.0f} B/claim"
    return runner.stats.records
