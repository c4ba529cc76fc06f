"""The audit-archiver on the real broker and Redis, run as ``rhumbatron consume`` subprocesses, with
its parts in a local directory; a SIGKILL right after a part was recorded; a fold rebuilt from the
archive after the broker deleted the records it needs."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from consumers.runtime.types import JSON, TP, BaseProcessor, EffectKind
from router.settings import Settings
from router.wiring.archive import count_parts, object_store
from router.wiring.subscription import controls, redis_client
from streams.admin import admin_client
from streams.clock import SystemClock
from streams.envelopes import Event
from streams.workload import slotted_events, workload
from tests.support.environment import ROOT, subprocess_env
from tests.support.runtime_processes import cli, publish, runtime_settings

pytestmark = pytest.mark.integration

TODAY = datetime.now(UTC).date()


@pytest.fixture
def rs(settings: Settings, tmp_path: Path) -> Settings:
    return runtime_settings(
        settings, archive_dir=str(tmp_path), archive_part_max_events=40, batch_size=50
    )


def _events(run: str, projects: int, count: int) -> list[Event]:
    # All on today's date (UTC), whenever the test runs: `verify --day today` must see them all.
    start = datetime(TODAY.year, TODAY.month, TODAY.day, 0, 0, 1, tzinfo=UTC)
    return slotted_events(workload(run, projects, count), tenant_id="t", start=start)


def _consume(s: Settings, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "consume",
            "--subscription",
            "audit-archiver",
            "--until-idle",
            "4",
        ],
        cwd=ROOT,
        env=subprocess_env(s, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _verify(s: Settings) -> dict[str, Any]:
    result = cli(s, "archive", "verify", "--day", TODAY.isoformat(), "--json")
    report: dict[str, Any] = orjson.loads(result.stdout)
    return report


def _archived_ids(s: Settings) -> Counter[str]:
    import gzip

    objects = object_store(s)
    return Counter(
        orjson.loads(line)["event"]["eventId"]
        for key in objects.list("events/")
        for line in gzip.decompress(objects.get(key)).splitlines()
    )


def test_every_event_published_twice_is_archived_exactly_once(rs: Settings) -> None:
    events = _events("arch", 20, 400)
    cli(rs, "provision")
    publish(rs, events)
    publish(rs, events)
    proc = _consume(rs)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert "800 records, 400 applied, 400 duplicates" in err
    report = _verify(rs)
    assert (report["events"], report["duplicate_events"], report["bad_parts"]) == (400, 0, [])
    assert report["parts"] == count_parts(rs) >= 400 // 40
    assert _archived_ids(rs) == {e.event_id: 1 for e in events}


def test_sigkill_right_after_a_part_was_recorded_loses_nothing_and_doubles_nothing(
    rs: Settings,
) -> None:
    events = _events("archkill", 16, 320)
    cli(rs, "provision")
    publish(rs, events)
    publish(rs, events)
    victim = _consume(rs, RHUMBATRON_FAILPOINTS="runtime.after_store_commit@2")
    _, err = victim.communicate(timeout=180)
    assert victim.returncode == -signal.SIGKILL, err[-3000:]
    assert sum(_archived_ids(rs).values()) < len(events)  # it died mid-run
    again = _consume(rs)
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err[-3000:]
    report = _verify(rs)
    assert (report["events"], report["duplicate_events"], report["bad_parts"]) == (320, 0, [])
    assert _archived_ids(rs) == {e.event_id: 1 for e in events}


class Tally(BaseProcessor):
    """A fold with no effects: per project, the slots folded, in order."""

    slug: ClassVar[str] = "archive-tally"
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.NONE

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        return {"slots": [*(state or {"slots": []})["slots"], event.slot]}


def test_a_fold_past_the_streams_log_start_is_rebuilt_from_the_archive(rs: Settings) -> None:
    from confluent_kafka import TopicPartition

    events = _events("archfold", 12, 240)
    cli(rs, "provision")
    publish(rs, events)
    proc = _consume(rs)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]

    # The broker deletes the first half of every partition, as retention would.
    admin = admin_client(rs.kafka_config())
    cuts = []
    for topic in rs.topology.stream_names():
        for p in range(rs.partitions):
            tp = TP(topic, p)
            end = _end(rs, tp)
            if end > 1:
                cuts.append(TopicPartition(topic, p, end // 2))
    for future in admin.delete_records(cuts).values():
        future.result()

    client = redis_client(rs)
    ctl = controls(rs, Tally(), client, SystemClock())
    tps = [TP(c.topic, c.partition) for c in cuts]
    assert all(ctl.reader.log_start(tp) > 0 for tp in tps)
    states: dict[str, JSON] = {}
    for tp in tps:
        progress = ctl.store.load(tp)
        progress.acked_through = _end(rs, tp) - 1
        states.update(ctl.fold(tp, progress, progress.acked_through).states)
    expected: dict[str, list[int]] = {}
    for e in events:
        expected.setdefault(e.project_id, []).append(e.slot or 0)
    assert {p: s["slots"] for p, s in states.items()} == expected

    # Without the archive the same fold refuses, naming what is missing.
    from streams.errors import ControlRefused

    ctl.archive = None
    with pytest.raises(ControlRefused, match="no longer holds offsets"):
        ctl.fold(tps[0], ctl.store.load(tps[0]), _end(rs, tps[0]) - 1)


def _end(s: Settings, tp: TP) -> int:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": s.kafka_bootstrap, "group.id": "archive-test-watermarks"}
    )
    try:
        _, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(tp.topic, tp.partition), timeout=10
        )
        return int(high)
    finally:
        consumer.close()
