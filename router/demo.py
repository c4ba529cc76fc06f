"""The main job, end to end on the real broker: provision, produce a workload over many projects,
consume it back, and print what went where and whether every project arrived in slot order."""

from __future__ import annotations

import secrets
import time
from collections import defaultdict

from confluent_kafka import Message

from consumers.kafka_consumer import drain
from consumers.redis_conn import connect
from router.settings import Settings
from streams.admin import admin_client, provision
from streams.envelopes import Event
from streams.errors import EnvelopeError
from streams.producer import Producer, send_to_streams
from streams.topology import group_id
from streams.workload import slotted_events, workload


def run_demo(settings: Settings, *, projects: int, events: int) -> int:
    base = settings.kafka_config()
    topology = settings.topology
    connect(settings.redis_url, timeout=settings.connect_timeout_s).close()
    report = provision(
        admin_client(base),
        base,
        topology.all_specs(),
        topology=topology,
        timeout=settings.connect_timeout_s,
    )
    print(f"provision: {report.summary()} in environment '{settings.env}'")

    run = secrets.token_hex(4)
    produced_events = slotted_events(workload(run, projects, events), tenant_id="tenant-demo")
    started = time.perf_counter()
    produced = send_to_streams(
        Producer(base),
        produced_events,
        stream_for=topology.stream_for,
        max_bytes=settings.max_envelope_bytes,
        flush_timeout=60.0,
    )
    produce_s = time.perf_counter() - started
    print(
        f"produce: {len(produced_events)} events over {projects} projects in {produce_s:.2f}s (run {run})"
    )

    prefix = f"proj-{run}-"
    slots: dict[str, list[int]] = defaultdict(list)
    consumed: dict[str, int] = defaultdict(int)
    seen = 0
    rejected: list[str] = []

    def handle(event: Event, message: Message) -> None:
        nonlocal seen
        if event.project_id.startswith(prefix):
            slots[event.project_id].append(event.slot or 0)
            consumed[message.topic() or "?"] += 1
            seen += 1

    def reject(message: Message, error: EnvelopeError) -> None:
        rejected.append(f"{message.topic()}[{message.partition()}]@{message.offset()}: {error}")

    started = time.perf_counter()
    drain(
        base,
        group_id=group_id("demo", settings.env),
        topics=topology.stream_names(),
        handle=handle,
        reject=reject,
        protocol=settings.group_protocol,
        session_timeout_ms=settings.session_timeout_ms,
        max_envelope_bytes=settings.max_envelope_bytes,
        batch_size=settings.batch_size,
        until_idle_s=10.0,
        until=lambda: seen >= len(produced_events),
        max_wait_s=300.0,
    )
    consume_s = time.perf_counter() - started

    in_order = [p for p, s in slots.items() if s == list(range(1, len(s) + 1))]
    print()
    print(f"{'stream':<32}{'produced':>10}{'consumed':>10}")
    for name in topology.stream_names():
        print(f"{name:<32}{produced.get(name, 0):>10}{consumed.get(name, 0):>10}")
    print(f"{'total':<32}{sum(produced.values()):>10}{sum(consumed.values()):>10}")
    print()
    print(f"consume: {seen} events in {consume_s:.2f}s; {len(rejected)} rejected records")
    ok = len(in_order) == projects and seen == len(produced_events)
    print(
        f"slot order: {len(in_order)}/{projects} projects arrived complete and in slot order: {'yes' if ok else 'NO'}"
    )
    for line in rejected[:5]:
        print(f"  rejected {line}")
    return 0 if ok else 1
