"""A rolling upgrade on the real broker and Redis: events from a newer writer (a field this code
does not know in the envelope and in the payload) go through a subscription process as before
and are archived with those fields; a fold of notes written at versions 1, 2 and 3 is rebuilt
from the archive, past the stream's log start, reading the newest version; the plain consume loop
(consumers.kafka_consumer) hands its handler the newest version too."""

from __future__ import annotations

import gzip
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import confluent_kafka
import orjson
import pytest
from confluent_kafka import TopicPartition

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from router.wiring.archive import object_store
from router.wiring.subscription import controls, redis_client
from streams.admin import admin_client
from streams.clock import SystemClock
from streams.envelopes import Event, build, encode
from streams.workload import slotted_events, workload
from tests.consumers.runtime.test_upcasting import NoteFold, expected_folds, note
from tests.support.environment import ROOT, subprocess_env
from tests.support.runtime_processes import cli, publish, run, runtime_settings
from tests.support.versioned_catalog import VERSIONED

pytestmark = pytest.mark.integration

TODAY = datetime.now(UTC).date()


@pytest.fixture
def rs(settings: Settings, tmp_path: Path) -> Settings:
    return runtime_settings(
        settings, archive_dir=str(tmp_path), archive_part_max_events=40, batch_size=50
    )


def _newer(ev: Event, n: int) -> Event:
    fields = {name: getattr(ev, name) for name in Event.model_fields}
    fields["payload"] = {**ev.payload, "colourOfTheDay": "red"}
    return build(Event, **fields, traceState={"vendor": [n, None]})


def _archive(s: Settings) -> dict[str, bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "consume", "--subscription", "audit-archiver"]
        + ["--until-idle", "4"],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    objects = object_store(s)
    out: dict[str, bytes] = {}
    for key in objects.list("events/"):
        for line in gzip.decompress(objects.get(key)).splitlines():
            envelope = orjson.loads(line)["event"]
            out[envelope["eventId"]] = orjson.dumps(envelope)
    return out


def _end(s: Settings, tp: TP) -> int:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": s.kafka_bootstrap, "group.id": "upcasting-test-watermarks"}
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
        return int(high)
    finally:
        consumer.close()


def test_a_newer_writers_events_pass_through_and_a_mixed_version_fold_rebuilds_from_the_archive(
    rs: Settings,
) -> None:
    start = datetime(TODAY.year, TODAY.month, TODAY.day, 0, 0, 1, tzinfo=UTC)
    plain = slotted_events(workload("fwd", 6, 60), tenant_id="t", start=start)
    newer = [_newer(e, n) for n, e in enumerate(plain)]
    cli(rs, "provision")
    publish(rs, newer)
    stats = run(rs, "ledger")
    assert stats["applied"] == len(newer) and stats["poison"] == 0
    ledger = read_ledger(connect(rs.redis_url, timeout=5), rs.env)
    assert ledger["counts"] == {e.event_id: 1 for e in newer}
    assert all(slots == list(range(1, 11)) for slots in ledger["projects"].values())

    # Notes written by three releases of a writer, then the broker deletes the older half.
    notes = [note(f"fwd-notes-{p}", n, 1 + n % 3) for n in range(1, 13) for p in range(3)]
    publish(rs, notes)
    archived = _archive(rs)
    for ev in [*newer, *notes]:
        assert archived[ev.event_id] == encode(ev, max_bytes=rs.max_envelope_bytes)

    tps = sorted({TP(*rs.topology.partition_of(e.project_id)) for e in notes})
    admin = admin_client(rs.kafka_config())  # kept: the futures complete through it
    deleted = admin.delete_records(
        [TopicPartition(tp.topic, tp.partition, _end(rs, tp) // 2) for tp in tps]
    )
    for future in deleted.values():
        future.result(timeout=60)
    ctl = controls(rs, NoteFold(), redis_client(rs), SystemClock())
    ctl.catalog = VERSIONED
    states = {}
    for tp in tps:
        assert ctl.reader.log_start(tp) > 0  # the fold needs the archive
        progress = ctl.store.load(tp)
        states.update(ctl.fold(tp, progress, _end(rs, tp) - 1).states)
    assert states == expected_folds(notes)


def test_the_plain_consume_loop_hands_each_event_upcast(rs: Settings) -> None:
    from consumers.kafka_consumer import drain

    notes = [note("loop-notes", n, 1 + n % 3) for n in range(1, 7)]
    cli(rs, "provision")
    publish(rs, notes)
    seen: list[Event] = []
    drain(
        rs.kafka_config(),
        group_id=f"upcasting-loop-{rs.env}",
        topics=rs.topology.stream_names(),
        handle=lambda event, message: seen.append(event),
        reject=lambda message, error: pytest.fail(f"rejected: {error}"),
        protocol=rs.group_protocol,
        session_timeout_ms=rs.session_timeout_ms,
        max_envelope_bytes=rs.max_envelope_bytes,
        batch_size=rs.batch_size,
        until_idle_s=2.0,
        join_timeout_s=rs.group_join_timeout_s,
        until=lambda: len(seen) >= len(notes),
        catalog=VERSIONED,
    )
    assert [e.event_id for e in seen] == [e.event_id for e in notes]
    assert {e.event_version for e in seen} == {3}
    assert [e.payload["title"] for e in seen] == [f"n{n}" for n in range(1, 7)]
