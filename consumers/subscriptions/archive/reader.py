"""The archive as the long-term log: :class:`StoreArchiveReader` implements the runtime's
``ArchiveReader`` (``consumers/runtime/controls.py``) over an object store, so ``re_reduce`` and a
new subscription's first fold replay events the stream no longer holds.

It finds the parts of an offset range from the index entries alone (one listing per partition),
opens only the parts that overlap the range, checks each against its key's hash, and yields the
records oldest first with their original offsets. Parts may overlap (an operator's redelivery of a
dead letter lands in a later part; a deliberate ``reprocess_from`` archives events again): the
reader merges them in offset order, holding only the parts that overlap the current offset, and
yields each offset once.

It refuses, naming the offsets, rather than hand over a silently partial log when:
- the archiver has not got as far as the range's end yet (``archived_through``), or
- expiry deleted parts holding offsets of the range (the partition's expiry mark), or
- no part of the partition overlaps the range at all.
A part that is missing, corrupt or does not match its key's hash is an error, never skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping

from consumers.runtime.types import TP, Record
from consumers.subscriptions.archive.format import (
    ArchivedLine,
    IndexEntry,
    PartKey,
    content_hash,
    decode_line,
    decompress,
    index_prefix,
    parse_expired,
    stream_of,
)
from consumers.subscriptions.archive.store import ObjectStore
from streams.errors import ArchiveFormatError, ArchiveIncomplete


class StoreArchiveReader:
    def __init__(
        self,
        objects: ObjectStore,
        streams: Mapping[str, int],
        *,
        archived_through: Callable[[TP], int] | None = None,
    ) -> None:
        self.objects = objects
        self.streams = dict(streams)
        # The highest offset of a partition whose part is known written (the archiver's cursor);
        # None when the caller cannot tell (then only the index is consulted).
        self.archived_through = archived_through
        self.parts_read = 0

    def entries(self, tp: TP) -> tuple[list[IndexEntry], int]:
        """The partition's index entries by first offset, and its expiry mark (-1: none)."""
        prefix = index_prefix(stream_of(self.streams, tp.topic), tp.partition)
        entries: list[IndexEntry] = []
        expired = -1
        for key in self.objects.list(prefix):
            entry = IndexEntry.parse(key)
            if entry is not None:
                entries.append(entry)
                continue
            mark = parse_expired(key)
            if mark is not None:
                expired = max(expired, mark)
        entries.sort(key=lambda e: (e.first, e.last, e.name))
        return entries, expired

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]:
        if end < start:
            return iter(())
        if self.archived_through is not None:
            through = self.archived_through(tp)
            if through < end:
                known = (
                    f"is written through offset {through}"
                    if through >= 0
                    else "has no part known written (none yet, or one being written now)"
                )
                raise ArchiveIncomplete(
                    f"the archive of {tp} {known}, but offsets {max(start, through + 1)}..{end} "
                    "are needed and the stream no longer holds them; let the audit-archiver "
                    "catch up (or find why it stopped), then retry"
                )
        entries, expired = self.entries(tp)
        if expired >= start:
            raise ArchiveIncomplete(
                f"archive parts of {tp} holding offsets up to {expired} were deleted by expiry; "
                f"offsets {start}..{min(expired, end)} are in neither the stream nor the archive"
            )
        wanted = [e for e in entries if e.last >= start and e.first <= end]
        if not wanted:
            raise ArchiveIncomplete(
                f"the archive holds no part of {tp} with offsets in {start}..{end} "
                f"({len(entries)} parts indexed for it in {self.objects.describe()})"
            )
        return self._merge(tp, wanted, start, end)

    def _merge(self, tp: TP, entries: list[IndexEntry], start: int, end: int) -> Iterator[Record]:
        """Records of overlapping parts in offset order; a part is opened only once the merge
        reaches its first offset."""
        heap: list[tuple[int, int, ArchivedLine]] = []
        seq = 0  # ties (the same offset in two parts) resolve by part order, then line order
        nxt = 0
        last_yielded = -1
        while nxt < len(entries) or heap:
            while nxt < len(entries) and (not heap or entries[nxt].first <= heap[0][0]):
                for line in self._lines(tp, entries[nxt]):
                    if start <= line.offset <= end:
                        heapq.heappush(heap, (line.offset, seq, line))
                        seq += 1
                nxt += 1
            if not heap:
                continue
            offset, _, line = heapq.heappop(heap)
            if offset == last_yielded:
                continue
            last_yielded = offset
            yield self._record(line)

    def _lines(self, tp: TP, entry: IndexEntry) -> list[ArchivedLine]:
        key = entry.part
        content = decompress(self.objects.get(key), key=key)
        if content_hash(content) != PartKey.parse(key).hash:
            raise ArchiveFormatError(
                f"{key}: content does not match the hash in its key; the part is corrupt "
                "(run `rhumbatron archive verify --day " + entry.day + "`)"
            )
        self.parts_read += 1
        lines = []
        for n, raw in enumerate(content.splitlines()):
            line = decode_line(raw, where=f"{key} line {n + 1}")
            if (line.topic, line.partition) != (tp.topic, tp.partition):
                raise ArchiveFormatError(
                    f"{key} line {n + 1}: holds {line.topic}[{line.partition}], indexed under {tp}"
                )
            lines.append(line)
        return lines

    @staticmethod
    def _record(line: ArchivedLine) -> Record:
        return Record(
            line.topic,
            line.partition,
            line.offset,
            line.project.encode() if line.project is not None else None,  # Kafka's record key
            line.event,
        )
