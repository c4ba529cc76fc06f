"""One event's path on the real broker and Redis — outbox write, publish, the projector's and the
causal router's applies, the command the router sends, the command worker's handling — is one
trace: the publisher's PRODUCER spans carry it into the records' headers (read back from the
topic), each subscription's batch links them, each apply continues them, the command record
carries the router's apply, and the worker's CONSUMER span continues that."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import Message
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from consumers.subscriptions.causal_router.processor import SLUG as ROUTER
from consumers.subscriptions.projector.processor import SLUG as PROJECTOR
from router.settings import Settings
from router.wiring.outbox import build_publisher, open_outbox
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from router.wiring.workers import open_worker
from router.workers.drills import OkHandler
from streams import tracing as t
from streams.envelopes import Draft
from streams.headers import header
from streams.topology import QUEUE_PURPOSES, group_id, queue_name
from tests.support.kafka import read_all
from tests.support.runtime_processes import runtime_settings
from tests.support.tracing import hex_id

pytestmark = pytest.mark.integration


def _drafts(project: str) -> list[Draft]:
    """t2 waits for t1; t1 completing makes the router dispatch t2 (a change.dispatch command)."""

    def draft(event_type: str, task: str, **payload: object) -> Draft:
        return Draft(
            event_id=f"evt_{uuid.uuid4().hex}",
            event_type=event_type,
            project_id=project,
            change_id="chg-1",
            task_id=task,
            actor="service:test",
            payload=payload,
        )

    return [
        draft("task.created", "t1"),
        draft("task.created", "t2", dependsOn=["t1"]),
        draft("task.completed", "t1", agentId="agent-a"),
    ]


def _consume(s: Settings, slug: str) -> None:
    subscription = open_subscription(s, slug)
    try:
        subscription.runner.run(until_idle_s=2.0, tick=subscription.tick)
    finally:
        subscription.close()


def _headers(message: Message) -> list[tuple[str, bytes]]:
    return cast(list[tuple[str, bytes]], message.headers() or [])


def _attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def _started(span: ReadableSpan) -> int:
    return span.start_time or 0


def test_one_events_path_from_outbox_write_to_the_worker_is_one_trace(
    settings: Settings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    s = runtime_settings(settings, router_outbox_path=str(tmp_path / "router-outbox.sqlite"))
    provision_environment(s)
    project = f"proj-{uuid.uuid4().hex[:8]}"
    drafts = _drafts(project)
    completed = drafts[-1].event_id

    store = open_outbox(s, tmp_path / "outbox.sqlite", create=True)
    service = trace.get_tracer("test-service")
    with service.start_as_current_span("complete task t1") as root, store.transaction() as unit:
        unit.append(project, drafts, tenant_id="tenant-t")
    try:
        with build_publisher(s, store) as publisher:
            publisher.run(until_empty=True)
    finally:
        store.close()
    trace_id = root.get_span_context().trace_id

    # The publisher's headers, read back from the topic: each record's PRODUCER span.
    stream = s.topology.stream_for(project)
    finished = spans.get_finished_spans()
    publishes = {s.context.span_id: s for s in finished if s.name == f"publish {stream}"}
    assert len(publishes) == 3
    records = [
        m for m in read_all(s.kafka_bootstrap, [stream], expect=3) if m.key() == project.encode()
    ]
    assert len(records) == 3
    for message in records:
        raw = header(_headers(message), t.TRACEPARENT)
        assert raw is not None
        _, in_trace, parent, _ = raw.decode().split("-")
        assert in_trace == hex_id(trace_id, 32)
        assert int(parent, 16) in publishes

    for slug in (PROJECTOR, ROUTER):
        _consume(s, slug)
    finished = spans.get_finished_spans()

    [write] = [x for x in finished if x.name == "outbox.write"]
    assert write.parent is not None and write.parent.span_id == root.get_span_context().span_id
    for publish in publishes.values():
        assert publish.kind is SpanKind.PRODUCER
        assert publish.parent is not None and publish.parent.span_id == write.context.span_id
        a = _attrs(publish)
        assert a[t.MESSAGING_SYSTEM] == "kafka" and a[t.DESTINATION] == stream
        assert a[t.MESSAGE_KEY] == project and isinstance(a[t.OFFSET], int)

    for slug in (PROJECTOR, ROUTER):
        group = group_id(slug, s.env)
        batches = [
            x
            for x in finished
            if x.name == f"process {stream}" and _attrs(x).get(t.SUBSCRIPTION) == slug
        ]
        assert batches, f"{slug}: no batch span"
        linked = {link.context.span_id for b in batches for link in b.links}
        assert set(publishes) <= linked, f"{slug}: a batch does not link every producer"
        for batch in batches:
            assert batch.kind is SpanKind.CONSUMER and batch.parent is None
            assert _attrs(batch)[t.CONSUMER_GROUP] == group
            assert int(str(_attrs(batch)[t.BATCH_COUNT])) >= len(batch.links) > 0
        applies = [
            x
            for x in finished
            if x.name.startswith("apply ")
            and _attrs(x).get(t.SUBSCRIPTION) == slug
            and _attrs(x).get(t.PROJECT) == project
        ]
        assert applies, f"{slug}: no apply span"
        for apply in applies:
            assert apply.context.trace_id == trace_id  # the event's own trace goes on
            assert apply.parent is not None and apply.parent.span_id in publishes
            assert apply.kind is SpanKind.CONSUMER
            a = _attrs(apply)
            assert a[t.OUTCOME] == "applied"
            assert a[t.DESTINATION] == stream and isinstance(a[t.OFFSET], int)

    [router_apply] = [
        x
        for x in finished
        if _attrs(x).get(t.SUBSCRIPTION) == ROUTER and _attrs(x).get(t.EVENT_ID) == completed
    ]
    # The command the router sent for it carries that apply's context.
    queues = s.topology.queue_names()
    commands = [
        m for m in read_all(s.kafka_bootstrap, queues, expect=1) if m.key() == project.encode()
    ]
    assert len(commands) == 1
    raw = header(_headers(commands[0]), t.TRACEPARENT)
    assert raw is not None
    _, in_trace, parent, _ = raw.decode().split("-")
    assert (in_trace, parent) == (
        hex_id(trace_id, 32),
        hex_id(router_apply.context.span_id, 16),
    )

    # The command worker, in this process, handles that command in the same trace.
    queue = commands[0].topic()
    [purpose] = [p for p in QUEUE_PURPOSES if queue_name(p, s.env) == queue]
    worker = open_worker(s, purpose, OkHandler())
    try:
        handled = worker.worker.run(until_idle_s=2.0, tick=worker.tick)
    finally:
        worker.close()
    assert handled.outcomes["ok"] == 1, handled
    finished = spans.get_finished_spans()
    [process] = [x for x in finished if x.name == f"process {queue}"]
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == trace_id
    assert process.parent is not None and process.parent.span_id == router_apply.context.span_id
    a = _attrs(process)
    assert a[t.MESSAGING_SYSTEM] == "kafka" and a[t.DESTINATION] == queue
    assert a[t.MESSAGE_KEY] == project and a[t.OFFSET] == commands[0].offset()
    assert a[t.CONSUMER_GROUP] == group_id(f"worker-{purpose}", s.env)
    assert a[t.OUTCOME] == "ok" and a[t.PROJECT] == project

    # The whole trace, in the order its spans started: the service's transaction and its outbox
    # write, the publishes, the projector's then the router's applies, the worker's handling. (The
    # batch spans are roots of their own, linked to the publishes.)
    path = sorted((x for x in finished if x.context.trace_id == trace_id), key=_started)
    applies_of = [
        (f"apply {d.event_type}", SpanKind.CONSUMER, slug)
        for slug in (PROJECTOR, ROUTER)
        for d in drafts
    ]
    assert [(x.name, x.kind, _attrs(x).get(t.SUBSCRIPTION)) for x in path] == [
        ("complete task t1", SpanKind.INTERNAL, None),
        ("outbox.write", SpanKind.INTERNAL, None),
        *[(f"publish {stream}", SpanKind.PRODUCER, None)] * len(drafts),
        *applies_of,
        (f"process {queue}", SpanKind.CONSUMER, None),
    ]
