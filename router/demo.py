"""The main job, end to end on the real broker: provision, write a workload over many projects
through the outbox (concurrent writers), publish it, consume it back, and print what went where
and whether every project arrived in slot order."""

from __future__ import annotations

import secrets
import time
from collections import Counter, defaultdict
from pathlib import Path

from confluent_kafka import Message

from consumers.kafka_consumer import drain
from consumers.redis_conn import connect
from router.outbox_cli import build_publisher, open_outbox, write_workload
from router.settings import Settings
from streams.admin import admin_client, provision
from streams.envelopes import Event
from streams.errors import EnvelopeError
from streams.outbox.store import RowState
from streams.topology import group_id
from streams.workload import workload


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
    produced, expected = publish_through_outbox(settings, run=run, projects=projects, events=events)

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
        until=lambda: seen >= expected,
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
    ok = len(in_order) == projects and seen == expected
    print(
        f"slot order: {len(in_order)}/{projects} projects arrived complete and in slot order: {'yes' if ok else 'NO'}"
    )
    for line in rejected[:5]:
        print(f"  rejected {line}")
    return 0 if ok else 1


def publish_through_outbox(
    settings: Settings, *, run: str, projects: int, events: int
) -> tuple[dict[str, int], int]:
    """Write the workload through an outbox with concurrent writers, then run the publisher until
    the outbox is empty. Prints the write and publish figures; returns the rows published per
    stream and in all."""
    folder = Path(settings.demo_outbox_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"outbox-{run}.db"
    store = open_outbox(settings, path, create=True)
    try:
        written = write_workload(
            store,
            workload(run, projects, events),
            writers=settings.produce_writers,
            events_per_write=settings.produce_events_per_write,
        )
        print(
            f"write: {written.events} events over {projects} projects (run {run}) into the outbox "
            f"{path}: {written.writes} transactions by {written.writers} concurrent writers in "
            f"{written.seconds:.2f}s"
        )
        with build_publisher(settings, store) as publisher:
            totals = publisher.run(until_empty=True)
        elapsed = max(time.monotonic() - totals.started, 1e-9)
        counts = store.counts()
        print(
            f"publish: {totals.published} rows published in {elapsed:.2f}s "
            f"({totals.published / elapsed:.0f} rows/s, {settings.outbox_ordering} ordering); "
            f"{totals.retries} retries, {counts[RowState.FAILED]} failed"
        )
        published = store.rows_in_state(RowState.PUBLISHED, written.events)
        per_stream = Counter(settings.topology.stream_for(row.project_id) for row in published)
    finally:
        store.close()
    return dict(per_stream), len(published)
