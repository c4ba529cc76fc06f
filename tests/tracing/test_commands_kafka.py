"""The long-running commands run observed: each installs its provider under its role's service
name, and one event's trace crosses the processes — ``produce --outbox`` (the root), ``publish``,
``consume`` — through the records' headers. Exported with the console exporter (stderr) here; the
OTLP path across the fleet is tests/tracing's end-to-end test's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from router.settings import Settings
from router.wiring.provisioning import provision_environment
from tests.support.environment import run_cli, subprocess_env
from tests.support.pump import feed, serving, write_feed

pytestmark = pytest.mark.integration


def _spans(stderr: str) -> list[dict[str, Any]]:
    """The console exporter's spans: indented JSON objects, from a line "{" to a line "}"."""
    found: list[dict[str, Any]] = []
    lines: list[str] | None = None
    for line in stderr.splitlines():
        if line == "{":
            lines = []
        if lines is not None:
            lines.append(line)
            if line == "}":
                found.append(json.loads("\n".join(lines)))
                lines = None
    return found


def _service(span: dict[str, Any]) -> str:
    return str(span["resource"]["attributes"]["service.name"])


def test_the_commands_export_their_spans_under_their_roles_in_one_trace(
    settings: Settings, tmp_path: Path
) -> None:
    provision_environment(settings)
    env = subprocess_env(settings, OTEL_TRACES_EXPORTER="console")
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_") or k == "OTEL_TRACES_EXPORTER"}
    outbox = str(tmp_path / "outbox.sqlite")
    produced = run_cli(
        settings,
        "produce",
        "--outbox",
        outbox,
        "--projects",
        "1",
        "--events",
        "3",
        env=env,
        check=True,
    )
    published = run_cli(
        settings, "publish", "--outbox", outbox, "--until-empty", env=env, check=True
    )
    consumed = run_cli(
        settings,
        "consume",
        "--subscription",
        "ledger",
        "--until-idle",
        "2",
        env=env,
        check=True,
    )
    spans = {
        name: _spans(run.stderr)
        for name, run in (("produce", produced), ("publish", published), ("consume", consumed))
    }
    assert {_service(s) for s in spans["produce"]} == {"rhumbatron-producer"}
    assert {_service(s) for s in spans["publish"]} == {"rhumbatron-publisher"}
    assert {_service(s) for s in spans["consume"]} == {"rhumbatron-ledger"}

    roots = [s for s in spans["produce"] if s["name"].startswith("write ")]
    assert roots and all(s["parent_id"] is None for s in roots)
    traces = {s["context"]["trace_id"] for s in roots}
    publishes = [s for s in spans["publish"] if s["name"].startswith("publish ")]
    assert len(publishes) == 3 and {s["context"]["trace_id"] for s in publishes} <= traces
    assert all(s["kind"] == "SpanKind.PRODUCER" for s in publishes)
    applies = [s for s in spans["consume"] if s["name"].startswith("apply ")]
    assert len(applies) == 3
    assert {s["context"]["trace_id"] for s in applies} <= traces  # the events' own traces
    by_id = {s["context"]["span_id"]: s for s in publishes}
    assert all(s["parent_id"] in by_id for s in applies)
    batches = [s for s in spans["consume"] if s["name"].startswith("process ")]
    assert batches and all(s["kind"] == "SpanKind.CONSUMER" for s in batches)
    linked = {link["context"]["span_id"] for b in batches for link in b["links"]}
    assert set(by_id) <= linked
    assert os.environ.get("OTEL_TRACES_EXPORTER") is None  # nothing leaked into this process


def test_the_pumps_batches_parent_their_events_publishes_which_consumers_continue(
    settings: Settings, tmp_path: Path
) -> None:
    provision_environment(settings)
    env = subprocess_env(settings, OTEL_TRACES_EXPORTER="console")
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_") or k == "OTEL_TRACES_EXPORTER"}
    path = write_feed(tmp_path / "feed.ndjson", feed("traced", 4, projects=2))
    with serving(path, page_size=10) as server:
        pumped = run_cli(settings, "pump", "--feed", server.url, "--once", env=env, check=True)
    consumed = run_cli(
        settings, "consume", "--subscription", "ledger", "--until-idle", "2", env=env, check=True
    )
    pump_spans, consume_spans = _spans(pumped.stderr), _spans(consumed.stderr)
    assert {_service(s) for s in pump_spans} == {"rhumbatron-pump"}
    batches = [s for s in pump_spans if s["name"] == "pump batch"]
    publishes = [s for s in pump_spans if s["name"].startswith("publish ")]
    assert len(publishes) == 4 and batches
    batch_ids = {s["context"]["span_id"] for s in batches}
    assert all(s["parent_id"] in batch_ids for s in publishes)
    applies = [s for s in consume_spans if s["name"].startswith("apply ")]
    by_id = {s["context"]["span_id"] for s in publishes}
    assert len(applies) == 4 and all(s["parent_id"] in by_id for s in applies)
