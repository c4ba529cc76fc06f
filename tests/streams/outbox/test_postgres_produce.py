"""``rhumbatron produce --outbox postgresql://…`` then ``publish``, through the command line: every
event arrives, dense and in slot order per project, read back from the streams (once; after an
outage, copies of what the publisher sent again may follow their originals); the writers' own
state change (their table, the same SQL on both backends) commits with their events. The
issue's full run (300 projects, 20,000 events) with the broker stopped and started again
mid-publish is the slow chaos case, on a private broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import confluent_kafka
import pytest

from router.settings import Settings
from streams.admin import admin_client, provision
from streams.outbox.store import RowState
from tests.support.environment import ROOT, make_settings, run_cli
from tests.support.infra import PrivateServices
from tests.support.kafka import events_of, read_all
from tests.support.outbox import OutboxBackend, cli_env, first_arrivals, records_in

pytestmark = pytest.mark.integration


def _cli(s: Settings, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *argv, env=cli_env(s), timeout=600)


def _provision(s: Settings) -> None:
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=60)


def _produce(
    s: Settings, pg: OutboxBackend, run: str, projects: int, events: int
) -> dict[str, Any]:
    made = _cli(
        s,
        "produce",
        "--outbox",
        pg.address,
        "--run",
        run,
        "--projects",
        str(projects),
        "--events",
        str(events),
        "--json",
    )
    assert made.returncode == 0, made.stderr
    report: dict[str, Any] = json.loads(made.stdout)
    assert report["events"] == events and report["duplicates"] == 0
    # The writers' own rows committed with their events: one per (writer, project), counting
    # every transaction (the upsert's update branch ran for all but the first of each).
    [(rows, writes)] = pg.query(
        "SELECT count(*), sum(writes) FROM synthetic_writer_state WHERE project_id LIKE "
        f"'proj-{run}-%'"
    )
    assert (rows, writes) == (projects, report["writes"]) and writes > projects
    return report


def _check_streams(
    messages: list[confluent_kafka.Message],
    run: str,
    projects: int,
    events: int,
    *,
    copies_allowed: int = 0,
) -> None:
    """Every event arrived, each project's slots first arrived as 1, 2, 3 … and any copy came after
    its original; at most ``copies_allowed`` copies (rows the publisher gave up on in flight
    during an outage and sent again: they may have landed the first time too)."""
    slots: dict[str, list[int]] = defaultdict(list)
    ids: set[str] = set()
    for event in events_of(messages):
        if event.project_id.startswith(f"proj-{run}-"):
            slots[event.project_id].append(event.slot or 0)
            ids.add(event.event_id)
    assert len(slots) == projects and len(ids) == events
    per = events // projects
    copies = 0
    for project, found in slots.items():
        first, copied = first_arrivals(found)
        copies += copied
        assert first == list(range(1, len(first) + 1)), project
        assert len(first) in (per, per + 1), project
    assert copies <= copies_allowed, f"{copies} copies, at most {copies_allowed} allowed"


def test_produce_then_publish_on_postgresql(settings: Settings, pg: OutboxBackend) -> None:
    _provision(settings)
    run, projects, events = "pgcli", 30, 1500
    _produce(settings, pg, run, projects, events)
    published = _cli(settings, "publish", "--outbox", pg.address, "--until-empty", "--json")
    assert published.returncode == 0, published.stderr
    summary = json.loads(published.stdout)
    assert summary["published"] == events and summary["failed"] == 0
    streams = settings.topology.stream_names()
    _check_streams(
        read_all(settings.kafka_bootstrap, streams, expect=events), run, projects, events
    )


@pytest.mark.slow
@pytest.mark.chaos
def test_the_issue_run_survives_a_broker_stopped_mid_publish(pg: OutboxBackend) -> None:
    run, projects, events = "pgdone", 300, 20_000
    with PrivateServices(redis=False) as services:
        s = make_settings(
            kafka_bootstrap=services.bootstrap,
            outbox_delivery_timeout_s=2.0,
            outbox_backoff_initial_s=0.2,
            outbox_backoff_max_s=1.0,
            # Small passes, so the stop lands in the middle of the publish.
            outbox_rows_per_project_per_pass=2,
        )
        _provision(s)
        _produce(s, pg, run, projects, events)
        store = pg.store()
        publish = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "publish", "--outbox", pg.address]
            + ["--until-empty", "--json"],
            cwd=ROOT,
            env=cli_env(s),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 300
            while store.counts()[RowState.PUBLISHED] < events // 5:
                assert publish.poll() is None, publish.communicate()
                assert time.monotonic() < deadline, "the publish never got going"
                time.sleep(0.05)
            services.kafka_stop()
            waiting_seen = 0
            until = time.monotonic() + 6
            while time.monotonic() < until:
                counts = store.counts()
                assert counts[RowState.FAILED] == 0
                waiting_seen = max(waiting_seen, counts[RowState.RETRY_WAIT])
                time.sleep(0.2)
            assert counts[RowState.PUBLISHED] < events  # the stop really interrupted it
            assert waiting_seen > 0  # rows waited out the outage in retry_wait
            services.kafka_start()
            out, err = publish.communicate(timeout=600)
        finally:
            if publish.poll() is None:
                publish.kill()
                publish.wait(30)
        assert publish.returncode == 0, err
        summary = json.loads(out)
        assert summary["failed"] == 0 and summary["deferred"] > 0
        counts = store.counts()
        assert counts[RowState.PUBLISHED] == events and counts[RowState.FAILED] == 0
        streams = s.topology.stream_names()
        held = records_in(services.bootstrap, streams)
        messages = read_all(services.bootstrap, streams, expect=held)
        assert len(messages) == held
        _check_streams(messages, run, projects, events, copies_allowed=summary["deferred"])
