"""The archive's formats: one line per event, parts (gzip NDJSON) and their keys, index entries.

A **line** is one JSON object, the event's source position and its canonical envelope::

    {"topic":"rhumbatron_events_03_dev","partition":1,"offset":42,"event":{...}}

A **part** is the lines of one (stream, partition), each ending in ``\\n``, gzip-compressed with
no file name and ``mtime = 0``, so the same lines always give the same bytes. Its key is::

    events/<day>/stream-<NN>/part-<firstMs>-p<partition>-<hash>.ndjson.gz

``day`` is the UTC day of the first line's event time, ``firstMs`` that time in milliseconds, ``NN``
the stream index from the topic name, and ``hash`` the first 24 hex characters of the SHA-256 of
the **uncompressed** NDJSON (so a part can be checked whatever zlib compressed it).

An **index entry** is an empty object whose key names the part and the range of source offsets its
lines hold, so a reader finds the parts of an offset range by listing, without opening any part::

    index/stream-<NN>/p<partition>/<firstOffset:020>-<lastOffset:020>--<day>--<part file name>

A partition's **expiry mark** (``index/stream-<NN>/p<partition>/expired-through-<offset:020>``)
records the highest offset whose part was deleted by expiry.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

import orjson

from consumers.runtime.types import TP
from streams.envelopes import Event, decode_event, encode
from streams.errors import ArchiveFormatError, EnvelopeError

# 24 hex characters (96 bits) of SHA-256: collisions between parts of one partition are out of
# reach, and keys stay short enough for any object store.
HASH_CHARS = 24

_PART = re.compile(
    r"^events/(?P<day>\d{4}-\d{2}-\d{2})/stream-(?P<stream>\d{2})/"
    r"(?P<name>part-(?P<first_ms>\d+)-p(?P<partition>\d+)-(?P<hash>[0-9a-f]{"
    + str(HASH_CHARS)
    + r"})\.ndjson\.gz)$"
)
_INDEX = re.compile(
    r"^index/stream-(?P<stream>\d{2})/p(?P<partition>\d+)/"
    r"(?P<first>\d{20})-(?P<last>\d{20})--(?P<day>\d{4}-\d{2}-\d{2})--(?P<name>part-[^/]+)$"
)
_EXPIRED = re.compile(r"^index/stream-(\d{2})/p(\d+)/expired-through-(\d{20})$")


def stream_of(streams: Mapping[str, int], topic: str) -> int:
    """The stream index of an event stream (``rhumbatron_events_03_dev`` -> 3), from the
    environment's topology (``{name: index}``)."""
    index = streams.get(topic)
    if index is None:
        raise ArchiveFormatError(
            f"{topic!r} is not an event stream of this environment "
            f"({', '.join(sorted(streams)) or 'none configured'}); only event streams are archived"
        )
    return index


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()


def parse_day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise ArchiveFormatError(f"day {text!r} is not a date in the form YYYY-MM-DD") from exc


# -- lines -------------------------------------------------------------------------------------


def encode_line(tp: TP, offset: int, event: Event, *, max_bytes: int) -> bytes:
    """One event's line (without the newline). The position comes first so a reader of raw
    parts sees it at a glance; the event is its canonical envelope."""
    return line_of(line_prefix(tp), offset, encode(event, max_bytes=max_bytes))


def line_prefix(tp: TP) -> bytes:
    """What every line of ``tp`` starts with, up to its offset: the same for all of a
    partition's lines, so the archiver makes it once per partition."""
    return b'{"topic":%s,"partition":%d,"offset":' % (orjson.dumps(tp.topic), tp.partition)


def line_of(prefix: bytes, offset: int, envelope: bytes) -> bytes:
    """The line of the envelope at ``offset``, after its partition's ``line_prefix``."""
    return b'%s%d,"event":%s}' % (prefix, offset, envelope)


@dataclass(frozen=True, slots=True)
class ArchivedLine:
    topic: str
    partition: int
    offset: int
    event: bytes  # the canonical envelope, as it was archived
    project: str | None  # the event's project id: the record key it had on the stream


def decode_line(raw: bytes, *, where: str) -> ArchivedLine:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ArchiveFormatError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ArchiveFormatError(f"{where}: a line must be a JSON object, found {type(obj)}")
    for name, kind in (("topic", str), ("partition", int), ("offset", int), ("event", dict)):
        if not isinstance(obj.get(name), kind):
            raise ArchiveFormatError(
                f"{where}: field {name!r} must be a {kind.__name__}, found {obj.get(name)!r:.60}"
            )
    # orjson keeps key order, so dumping the object again gives back the canonical bytes.
    project = obj["event"].get("projectId")
    return ArchivedLine(
        obj["topic"],
        obj["partition"],
        obj["offset"],
        orjson.dumps(obj["event"]),
        project if isinstance(project, str) else None,
    )


def event_of(line: ArchivedLine, *, max_bytes: int, where: str) -> Event:
    try:
        return decode_event(line.event, max_bytes=max_bytes)
    except EnvelopeError as exc:
        raise ArchiveFormatError(f"{where}: {exc}") from exc


# -- parts -------------------------------------------------------------------------------------


def content_hash(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:HASH_CHARS]


def compress(content: bytes, level: int) -> bytes:
    return gzip.compress(content, compresslevel=level, mtime=0)


def decompress(blob: bytes, *, key: str) -> bytes:
    try:
        return gzip.decompress(blob)
    except (OSError, EOFError, ValueError) as exc:  # BadGzipFile is an OSError
        raise ArchiveFormatError(f"{key}: not a valid gzip stream ({exc})") from exc


@dataclass(frozen=True, slots=True)
class PartKey:
    day: str
    stream: int
    first_ms: int
    partition: int
    hash: str

    @property
    def name(self) -> str:
        return f"part-{self.first_ms}-p{self.partition}-{self.hash}.ndjson.gz"

    @property
    def key(self) -> str:
        return f"events/{self.day}/stream-{self.stream:02d}/{self.name}"

    @classmethod
    def parse(cls, key: str) -> PartKey:
        m = _PART.match(key)
        if m is None:
            raise ArchiveFormatError(
                f"{key!r} is not a part key "
                "(events/<day>/stream-<NN>/part-<firstMs>-p<partition>-<hash>.ndjson.gz)"
            )
        return cls(m["day"], int(m["stream"]), int(m["first_ms"]), int(m["partition"]), m["hash"])


def part_key(stream: int, partition: int, first_ms: int, content: bytes) -> PartKey:
    return PartKey(day_of(first_ms), stream, first_ms, partition, content_hash(content))


# The start of a line as ``line_of`` writes it, up to its offset (a topic name has no quote or
# backslash in it: Kafka's names are letters, digits, ".", "_" and "-").
_LINE_START = re.compile(rb'\{"topic":"[^"\\]*","partition":[0-9]+,"offset":(0|[1-9][0-9]*),')


def line_offsets(content: bytes, *, key: str) -> tuple[int, int, int]:
    """(lines, lowest offset, highest offset) of a part's uncompressed content.

    The offsets are read off the start of each line, where ``line_of`` puts them (parsing every
    line took a twelfth of the archiver's time); the rest of a line is not checked here (the archive's reader and ``archive verify`` decode every line). A part with
    any line not in that form is read line by line, which names the first line that is wrong."""
    lines = content.splitlines()
    if not lines:
        raise ArchiveFormatError(f"{key}: the part holds no line")
    found = []
    for line in lines:
        start = _LINE_START.match(line)
        if start is None:
            return offsets_line_by_line(lines, key=key)
        found.append(int(start[1]))
    return len(lines), min(found), max(found)


def offsets_line_by_line(lines: list[bytes], *, key: str) -> tuple[int, int, int]:
    """:func:`line_offsets` parsing each line whole."""
    offsets = []
    for n, raw in enumerate(lines):
        try:
            offset = orjson.loads(raw).get("offset")  # only the position: no re-encoding
        except (orjson.JSONDecodeError, AttributeError):
            offset = None
        if not isinstance(offset, int):
            decode_line(raw, where=f"{key} line {n + 1}")  # raises, naming what is wrong
            raise ArchiveFormatError(f"{key} line {n + 1}: no integer offset")
        offsets.append(offset)
    return len(lines), min(offsets), max(offsets)


# -- index ---------------------------------------------------------------------------------------


def index_prefix(stream: int, partition: int) -> str:
    return f"index/stream-{stream:02d}/p{partition}/"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    stream: int
    partition: int
    first: int
    last: int
    day: str
    name: str

    @property
    def key(self) -> str:
        return (
            f"{index_prefix(self.stream, self.partition)}{self.first:020d}-{self.last:020d}"
            f"--{self.day}--{self.name}"
        )

    @property
    def part(self) -> str:
        return f"events/{self.day}/stream-{self.stream:02d}/{self.name}"

    @classmethod
    def parse(cls, key: str) -> IndexEntry | None:
        """The entry a key names, or None for a key of the index that is not an entry."""
        m = _INDEX.match(key)
        if m is None:
            return None
        return cls(
            int(m["stream"]),
            int(m["partition"]),
            int(m["first"]),
            int(m["last"]),
            m["day"],
            m["name"],
        )

    @classmethod
    def of(cls, part: PartKey, first: int, last: int) -> IndexEntry:
        return cls(part.stream, part.partition, first, last, part.day, part.name)


def expired_key(stream: int, partition: int, through: int) -> str:
    return f"{index_prefix(stream, partition)}expired-through-{through:020d}"


def parse_expired(key: str) -> int | None:
    m = _EXPIRED.match(key)
    return int(m.group(3)) if m else None
