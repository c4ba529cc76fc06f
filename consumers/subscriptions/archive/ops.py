"""Operations over the archive: verify a day's parts, expire old days, count parts.

They work on any :class:`ObjectStore` and take the day and the time from their caller, so tests
drive them with an injected clock. Long sweeps report progress through a callback.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from consumers.subscriptions.archive.format import (
    IndexEntry,
    PartKey,
    content_hash,
    day_of,
    decode_line,
    decompress,
    event_of,
    expired_key,
    index_prefix,
)
from consumers.subscriptions.archive.store import ObjectStore
from streams.errors import ArchiveFormatError, ArchiveStoreError

# Called with (done, total) as a sweep goes.
Progress = Callable[[int, int], None]


def _quiet(done: int, total: int) -> None:
    return None


@dataclass
class BadPart:
    key: str
    reason: str


@dataclass
class VerifyReport:
    day: str
    parts: int = 0
    events: int = 0
    bad: list[BadPart] = field(default_factory=list)
    duplicates: int = 0  # events (by id) found in more than one line of the day's good parts
    by_stream: dict[str, int] = field(default_factory=dict)  # "stream-NN" -> events
    looked_in: str = ""  # where the day's parts were listed: the store and the key prefix

    @property
    def empty(self) -> bool:
        return not self.parts and not self.bad

    @property
    def ok(self) -> bool:
        # A day with no parts proves nothing (an archive directory relative to another folder, a
        # wrong environment, a day nothing was archived): it does not pass.
        return not self.bad and self.parts > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "parts": self.parts,
            "events": self.events,
            "duplicate_events": self.duplicates,
            "bad_parts": [{"key": b.key, "reason": b.reason} for b in self.bad],
            "events_by_stream": dict(sorted(self.by_stream.items())),
            "looked_in": self.looked_in,
            "ok": self.ok,
        }


def day_prefix(day: date | None) -> str:
    """The key prefix of a day's parts (of every part with no day)."""
    return f"events/{day.isoformat()}/" if day is not None else "events/"


def part_keys(objects: ObjectStore, day: date | None = None) -> list[str]:
    return list(objects.list(day_prefix(day)))


def count_parts(objects: ObjectStore, day: date | None = None) -> int:
    """Parts in the archive (of one day, or all)."""
    return sum(1 for key in part_keys(objects, day) if _parses(key))


def _parses(key: str) -> bool:
    try:
        PartKey.parse(key)
    except ArchiveFormatError:
        return False
    return True


def _check_part(
    objects: ObjectStore,
    key: str,
    day: str,
    *,
    max_envelope_bytes: int,
    streams: Mapping[str, int] | None,
    indexed: set[str],
) -> list[str]:
    """The event ids of a good part; raises ArchiveFormatError / ArchiveStoreError naming the
    first thing wrong with a bad one."""
    part = PartKey.parse(key)
    if part.day != day:
        raise ArchiveFormatError(f"filed under day {part.day}, not {day}")
    content = decompress(objects.get(key), key=key)
    actual = content_hash(content)
    if actual != part.hash:
        raise ArchiveFormatError(
            f"content hash {actual} does not match the key's {part.hash} (altered or corrupt)"
        )
    ids: list[str] = []
    lines = content.splitlines()
    if not lines:
        raise ArchiveFormatError("holds no line")
    for n, raw in enumerate(lines):
        where = f"line {n + 1}"
        line = decode_line(raw, where=where)
        event = event_of(line, max_bytes=max_envelope_bytes, where=where)
        if line.partition != part.partition:
            raise ArchiveFormatError(
                f"{where}: from partition {line.partition}, in a part of partition {part.partition}"
            )
        if streams is not None and streams.get(line.topic) != part.stream:
            raise ArchiveFormatError(
                f"{where}: from topic {line.topic!r}, which is not stream {part.stream:02d}"
            )
        if n == 0:
            first_ms = int(event.timestamp.timestamp() * 1000)
            if first_ms != part.first_ms or day_of(first_ms) != part.day:
                raise ArchiveFormatError(
                    f"first event's time {first_ms} ms does not match the key's {part.first_ms}"
                )
        ids.append(event.event_id)
    if part.name not in indexed:
        raise ArchiveFormatError(
            "has no index entry, so replays from the archive cannot find it "
            "(its write was interrupted before the runtime recorded it done?)"
        )
    return ids


def verify_day(
    objects: ObjectStore,
    day: date,
    *,
    max_envelope_bytes: int,
    streams: Mapping[str, int] | None = None,
    progress: Progress = _quiet,
) -> VerifyReport:
    """Read every part of ``day`` back and check it: gzip, the key's hash over the uncompressed
    content, every line a valid event from the key's stream and partition, the first event's
    time in the key, an index entry for it. Counts parts, events and duplicate events. A day
    with no parts is not ``ok``; ``looked_in`` says where they were looked for."""
    report = VerifyReport(day.isoformat())
    report.looked_in = f"{objects.describe()}, keys {day_prefix(day)}*"
    keys = part_keys(objects, day)
    indexed = _indexed_names(objects, keys)
    seen: Counter[str] = Counter()
    for n, key in enumerate(keys, 1):
        try:
            ids = _check_part(
                objects,
                key,
                report.day,
                max_envelope_bytes=max_envelope_bytes,
                streams=streams,
                indexed=indexed,
            )
        except (ArchiveFormatError, ArchiveStoreError) as exc:
            report.bad.append(BadPart(key, str(exc)))
        else:
            report.parts += 1
            report.events += len(ids)
            seen.update(ids)
            stream = key.split("/")[2]
            report.by_stream[stream] = report.by_stream.get(stream, 0) + len(ids)
        progress(n, len(keys))
    report.duplicates = sum(c - 1 for c in seen.values() if c > 1)
    return report


def _indexed_names(objects: ObjectStore, keys: list[str]) -> set[str]:
    """Part file names with an index entry, over the partitions these keys belong to."""
    prefixes = set()
    for key in keys:
        if _parses(key):
            part = PartKey.parse(key)
            prefixes.add(index_prefix(part.stream, part.partition))
    names = set()
    for prefix in sorted(prefixes):
        for key in objects.list(prefix):
            entry = IndexEntry.parse(key)
            if entry is not None:
                names.add(entry.name)
    return names


@dataclass
class ExpireReport:
    cutoff: str  # parts of days before this one are deleted
    parts: int = 0  # parts deleted (or, in a dry run, that would be)
    days: list[str] = field(default_factory=list)
    index_entries: int = 0
    kept: int = 0
    unrecognised: list[str] = field(default_factory=list)  # keys under events/ not in our format
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff,
            "dry_run": self.dry_run,
            "parts_deleted": self.parts,
            "days_deleted": self.days,
            "index_entries_deleted": self.index_entries,
            "parts_kept": self.kept,
            "unrecognised_keys": self.unrecognised,
        }


def expire(
    objects: ObjectStore,
    *,
    today: date,
    retention_days: int,
    dry_run: bool = False,
    progress: Progress = _quiet,
) -> ExpireReport:
    """Delete every part whose day (from its key) is more than ``retention_days`` before
    ``today``, with its index entry. Before deleting, each partition's expiry mark is raised to
    the highest offset deleted, so a replay that would need those offsets refuses instead of
    folding a partial log. Keys that are not in the archive's format are reported, never
    deleted."""
    if retention_days < 1:
        raise ValueError(f"retention must be at least 1 day, got {retention_days}")
    cutoff = today - timedelta(days=retention_days)
    report = ExpireReport(cutoff.isoformat(), dry_run=dry_run)
    old: list[str] = []
    for key in part_keys(objects):
        try:
            part = PartKey.parse(key)
        except ArchiveFormatError:
            report.unrecognised.append(key)
            continue
        if date.fromisoformat(part.day) < cutoff:
            old.append(key)
        else:
            report.kept += 1
    old_entries = [
        entry
        for key in objects.list("index/")
        if (entry := IndexEntry.parse(key)) is not None and date.fromisoformat(entry.day) < cutoff
    ]
    report.parts = len(old)
    report.index_entries = len(old_entries)
    report.days = sorted({key.split("/")[1] for key in old})
    if dry_run:
        progress(len(old), len(old))
        return report
    marks: dict[tuple[int, int], int] = {}
    for entry in old_entries:
        tp = (entry.stream, entry.partition)
        marks[tp] = max(marks.get(tp, -1), entry.last)
    # Marks first, then index entries, then parts: a crash at any point leaves a state a replay
    # reads correctly (it refuses the marked offsets) and a rerun finishes.
    for (stream, partition), through in sorted(marks.items()):
        objects.put(expired_key(stream, partition, through), b"")
    for entry in old_entries:
        objects.delete(entry.key)
    for n, key in enumerate(old, 1):
        objects.delete(key)
        progress(n, len(old))
    if not old:
        progress(0, 0)
    return report
