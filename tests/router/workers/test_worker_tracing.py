"""The command worker's spans on the in-memory log, with an in-memory span exporter: a handling
parented on the context the command carries, the retry and dead-letter sends as PRODUCER spans
whose context the next handling continues (the dead-letter consumer's and, after an operator's
retry, the queue worker's again), errors recorded with the dead letter's own reason, an aborted
transaction marked, and nothing written when no tracer provider is installed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import command_letter_id
from consumers.runtime.memory_transport import MemoryOutput, MemoryTransport
from router.workers.worker import Worker
from streams.envelopes import encode
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.sqlite_schema import SqliteOptions
from tests.support.tracing import installed_provider, no_provider
from tests.support.worker_harness import MAX, Pipeline, Scripted, World, fail_for, policy


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    with installed_provider() as exporter:
        yield exporter


@pytest.fixture
def outbox(tmp_path: Path) -> SqliteOutbox:
    return SqliteOutbox(
        tmp_path / "router-outbox.sqlite",
        options=SqliteOptions(max_envelope_bytes=MAX, missed_report_limit=10, busy_timeout_s=5),
    )


def caused_by(span_name: str) -> tuple[tuple[tuple[str, bytes], ...], trace.SpanContext]:
    """The trace headers a command caused inside ``span_name`` carries, and that span's context."""
    with trace.get_tracer("test").start_as_current_span(span_name) as cause:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    return tuple((k, v.encode()) for k, v in carrier.items()), cause.get_span_context()


def by_id(spans: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def parent_of(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    assert span.parent is not None, span.name
    return by_id(spans)[span.parent.span_id]


def test_a_handled_command_is_a_consumer_span_parented_on_the_context_it_carries(
    exporter: InMemorySpanExporter,
) -> None:
    world = World(policy())
    transport = MemoryTransport(world.log, "group")
    worker = Worker(
        world.policy,
        Scripted(fail_for(), world.clock),
        transport,
        MemoryOutput(world.log),
        world.ledger,
        world.clock,
        group="rhumbatron-worker-agent-wakeups-unit",
    )
    worker.start()
    headers, cause = caused_by("router decision")
    command = world.command("cmd_ok")
    world.log.append(world.policy.queue_topic, 1, encode(command, max_bytes=MAX), b"p1", headers)
    world.run_for(worker, 2)

    [span] = [s for s in exporter.get_finished_spans() if s.name != "router decision"]
    assert span.name == f"process {world.policy.queue_topic}"
    assert span.kind is SpanKind.CONSUMER
    assert span.context.trace_id == cause.trace_id
    assert span.parent is not None and span.parent.span_id == cause.span_id
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": world.policy.queue_topic,
        "messaging.destination.partition.id": "1",
        "messaging.kafka.offset": 0,
        "messaging.kafka.message.key": "p1",
        "messaging.consumer.group.name": "rhumbatron-worker-agent-wakeups-unit",
        "rhumbatron.queue": "agent-wakeups",
        "rhumbatron.attempt": 1,
        "rhumbatron.command_id": "cmd_ok",
        "rhumbatron.command_type": "agent.wake",
        "rhumbatron.project_id": "p1",
        "rhumbatron.outcome": "ok",
    }
    assert span.status.status_code is StatusCode.UNSET


def test_retries_the_dead_letter_and_an_operators_retry_stay_in_the_commands_trace(
    exporter: InMemorySpanExporter, outbox: SqliteOutbox
) -> None:
    p = Pipeline(outbox)  # retries=1: two attempts, then the dead-letter queue
    headers, cause = caused_by("router decision")
    command = p.world.command("cmd_t1_ready")
    p.world.log.append(
        p.world.policy.queue_topic, 0, encode(command, max_bytes=MAX), b"p1", headers
    )
    p.run(40)
    queue, retry_topic, dlq = p.world.policy.queue_topic, p.world.policy.retry_topic, p.world.dlq

    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {cause.trace_id}
    [first] = [s for s in spans if s.name == f"process {queue}"]
    assert parent_of(first, spans).name == "router decision"
    [to_retry] = [s for s in spans if s.name == f"publish {retry_topic}"]
    [second] = [s for s in spans if s.name == f"process {retry_topic}"]
    [to_dlq] = [s for s in spans if s.name == f"publish {dlq}"]
    [recorded] = [s for s in spans if s.name == f"process {dlq}"]
    assert to_retry.kind is SpanKind.PRODUCER and to_dlq.kind is SpanKind.PRODUCER
    assert parent_of(to_retry, spans) is first and parent_of(second, spans) is to_retry
    assert parent_of(to_dlq, spans) is second and parent_of(recorded, spans) is to_dlq
    assert (first.attributes or {})["rhumbatron.outcome"] == "retried"
    assert (second.attributes or {})["rhumbatron.attempt"] == 2
    assert (second.attributes or {})["rhumbatron.outcome"] == "dead_lettered"
    assert (recorded.attributes or {})["rhumbatron.outcome"] == "recorded"

    # The errors: each attempt's exception, and the dead letter's own reason as the status.
    [letter] = p.store.list()
    assert second.status.status_code is StatusCode.ERROR
    assert second.status.description == letter.error
    assert first.status.description == "handler refuses cmd_t1_ready"
    for attempt in (first, second):
        [event] = attempt.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.message"] == "handler refuses cmd_t1_ready"
    # The records sent carry their publish span's context, not the command's first one.
    [retry] = p.world.log.all(retry_topic)
    [dead] = p.world.dead_letters()
    for record, publish in ((retry, to_retry), (dead, to_dlq)):
        traceparent = (record.header("traceparent") or b"").decode()
        assert traceparent.split("-")[2] == format(publish.context.span_id, "016x")
    # What the dead-letter consumer wrote through the outbox (task.blocked, task.failed) goes on
    # in the trace from its handling: the outbox write is a span inside it.
    [write] = [s for s in spans if s.name == "outbox.write"]
    assert parent_of(write, spans) is recorded
    with sqlite3.connect(outbox.path) as conn:
        contexts = [orjson.loads(r[0]) for r in conn.execute("SELECT trace_context FROM outbox")]
    assert len(contexts) == 2
    for context in contexts:
        _, trace_id, parent, _ = context["traceparent"].split("-")
        assert trace_id == format(cause.trace_id, "032x")
        assert parent == format(write.context.span_id, "016x")

    # An operator's retry sends the letter's headers back to the queue: the next handling
    # continues the trace from the dead letter's publish.
    exporter.clear()

    def send(
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        p.world.log.append(topic, 0, value, key, tuple(headers))

    actions = DeadLetterActions(
        p.store,
        p.world.clock,
        send,
        lambda slug: f"redelivery-{slug}",
        lambda tp: None,
        lambda purpose: f"rhumbatron-{purpose}-unit",
    )
    actions.retry(command_letter_id("cmd_t1_ready"), who="alice", why="fixed the agent")
    p.run(3)
    again = [s for s in exporter.get_finished_spans() if s.name == f"process {queue}"]
    assert again, [s.name for s in exporter.get_finished_spans()]
    assert again[0].context.trace_id == cause.trace_id
    assert again[0].parent is not None and again[0].parent.span_id == to_dlq.context.span_id


def test_an_aborted_transaction_marks_the_spans_of_its_records(
    exporter: InMemorySpanExporter,
) -> None:
    world = World(policy())
    worker = world.worker(Scripted(fail_for(), world.clock))
    output = worker.output
    assert isinstance(output, MemoryOutput)
    fail = [True]
    output.fail_commit = lambda: fail.pop() if fail else False
    world.send(world.command("cmd_once"))
    world.run_for(worker, 3)

    lost, handled = exporter.get_finished_spans()
    assert lost.status.status_code is StatusCode.ERROR
    assert "transaction aborted" in (lost.status.description or "")
    assert (lost.attributes or {})["rhumbatron.outcome"] == "ok"
    # Read again, it had completed before the loss (the ledger says so): not run a second time.
    assert handled.status.status_code is StatusCode.UNSET
    assert (handled.attributes or {})["rhumbatron.outcome"] == "duplicate"


def test_untraced_the_worker_writes_no_trace_headers() -> None:
    world = World(policy(retries=1))
    worker = world.worker(Scripted(fail_for("cmd_bad"), world.clock))
    world.send(world.command("cmd_bad"))
    with no_provider():
        world.run_for(worker, 100)
    [retry] = world.log.all(world.policy.retry_topic)
    [letter] = world.dead_letters()
    assert retry.header("traceparent") is None and letter.header("traceparent") is None
