"""Effects in files: events go into *parts* (e.g. gzip NDJSON objects), each event in exactly one
part, none missing, across crashes.

A processor with ``EffectKind.FILES`` returns ``Effects(lines=[...])`` per event and implements
:class:`PartWriter`. The runtime buffers a partition's lines in an open part; the cursor does not
move while the part is open (a crash re-reads the same events). When the writer says the part is
full or old enough, the runtime:

1. commits the part's claims and the new cursor together with the finished part itself as a
   pending effect (the part's boundaries are recorded with the progress, before offsets move);
2. writes the part to the object store (idempotent: same key, same bytes);
3. clears the pending copy.

A crash between 1 and 3 leaves the pending part in the store; whoever owns the partition next
writes it again before doing anything else. A revoked partition closes its open part first; a
stopping process closes all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from consumers.runtime.types import TP, OutRecord, Progress

# The pending copy of a part rides in the store's pending effects as one OutRecord whose
# topic says what it is; ``key``/``record_id`` are the object key, ``value`` the part's bytes.
PART_TOPIC = "<part>"


class Line(NamedTuple):
    """One event's line in a part. A tuple, not a dataclass: the runtime makes one per archived
    event, and a frozen dataclass took 1.7 times as long to build."""

    offset: int
    timestamp_ms: int  # the event's own time (parts are named by their first event's time)
    data: bytes


class PartWriter(Protocol):
    """What a files processor adds to the Processor contract."""

    def should_close(self, lines: int, size: int, age_s: float) -> bool:
        """Is an open part with this many lines and bytes, open this long, done?"""

    def finish(self, tp: TP, lines: list[Line]) -> tuple[str, bytes]:
        """The object key and the bytes of a part holding these lines. Must be deterministic:
        the same lines give the same key and bytes (a crash may write a part twice)."""

    def store(self, key: str, blob: bytes) -> None:
        """Write the part durably and atomically (temporary name, fsync, rename, or equivalent)."""


@dataclass
class OpenPart:
    """A partition's part being filled: lines, the claims they carry, and the cursor the part
    will commit when it closes."""

    opened_at: float
    progress: Progress
    lines: list[Line] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    size: int = 0

    def add(self, progress: Progress, claims: list[str], lines: list[Line]) -> None:
        self.progress = progress
        self.claims.extend(claims)
        self.lines.extend(lines)
        self.size += sum(len(line.data) for line in lines)


def part_record(key: str, blob: bytes) -> OutRecord:
    return OutRecord(PART_TOPIC, key, blob, key)


def is_part(record: OutRecord) -> bool:
    return record.topic == PART_TOPIC
