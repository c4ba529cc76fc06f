"""The audit-archiver on the in-memory runtime: every event in exactly one part under duplicates,
any batch cuts and a crash at every boundary; deterministic parts and keys; verify; expire; the
archive as the long-term log for folds."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.controls import Controls, MemoryAuditLog
from consumers.runtime.memory_transport import MemoryReader, cuts_from
from consumers.runtime.types import JSON, TP, BaseProcessor, EffectKind, Record
from consumers.subscriptions.archive.archiver import AuditArchiver, PartLimits
from consumers.subscriptions.archive.format import IndexEntry, PartKey, compress, decode_line
from consumers.subscriptions.archive.ops import count_parts, expire, verify_day
from consumers.subscriptions.archive.reader import StoreArchiveReader
from consumers.subscriptions.archive.store import LocalObjectStore
from streams.envelopes import Event, build, decode_event
from streams.errors import ArchiveFormatError, ArchiveIncomplete, ControlRefused
from streams.ids import stable_event_id
from tests.support.archive import MemoryObjects
from tests.support.runtime_harness import LIMIT, PARTITIONS, STREAMS, Crash, World, event

PROJECTS = ["alpha", "beta", "gamma", "delta", "eps"]
STREAM_INDEX = {name: n for n, name in enumerate(STREAMS)}
DAY = date(2026, 1, 1)
KEY = re.compile(r"^events/\d{4}-\d{2}-\d{2}/stream-\d{2}/part-\d+-p\d+-[0-9a-f]{24}\.ndjson\.gz$")


def archiver(objects: Any, events: int = 7, max_bytes: int = 1 << 20, age: float = 60.0) -> Any:
    return AuditArchiver(
        objects, PartLimits(events, max_bytes, age), STREAM_INDEX, max_envelope_bytes=LIMIT
    )


def fill(world: World, per_project: int = 6, *, twice: bool = False) -> list[Event]:
    out = []
    for n in range(1, per_project + 1):
        for p in PROJECTS:
            ev = event(p, n)
            world.publish(ev)
            if twice:
                world.publish(ev)
            out.append(ev)
    return out


def archived_lines(objects: Any) -> list[dict[str, Any]]:
    lines = []
    for key in objects.list("events/"):
        for raw in gzip.decompress(objects.get(key)).splitlines():
            lines.append(orjson.loads(raw) | {"_key": key})
    return lines


def archived_lines_raw(objects: Any) -> list[bytes]:
    return [
        raw + b"\n"
        for key in objects.list("events/")
        for raw in gzip.decompress(objects.get(key)).splitlines()
    ]


def archived_ids(objects: Any) -> Counter[str]:
    return Counter(line["event"]["eventId"] for line in archived_lines(objects))


def run(world: World, proc: Any, **kw: Any) -> None:
    runner = world.runner(proc, **kw)
    world.drain(runner)
    runner.close()


# -- exactly once --------------------------------------------------------------------------------


def test_every_event_is_in_exactly_one_part_at_its_source_position_when_published_twice(
    tmp_path: Path,
) -> None:
    world = World()
    events = fill(world, twice=True)
    objects = LocalObjectStore(tmp_path)
    run(world, archiver(objects))
    assert archived_ids(objects) == Counter(e.event_id for e in events)
    for line in archived_lines(objects):
        record = world.log.read(TP(line["topic"], line["partition"]), line["offset"], 1)[0]
        assert orjson.dumps(line["event"]) == record.value  # the canonical envelope, as published
        key = PartKey.parse(line["_key"])
        assert (STREAMS[key.stream], key.partition) == (line["topic"], line["partition"])
    report = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert report.ok and report.events == len(events) and report.duplicates == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=30),
    st.integers(1, 12),
    st.booleans(),
)
def test_any_batch_cuts_and_part_sizes_archive_every_event_once(
    cuts: list[int], size: int, twice: bool
) -> None:
    world = World()
    events = fill(world, twice=twice)
    objects = MemoryObjects()
    run(world, archiver(objects, events=size), cuts=cuts_from(cuts))
    assert archived_ids(objects) == Counter(e.event_id for e in events)
    # A part closes when it reached the limit (the runtime asks after each batch), or at the end.
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for key in objects.list("index/"):
        entry = IndexEntry.parse(key)
        assert entry is not None
        lines = len(gzip.decompress(objects.get(entry.part)).splitlines())
        by_partition.setdefault(entry.stream * 10 + entry.partition, []).append(
            (entry.first, lines)
        )
    for parts in by_partition.values():
        assert all(lines >= size for _, lines in sorted(parts)[:-1])


BOUNDARIES = [
    "runtime.before_store_commit",
    "runtime.after_store_commit",
    "runtime.after_part_write",
]


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("nth", [1, 2, 4])
def test_a_crash_at_any_boundary_loses_nothing_and_doubles_nothing(boundary: str, nth: int) -> None:
    world = World()
    events = fill(world, twice=True)
    objects = MemoryObjects()
    hits = {"n": 0}

    def crash(name: str) -> None:
        if name == boundary:
            hits["n"] += 1
            if hits["n"] == nth:
                raise Crash(name)

    first = world.runner(archiver(objects, events=5), cuts=cuts_from([4] * 100), failpoint=crash)
    with pytest.raises(Crash):
        world.drain(first)
    second = world.runner(archiver(objects, events=5), cuts=cuts_from([3] * 100))
    world.drain(second)
    second.close()
    assert archived_ids(objects) == Counter(e.event_id for e in events)
    report = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert report.ok, report.bad  # every part has its index entry, even after the crash
    if boundary == "runtime.after_store_commit":
        assert second.stats.recovered == 1  # the recorded part was written by the next owner


def test_an_open_part_closes_on_age_and_every_part_is_bounded_in_bytes() -> None:
    world = World()
    events = fill(world, per_project=3)
    objects = MemoryObjects()
    proc = archiver(objects, events=1000, max_bytes=1500, age=30)
    runner = world.runner(proc, cuts=cuts_from([1] * 100))  # the runtime asks after each batch
    world.drain(runner, tick=0.0)
    longest = max(len(line) for line in archived_lines_raw(objects))
    sizes = [len(gzip.decompress(objects.get(k))) for k in objects.list("events/")]
    assert sizes and all(1500 <= s < 1500 + longest for s in sizes)  # closed at the first past
    assert sum(archived_ids(objects).values()) < len(events)  # the rest wait in open parts
    world.clock.advance(31)
    runner.run_once(timeout=0)
    assert archived_ids(objects) == Counter(e.event_id for e in events)


# -- keys and bytes ------------------------------------------------------------------------------


def test_parts_are_deterministic_and_named_by_day_stream_first_time_partition_and_hash() -> None:
    blobs = []
    for _ in range(2):
        world = World()
        fill(world)
        objects = MemoryObjects()
        run(world, archiver(objects, events=4), cuts=cuts_from([3] * 100))
        blobs.append({k: v for k, v in objects.objects.items() if k.startswith("events/")})
    assert blobs[0] == blobs[1] and blobs[0]
    for key, blob in blobs[0].items():
        assert KEY.match(key), key
        assert blob[4:8] == b"\0\0\0\0"  # gzip mtime 0
        content = gzip.decompress(blob)
        part = PartKey.parse(key)
        assert part.hash == hashlib.sha256(content).hexdigest()[:24]
        first = decode_event(
            orjson.dumps(orjson.loads(content.splitlines()[0])["event"]), max_bytes=LIMIT
        )
        first_ms = int(first.timestamp.timestamp() * 1000)
        assert part.first_ms == first_ms
        assert part.day == datetime.fromtimestamp(first_ms / 1000, UTC).date().isoformat()
        assert content.endswith(b"\n")


def test_finish_gives_the_same_key_and_bytes_for_the_same_lines() -> None:
    from consumers.runtime.parts import Line

    proc = archiver(MemoryObjects())
    lines = [Line(n, 1_767_225_600_000 + n, b'{"n":%d}' % n) for n in range(3)]
    a = proc.finish(TP("s1", 1), lines)
    b = proc.finish(TP("s1", 1), list(lines))
    assert a == b
    assert a[0].startswith("events/2026-01-01/stream-01/part-1767225600000-p1-")
    with pytest.raises(ArchiveFormatError, match="not an event stream"):
        proc.finish(TP("elsewhere", 0), lines)


def test_a_part_stored_after_its_finish_and_one_recovered_after_a_crash_get_the_same_index_entry() -> (
    None
):
    """The archiver remembers a finished part's lowest and highest offset for its store; the
    pending copy a crash left is read instead. Both give one entry, also for lines out of offset
    order (an operator's redelivery) and for another part finished in between."""
    from consumers.runtime.parts import Line
    from consumers.subscriptions.archive.format import line_of, line_prefix
    from streams.envelopes import encode

    tp = TP(STREAMS[1], 1)
    prefix = line_prefix(tp)

    def lines_at(*offsets: int) -> list[Line]:
        out = []
        for offset in offsets:
            ev = event("alpha", offset)
            data = line_of(prefix, offset, encode(ev, max_bytes=LIMIT))
            out.append(Line(offset, int(ev.timestamp.timestamp() * 1000), data))
        return out

    remembered, recovered = MemoryObjects(), MemoryObjects()
    proc = archiver(remembered)
    key, blob = proc.finish(tp, lines_at(5, 3, 9))
    proc.store(key, blob)
    archiver(recovered).store(key, blob)
    other_key, other_blob = proc.finish(tp, lines_at(12, 11))  # finished, then a crash
    proc.store(key, blob)  # the earlier part again: this part's bounds are not the other's
    proc.store(other_key, other_blob)
    archiver(recovered).store(other_key, other_blob)
    entries = sorted(k for k in remembered.list("index/"))
    assert entries == sorted(k for k in recovered.list("index/"))
    parsed = [IndexEntry.parse(k) for k in entries]
    assert sorted((e.first, e.last) for e in parsed if e is not None) == [(3, 9), (11, 12)]
    assert len(parsed) == 2


def test_a_line_holds_the_canonical_envelope_whatever_form_its_record_came_in() -> None:
    """The archiver writes a canonical record's value as it came (the runtime checked it is the
    event's encoding) and encodes any other: spaced, keys reordered, escaped."""
    import json

    from streams.envelopes import encode

    world = World()
    events = [event(p, n) for n in range(1, 4) for p in PROJECTS]
    forms: list[Callable[[bytes], bytes]] = [
        lambda raw: raw,
        lambda raw: json.dumps(orjson.loads(raw)).encode(),
        lambda raw: orjson.dumps(dict(reversed(orjson.loads(raw).items()))),
        lambda raw: json.dumps(
            orjson.loads(raw), ensure_ascii=True, separators=(",", ":")
        ).encode(),
    ]
    for n, ev in enumerate(events):
        world.publish(ev, forms[n % len(forms)](encode(ev, max_bytes=LIMIT)))
    objects = MemoryObjects()
    run(world, archiver(objects, events=4))
    lines = [
        line
        for key in objects.list("events/")
        for line in gzip.decompress(objects.get(key)).splitlines()
    ]
    canonical = {encode(ev, max_bytes=LIMIT) for ev in events}
    written = {line[line.index(b',"event":') + len(b',"event":') : -1] for line in lines}
    assert len(lines) == len(events) and written == canonical


# -- verify ----------------------------------------------------------------------------------------


def _archive_of_one_day(tmp_path: Path) -> tuple[LocalObjectStore, list[Event]]:
    world = World()
    events = fill(world)
    objects = LocalObjectStore(tmp_path)
    run(world, archiver(objects, events=4))
    return objects, events


def test_verify_reports_parts_and_events_and_finds_a_flipped_byte(tmp_path: Path) -> None:
    objects, events = _archive_of_one_day(tmp_path)
    good = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert good.ok and good.events == len(events) and good.parts == count_parts(objects, DAY)
    victim = next(objects.list("events/"))
    blob = bytearray(objects.get(victim))
    blob[len(blob) // 2] ^= 0x01
    objects.put(victim, bytes(blob))
    report = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert [b.key for b in report.bad] == [victim]
    assert report.parts == good.parts - 1
    assert report.to_json()["ok"] is False


def test_verify_finds_a_part_whose_content_does_not_match_its_key(tmp_path: Path) -> None:
    objects, _ = _archive_of_one_day(tmp_path)
    victim = next(objects.list("events/"))
    lines = gzip.decompress(objects.get(victim)).splitlines()
    objects.put(victim, compress(b"\n".join(lines[:-1]) + b"\n", 6))  # a line went missing
    report = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert len(report.bad) == 1 and report.bad[0].key == victim
    assert "does not match the key" in report.bad[0].reason


def test_verify_finds_a_part_without_its_index_entry(tmp_path: Path) -> None:
    objects, _ = _archive_of_one_day(tmp_path)
    entry = next(objects.list("index/"))
    objects.delete(entry)
    report = verify_day(objects, DAY, max_envelope_bytes=LIMIT, streams=STREAM_INDEX)
    assert len(report.bad) == 1 and "no index entry" in report.bad[0].reason
    assert report.bad[0].key == IndexEntry.parse(entry).part  # type: ignore[union-attr]


# -- expire ----------------------------------------------------------------------------------------


def _event_on(day: date, project: str, n: int) -> Event:
    return build(
        Event,
        event_id=stable_event_id(project, "task.completed", f"{day}-{n}"),
        event_type="task.completed",
        tenant_id="tenant",
        project_id=project,
        actor="test",
        timestamp=datetime(day.year, day.month, day.day, 12, tzinfo=UTC) + timedelta(seconds=n),
        payload={"n": n},
    )


def _archive_over_days(objects: Any, days: list[date]) -> World:
    world = World()
    for day in days:
        for n in range(3):
            for p in PROJECTS:
                world.publish(_event_on(day, p, n))
        # parts close at the end of each day's events: one part per partition per day
        run_once = world.runner(archiver(objects, events=10_000))
        world.drain(run_once)
        run_once.close()
    return world


def test_expire_deletes_exactly_the_days_older_than_the_retention(tmp_path: Path) -> None:
    today = date(2026, 3, 1)
    days = [today - timedelta(days=d) for d in (45, 31, 30, 29, 0)]
    objects = LocalObjectStore(tmp_path)
    _archive_over_days(objects, days)
    before = {d: count_parts(objects, d) for d in days}
    assert all(before.values())
    dry = expire(objects, today=today, retention_days=30, dry_run=True)
    assert dry.parts == before[days[0]] + before[days[1]]
    assert {d: count_parts(objects, d) for d in days} == before  # a dry run deletes nothing
    progress: list[tuple[int, int]] = []
    report = expire(
        objects, today=today, retention_days=30, progress=lambda d, t: progress.append((d, t))
    )
    assert report.days == [days[0].isoformat(), days[1].isoformat()]
    assert report.parts == dry.parts and report.kept == sum(before[d] for d in days[2:])
    assert {d: count_parts(objects, d) for d in days} == {
        **before,
        days[0]: 0,
        days[1]: 0,
    }
    assert progress[-1] == (report.parts, report.parts)
    assert not (tmp_path / "events" / days[0].isoformat()).exists()  # empty day directories go
    remaining = [IndexEntry.parse(k) for k in objects.list("index/")]
    assert {e.day for e in remaining if e} == {d.isoformat() for d in days[2:]}
    assert verify_day(objects, days[2], max_envelope_bytes=LIMIT).ok
    again = expire(objects, today=today, retention_days=30)
    assert again.parts == 0  # a second run finds nothing more


def test_expire_leaves_keys_that_are_not_archive_parts(tmp_path: Path) -> None:
    objects = LocalObjectStore(tmp_path)
    objects.put("events/2020-01-01/notes.txt", b"keep me")
    report = expire(objects, today=date(2026, 3, 1), retention_days=30)
    assert report.unrecognised == ["events/2020-01-01/notes.txt"]
    assert objects.get("events/2020-01-01/notes.txt") == b"keep me"


# -- the archive as the long-term log --------------------------------------------------------------


def test_the_reader_yields_archived_records_by_offset_range_with_their_offsets() -> None:
    world = World()
    fill(world, per_project=8, twice=True)
    objects = MemoryObjects()
    run(world, archiver(objects, events=3), cuts=cuts_from([5] * 100))
    reader = StoreArchiveReader(objects, STREAM_INDEX)
    for topic in STREAMS:
        for p in range(PARTITIONS):
            tp = TP(topic, p)
            log = world.log.read(tp, 0, 10_000)
            firsts: dict[str, Record] = {}
            for r in log:
                firsts.setdefault(decode_event(r.value, max_bytes=LIMIT).event_id, r)
            originals = sorted(firsts.values(), key=lambda r: r.offset)  # duplicates not archived
            if not originals:
                continue
            lo, hi = 2, len(log) - 3
            got = list(reader.read(tp, lo, hi))
            want = [r for r in originals if lo <= r.offset <= hi]
            assert [(r.offset, r.value, r.key) for r in got] == [
                (r.offset, r.value, r.key) for r in want
            ]
            assert all(r.topic == topic and r.partition == p for r in got)


def test_the_reader_refuses_what_the_archive_cannot_hold() -> None:
    world = World()
    fill(world, per_project=4)
    objects = MemoryObjects()
    run(world, archiver(objects, events=3))
    tp = next(
        tp for tp in (TP(s, p) for s in STREAMS for p in range(PARTITIONS)) if world.log.end(tp)
    )
    behind = StoreArchiveReader(objects, STREAM_INDEX, archived_through=lambda _: 1)
    with pytest.raises(ArchiveIncomplete, match="written through offset 1"):
        list(behind.read(tp, 0, 3))
    with pytest.raises(ArchiveIncomplete, match="no part"):
        list(StoreArchiveReader(MemoryObjects(), STREAM_INDEX).read(tp, 0, 3))
    # expiry of the oldest day marks the partition: a read of those offsets refuses
    expire(objects, today=DAY + timedelta(days=40), retention_days=30)
    with pytest.raises(ArchiveIncomplete, match="deleted by expiry"):
        list(StoreArchiveReader(objects, STREAM_INDEX).read(tp, 0, 3))
    assert isinstance(ArchiveIncomplete("x"), ControlRefused)


class Tally(BaseProcessor):
    """A fold with no effects: per project, how many events and which n in what order."""

    slug: ClassVar[str] = "tally"
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        s = dict(state or {"count": 0, "seen": []})
        return {"count": s["count"] + 1, "seen": [*s["seen"], event.payload["n"]]}


def _retention(world: World, keep_last: int) -> MemoryReader:
    """A reader of the log whose retention deleted all but the last ``keep_last`` records."""
    reader = MemoryReader(world.log)
    for s in STREAMS:
        for p in range(PARTITIONS):
            reader.start[TP(s, p)] = max(world.log.end(TP(s, p)) - keep_last, 0)
    return reader


def _controls(world: World, reader: MemoryReader, archive: Any) -> Controls:
    return Controls(
        Tally(),
        world.store,
        reader,
        MemoryAuditLog(),
        world.dead,
        world.clock,
        LIMIT,
        archive=archive,
    )


def test_re_reduce_reads_the_offsets_below_the_log_start_from_the_archive() -> None:
    archived = World()
    fill(archived, per_project=10, twice=True)
    objects = MemoryObjects()
    run(archived, archiver(objects, events=6))
    folded = World(log=archived.log)  # the fold's own store, over the same streams
    run(folded, Tally())
    expected = folded.states()
    assert sum(s["count"] for s in expected.values()) == 10 * len(PROJECTS)

    reader = _retention(folded, keep_last=4)
    tps = [TP(s, p) for s in STREAMS for p in range(PARTITIONS) if folded.log.end(TP(s, p))]
    with pytest.raises(ControlRefused, match="no archive reader"):
        _controls(folded, reader, None).re_reduce(tps[0], who="test", why="no archive")

    archive = StoreArchiveReader(
        objects, STREAM_INDEX, archived_through=lambda tp: archived.store.load(tp).acked_through
    )
    controls = _controls(folded, reader, archive)
    for tp in tps:
        folded.store.replace_fold(tp, None, _cursor(folded, tp), folded.store.load(tp), {})
    assert folded.states() == {}
    for tp in tps:
        controls.re_reduce(tp, who="test", why="rebuild from the archive")
    assert folded.states() == expected
    assert archive.parts_read > 0


def test_a_new_subscriptions_first_fold_replays_the_archive_then_continues_from_the_stream() -> (
    None
):
    archived = World()
    fill(archived, per_project=10)
    objects = MemoryObjects()
    run(archived, archiver(objects, events=6))
    reference = World(log=archived.log)
    run(reference, Tally())

    late = World(log=archived.log)  # a subscription created after retention deleted old records
    reader = _retention(late, keep_last=3)
    archive = StoreArchiveReader(
        objects, STREAM_INDEX, archived_through=lambda tp: archived.store.load(tp).acked_through
    )
    controls = _controls(late, reader, archive)
    for tp, start in reader.start.items():
        if start > 0:
            # A forward reprocess_from is refused (it would fold without effects, unrecorded);
            # first_fold is the control that folds lost history from the archive.
            with pytest.raises(ControlRefused, match="takes an offset in"):
                controls.reprocess_from(tp, start, 0, who="test", why="forward")
            controls.first_fold(tp)
    run(late, Tally())
    assert late.states() == reference.states()
    assert archive.parts_read > 0


def _cursor(world: World, tp: TP) -> tuple[int, int]:
    p = world.store.load(tp)
    return p.acked_through, p.cursor_revision


def test_a_line_holds_position_and_event() -> None:
    world = World()
    ev = event("alpha", 1)
    offset = world.publish(ev)
    objects = MemoryObjects()
    run(world, archiver(objects, events=1))
    (key,) = list(objects.list("events/"))
    line = decode_line(gzip.decompress(objects.get(key)).rstrip(b"\n"), where=key)
    tp = world.tp_of("alpha")
    assert (line.topic, line.partition, line.offset, line.project) == (
        tp.topic,
        tp.partition,
        offset,
        "alpha",
    )
    assert decode_event(line.event, max_bytes=LIMIT) == ev


def test_store_refuses_a_part_whose_lines_are_not_archive_lines() -> None:
    objects = MemoryObjects()
    proc = archiver(objects)
    key = "events/2026-01-01/stream-00/part-1767225600000-p0-" + "0" * 24 + ".ndjson.gz"
    with pytest.raises(ArchiveFormatError, match="line 2: not valid JSON"):
        proc.store(key, compress(b'{"topic":"s0","partition":0,"offset":1,"event":{}}\nnope\n', 6))
    with pytest.raises(ArchiveFormatError, match="line 1: field 'offset' must be a int"):
        proc.store(key, compress(b'{"topic":"s0","partition":0,"offset":"1","event":{}}\n', 6))
    with pytest.raises(ArchiveFormatError, match="is not a part key"):
        proc.store("events/elsewhere.gz", compress(b"{}\n", 6))
    assert objects.objects == {}  # nothing written
