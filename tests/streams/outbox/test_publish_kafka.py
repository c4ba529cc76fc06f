"""``rhumbatron publish`` against the real broker: end to end through the CLI, a one-shot second
publisher refused (a long-running one stands by: test_publish_standby.py), streams that do not
exist, and the writer's trace continued by the publish."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from router.settings import Settings
from streams.admin import admin_client, delete_topics, provision
from streams.outbox.store import RowState
from tests.support.environment import ROOT, run_cli
from tests.support.kafka import events_of, read_all
from tests.support.outbox import cli_env, drafts, outbox_for

pytestmark = pytest.mark.integration


def _cli(s: Settings, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *argv, env=cli_env(s, **env), timeout=300)


def _provision(s: Settings) -> None:
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)


def test_produce_then_publish_through_the_cli(settings: Settings, tmp_path: Path) -> None:
    _provision(settings)
    path = str(tmp_path / "outbox.db")
    produced = _cli(settings, "produce", "--outbox", path, "--projects", "20", "--events", "1000")
    assert produced.returncode == 0, produced.stderr
    published = _cli(settings, "publish", "--outbox", path, "--until-empty", "--json")
    assert published.returncode == 0, published.stderr
    summary = orjson.loads(published.stdout)
    assert summary["published"] == 1000 and summary["failed"] == 0
    stats = _cli(settings, "outbox", "stats", "--outbox", path, "--json")
    shown = orjson.loads(stats.stdout)
    assert (shown["pending"], shown["published"], shown["retry_wait"], shown["failed"]) == (
        0,
        1000,
        0,
        0,
    )
    assert shown["oldest_pending_age_s"] is None
    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=1000)
    slots: dict[str, list[int]] = defaultdict(list)
    for event in events_of(messages):
        slots[event.project_id].append(event.slot or 0)
    assert len(slots) == 20 and sum(map(len, slots.values())) == 1000
    assert all(found == list(range(1, len(found) + 1)) for found in slots.values())
    headers = dict(messages[0].headers() or [])
    assert set(headers) >= {"event_type", "event_id", "content_type"}


def test_a_one_shot_second_publisher_is_refused(settings: Settings, tmp_path: Path) -> None:
    """``--until-empty`` never stands by (it would hang a script): it exits 2 at once, naming
    the holder, and the one publisher keeps the outbox."""
    _provision(settings)
    path = tmp_path / "outbox.db"
    outbox_for(settings, path).close()
    first = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "publish", "--outbox", str(path)],
        cwd=ROOT,
        env=cli_env(settings),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = Path(f"{path}.publisher.lock")
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first publisher never took the lease"
            time.sleep(0.05)
        second = _cli(settings, "publish", "--outbox", str(path), "--until-empty")
        assert second.returncode == 2
        assert f"outbox {path} already has a publisher (process {first.pid} holds" in second.stderr
        assert "only one publisher may run per outbox" in second.stderr
        first.send_signal(signal.SIGTERM)  # a clean stop
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)


def test_publish_refuses_an_environment_without_streams(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    outbox_for(settings, path).close()
    refused = _cli(settings, "publish", "--outbox", str(path), "--until-empty")
    assert refused.returncode == 2
    assert f"environment '{settings.env}' is not provisioned: missing" in refused.stderr
    assert f"rhumbatron_events_00-07_{settings.env} (8 topics)" in refused.stderr
    assert "rhumbatron provision" in refused.stderr


def test_rows_for_a_stream_that_does_not_exist_fail_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    _provision(settings)
    missing = settings.topology.stream_names()[3]
    base = settings.kafka_config()
    delete_topics(admin_client(base), base, [missing], timeout=30)
    path = tmp_path / "outbox.db"
    store = outbox_for(settings, path)
    projects = [f"proj-{n}" for n in range(40)]
    lost = [p for p in projects if settings.topology.stream_for(p) == missing]
    assert lost
    for project in projects:
        with store.transaction() as unit:
            unit.append(project, drafts(project, 3), tenant_id="t")
    published = _cli(settings, "publish", "--outbox", str(path), "--until-empty")
    assert published.returncode == 1
    assert f"{len(lost)} row(s) failed and hold their projects back" in published.stderr
    failed = store.rows_in_state(RowState.FAILED, 100)
    assert sorted(r.project_id for r in failed) == sorted(lost)
    assert all(r.slot == 1 and r.attempts == 0 for r in failed)
    assert all(f"no producer for stream '{missing}'" in (r.last_error or "") for r in failed)
    counts = store.counts()
    assert counts[RowState.PUBLISHED] == 3 * (len(projects) - len(lost))
    assert counts[RowState.PENDING] == 2 * len(lost)
    store.close()


TRACED_WRITE = """
import json, sys
from pathlib import Path
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from router.wiring.outbox import build_publisher, open_outbox
from router.settings import Settings
from tests.support.outbox import drafts

settings = Settings()
store = open_outbox(settings, Path(sys.argv[1]), create=True)
from opentelemetry import propagate
# The writer's caller sent a trace state along: it travels with the trace, into the records.
caller = propagate.extract({
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=abc",
})
with trace.get_tracer("writer").start_as_current_span("writer.decide", context=caller) as span:
    with store.transaction() as unit:
        unit.append("proj-traced", drafts("proj-traced", 2), tenant_id="t")
    writer = span.get_span_context().trace_id
with build_publisher(settings, store) as publisher:
    publisher.run(until_empty=True)
print(json.dumps({
    "writer": format(writer, "032x"),
    "spans": [
        {
            "name": s.name,
            "trace": format(s.context.trace_id, "032x"),
            "span": format(s.context.span_id, "016x"),
            "parent": format(s.parent.span_id, "016x") if s.parent else None,
            "kind": s.kind.name,
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ],
}))
"""


def test_the_publish_continues_the_writers_trace(settings: Settings, tmp_path: Path) -> None:
    _provision(settings)
    run = subprocess.run(
        [sys.executable, "-c", TRACED_WRITE, str(tmp_path / "outbox.db")],
        cwd=ROOT,
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    spans = {s["span"]: s for s in found["spans"]}
    by_name: dict[str, list[dict[str, str]]] = defaultdict(list)
    for span in found["spans"]:
        by_name[span["name"]].append(span)
    [decide] = by_name["writer.decide"]
    [write] = by_name["outbox.write"]
    assert write["parent"] == decide["span"] and write["trace"] == found["writer"]
    publishes = [s for s in found["spans"] if s["name"].startswith("publish ")]
    assert len(publishes) == 2
    assert all(p["trace"] == found["writer"] and p["parent"] == write["span"] for p in publishes)
    stream = settings.topology.stream_for("proj-traced")
    for p in publishes:  # the messaging conventions' PRODUCER span of the send
        assert p["name"] == f"publish {stream}" and p["kind"] == "PRODUCER"
        attributes = p["attributes"]
        assert attributes["messaging.system"] == "kafka"
        assert attributes["messaging.destination.name"] == stream
        assert attributes["messaging.kafka.message.key"] == "proj-traced"
        assert isinstance(attributes["messaging.kafka.offset"], int)

    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=2)
    for message in messages:
        header = dict(message.headers() or [])["traceparent"]
        assert isinstance(header, bytes)
        traceparent = header.decode()
        _, trace_id, parent_span, _ = traceparent.split("-")
        assert trace_id == found["writer"]
        assert spans[parent_span]["name"] == f"publish {stream}"
        assert dict(message.headers() or [])["tracestate"] == b"vendor=abc"
