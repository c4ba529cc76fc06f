"""``raw-produce``: the raw confluent-kafka producer sending the workload's envelopes (encoded
before the clock starts) with the product's producer settings, ``acks=all`` and idempotence: the
limit the publisher row is set beside. It writes to an environment of its own, so the run's
shared streams (bench.runtime_cases) hold the workload once."""

from __future__ import annotations

import time

from bench import raw
from bench.harness import BenchEnv, case, own_streams, process_cpu_s, servers
from bench.rows import Row, rate
from bench.runtime_cases import PROJECTS
from streams.envelopes import encode
from streams.workload import slotted_events, workload


def _records(env: BenchEnv) -> None:
    """The produce environment's streams, and the encoded records (outside the timed part)."""
    s = own_streams(env, "p")
    events = slotted_events(workload(s.env, PROJECTS, env.size), tenant_id="tenant-bench")
    env.scratch["records"] = [
        (
            s.topology.stream_for(e.project_id),
            e.project_id,
            encode(e, max_bytes=s.max_envelope_bytes),
        )
        for e in events
    ]


@case("raw-produce", setup=_records)
def raw_produce(env: BenchEnv) -> list[Row]:
    records = env.scratch["records"]
    broker = (servers() or {}).get("broker")
    cpu_before = process_cpu_s(broker) if broker else 0.0
    started = time.perf_counter()
    sent = raw.raw_produce(env.settings.kafka_bootstrap, records)
    seconds = time.perf_counter() - started
    size = sum(len(v) for _, _, v in records) / len(records)
    rows = [
        rate(
            "raw-produce",
            sent,
            seconds,
            "events/s",
            note=f"acks=all, idempotent, lz4; {size:.0f} B envelopes, held in memory",
        ),
    ]
    if broker:  # infra/local.sh's broker: its CPU over the produce, for the sizing arithmetic
        rows.append(
            Row(
                "raw-produce-broker-cpu-us",
                (process_cpu_s(broker) - cpu_before) * 1e6 / sent,
                "us/event",
                note="the broker's CPU (/proc/PID/stat) over raw-produce, per event written",
            )
        )
    return rows
