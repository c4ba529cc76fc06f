"""Benchmark cases. Baselines are raw confluent-kafka doing the same work with no envelope
validation, so the ratio is what Rhumbatron costs on top of the client."""

from __future__ import annotations

import uuid

from bench import raw
from bench.harness import BenchEnv, case
from consumers.kafka_consumer import drain
from streams.admin import admin_client, provision
from streams.envelopes import encode
from streams.producer import Producer, send_to_streams
from streams.workload import slotted_events, workload


def _provisioned(env: BenchEnv) -> None:
    s = env.settings
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)


def _with_events(env: BenchEnv) -> None:
    """Provision, and build the events outside the timed part."""
    _provisioned(env)
    env.scratch["events"] = slotted_events(
        workload("bench", 500, env.size), tenant_id="tenant-bench"
    )


@case("produce: raw confluent-kafka", setup=_with_events)
def raw_produce(env: BenchEnv) -> int:
    s = env.settings
    # The raw client gets pre-encoded bytes: the baseline is the client alone.
    records = [
        (
            s.topology.stream_for(e.project_id),
            e.project_id,
            encode(e, max_bytes=s.max_envelope_bytes),
        )
        for e in env.scratch["events"]
    ]
    return raw.raw_produce(s.kafka_bootstrap, records)


@case(
    "produce: streams.Producer (encode + headers)",
    baseline="produce: raw confluent-kafka",
    setup=_with_events,
)
def our_produce(env: BenchEnv) -> int:
    s = env.settings
    events = env.scratch["events"]
    counts = send_to_streams(
        Producer(s.kafka_config()),
        events,
        stream_for=s.topology.stream_for,
        max_bytes=s.max_envelope_bytes,
        flush_timeout=60,
    )
    return sum(counts.values())


@case("consume: raw confluent-kafka", setup=_provisioned)
def raw_consume(env: BenchEnv) -> int:
    s = env.settings
    return raw.raw_consume(s.kafka_bootstrap, s.topology.stream_names(), 2 * env.size)


@case(
    "consume: consumers.drain (decode + commit)",
    baseline="consume: raw confluent-kafka",
    setup=_provisioned,
)
def our_consume(env: BenchEnv) -> int:
    s = env.settings
    seen = 0

    def handle(event, message):
        nonlocal seen
        seen += 1

    drain(
        s.kafka_config(),
        group_id=f"rhumbatron-bench-{uuid.uuid4().hex[:8]}-{s.env}",
        topics=s.topology.stream_names(),
        handle=handle,
        reject=lambda m, e: None,
        protocol=s.group_protocol,
        session_timeout_ms=s.session_timeout_ms,
        max_envelope_bytes=s.max_envelope_bytes,
        batch_size=1000,
        until_idle_s=10,
        join_timeout_s=s.group_join_timeout_s,
        until=lambda: seen >= 2 * env.size,
    )
    return seen


# Registered last so the produce and consume cases above see only their own records.
import bench.outbox_cases  # noqa: E402, F401
