"""An in-memory Kafka for the property tests: a partitioned log with transactions and group
offsets, and transports over it. Batches can be cut at will (``cuts``), members can be assigned
and revoked explicitly, and a transaction that is not committed is simply never visible.

What it copies from librdkafka (``tests/contracts/transport.py`` holds both to it): a partition
without a start starts at the committed offset, else at the log start; ``caught_up`` and the
cached high watermark are what the last poll saw; a revoked partition leaves its pause behind;
offsets of a partition not owned are not committed; group metadata from before a member's
rebalance is fenced by ``send_offsets``; ``close`` revokes everything first. And Kafka's
transactions: a committed transaction ends with a commit marker on every partition it wrote to,
an aborted one leaves its records and an abort marker; both take offsets, neither is ever read,
and a member's ``position`` passes them once a poll reads on past them or to the end.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.runtime.transport import AssignCallback, Committed, RevokeCallback
from consumers.runtime.types import TP, OutRecord, Record
from streams.errors import TransactionFailed
from streams.headers import RECORD_ID


@dataclass
class MemoryLog:
    """Topics of partitions of records, plus committed group offsets. A partition is a list
    indexed by offset; an offset that holds no readable record (a transaction marker, a record of
    an aborted transaction) holds None."""

    partitions: dict[str, int] = field(default_factory=dict)
    records: dict[TP, list[Record | None]] = field(default_factory=dict)
    offsets: dict[str, dict[TP, Committed]] = field(default_factory=dict)
    # Simulated retention: offsets below this are gone from the partition.
    start: dict[TP, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def create(self, topic: str, partitions: int) -> None:
        with self.lock:
            self.partitions[topic] = partitions
            for p in range(partitions):
                self.records.setdefault(TP(topic, p), [])

    def append(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> int:
        with self.lock:
            log = self.records[TP(topic, partition)]
            offset = len(log)
            log.append(Record(topic, partition, offset, key, value, headers, offset))
            return offset

    def unreadable(self, topic: str, partition: int, count: int = 1) -> int:
        """Offsets no reader is handed: a transaction's marker, an aborted transaction's
        records. Returns the first of them."""
        with self.lock:
            log = self.records[TP(topic, partition)]
            first = len(log)
            log.extend([None] * count)
            return first

    def read(self, tp: TP, start: int, limit: int) -> list[Record]:
        """Up to ``limit`` readable records from offset ``start`` on."""
        with self.lock:
            log = self.records.get(tp, [])
            out: list[Record] = []
            offset = max(start, 0)
            while offset < len(log) and len(out) < limit:
                record = log[offset]
                if record is not None:
                    out.append(record)
                offset += 1
            return out

    def end(self, tp: TP) -> int:
        with self.lock:
            return len(self.records.get(tp, []))

    def all(self, topic: str) -> list[Record]:
        with self.lock:
            return [
                r
                for p in range(self.partitions.get(topic, 0))
                for r in self.records[TP(topic, p)]
                if r is not None
            ]


@dataclass(frozen=True)
class MemoryGroupMetadata:
    """What ``group_metadata`` hands to ``send_offsets``: the group, and the member's generation
    when it was taken (the coordinator refuses offsets of a generation that moved on)."""

    group: str
    member: MemoryTransport
    generation: int

    def current(self) -> bool:
        return not self.member.closed and self.member.generation == self.generation


class MemoryTransport:
    """One group member. By default it owns every partition of its topics on ``subscribe``; tests
    move partitions with ``assign`` / ``revoke`` (the callbacks run on the next ``poll``, as
    librdkafka runs them inside poll)."""

    def __init__(
        self,
        log: MemoryLog,
        group: str,
        *,
        cuts: Iterator[int] | None = None,
        auto_assign: bool = True,
    ) -> None:
        self.log = log
        self.group = group
        self.cuts = cuts
        self.auto_assign = auto_assign
        self._assigned: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._at_end: set[TP] = set()  # read to the end as of the last poll that fetched it
        self._high: dict[TP, int] = {}  # the end as the last poll that fetched it saw it
        self._handed: dict[TP, int] = {}  # ``position``: past what the polls handed over
        self.generation = 0  # bumped by every rebalance that changes this member's partitions
        self._on_assign: AssignCallback | None = None
        self._on_revoke: RevokeCallback | None = None
        self._topics: list[str] = []
        self._pending_assign: list[TP] = []
        self._pending_revoke: list[TP] = []
        self.closed = False
        # Simulated retention: offsets below this are gone from the stream; the log's own by
        # default (share the dict with a MemoryReader to keep both views consistent).
        self.retention_start: dict[TP, int] = log.start

    @property
    def group_id(self) -> str:
        """The group's name, as KafkaTransport.group_id (the runtime's spans name it)."""
        return self.group

    def subscribe(
        self, topics: list[str], on_assign: AssignCallback, on_revoke: RevokeCallback
    ) -> None:
        self._topics = topics
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        if self.auto_assign:
            self._pending_assign = [
                TP(t, p) for t in topics for p in range(self.log.partitions.get(t, 0))
            ]

    def assign(self, tps: Iterable[TP]) -> None:
        self._pending_assign.extend(tps)

    def revoke(self, tps: Iterable[TP]) -> None:
        self._pending_revoke.extend(tps)

    def _rebalance(self) -> None:
        if self._pending_revoke and self._on_revoke:
            gone = [tp for tp in self._pending_revoke if tp in self._assigned]
            self._pending_revoke = []
            if gone:
                self._on_revoke(gone)
                self._drop(gone)
        if self._pending_assign and self._on_assign:
            new = [tp for tp in self._pending_assign if tp not in self._assigned]
            self._pending_assign = []
            if new:
                starts = self._on_assign(new)
                committed = self.log.offsets.get(self.group, {})
                for tp in new:
                    start = starts.get(tp)
                    mark = committed.get(tp)
                    # auto.offset.reset=earliest: no start and no committed offset, the log start.
                    self._assigned[tp] = (
                        start
                        if start is not None
                        else (mark.offset if mark is not None else self.log_start(tp))
                    )
                self.generation += 1

    def _drop(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            self._assigned.pop(tp, None)
            self._paused.discard(tp)
            self._at_end.discard(tp)
            self._high.pop(tp, None)
            self._handed.pop(tp, None)
        self.generation += 1

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        self._rebalance()
        limit = max_records
        if self.cuts is not None:
            limit = max(1, min(limit, next(self.cuts)))
        out: list[Record] = []
        for tp in sorted(self._assigned):
            if tp in self._paused or len(out) >= limit:
                continue
            # Below the log start is out of range: auto.offset.reset=earliest.
            position = max(self._assigned[tp], self.log_start(tp))
            room = limit - len(out)
            got = self.log.read(tp, position, room)
            end = self.log.end(tp)
            if len(got) < room:
                # Read on to the end: past the markers after the last record, as librdkafka's
                # fetch goes past them before it reports the end.
                position = max(position, end)
                self._handed[tp] = position
            elif got:
                # The batch is full: the position stops right after its last record, even if
                # only markers follow (librdkafka has not read them yet).
                position = got[-1].offset + 1
                self._handed[tp] = position
            out.extend(got)
            self._assigned[tp] = position
            self._high[tp] = end
            if position >= end:
                self._at_end.add(tp)
            else:
                self._at_end.discard(tp)
        return out

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    def pause(self, tps: Iterable[TP]) -> None:
        self._paused.update(tp for tp in tps if tp in self._assigned)

    def resume(self, tps: Iterable[TP]) -> None:
        self._paused.difference_update(tps)

    def seek(self, tp: TP, offset: int) -> None:
        if tp in self._assigned:
            self._assigned[tp] = offset
            self._at_end.discard(tp)
            self._handed.pop(tp, None)

    def commit_offsets(self, offsets: Mapping[TP, int], marks: Mapping[TP, str]) -> None:
        with self.log.lock:
            group = self.log.offsets.setdefault(self.group, {})
            group.update(
                {
                    tp: Committed(o, marks.get(tp, ""))
                    for tp, o in offsets.items()
                    if tp in self._assigned
                }
            )

    def committed(self, tps: Iterable[TP]) -> dict[TP, Committed | None]:
        with self.log.lock:
            group = self.log.offsets.get(self.group, {})
            return {tp: group.get(tp) for tp in tps}

    def high_watermark(self, tp: TP, *, cached: bool = True) -> int:
        if cached:
            return self._high.get(tp, -1)
        return self.log.end(tp)

    def position(self, tp: TP) -> int | None:
        return self._handed.get(tp) if tp in self._assigned else None

    def log_start(self, tp: TP) -> int:
        return self.retention_start.get(tp, 0)

    def caught_up(self, tps: Iterable[TP]) -> bool:
        return all(tp in self._at_end for tp in tps)

    def group_metadata(self) -> Any:
        return MemoryGroupMetadata(self.group, self, self.generation)

    def close(self) -> None:
        if self.closed:
            return
        owned = sorted(self._assigned)
        if owned and self._on_revoke:
            self._on_revoke(owned)
        self._drop(owned)
        self._pending_assign, self._pending_revoke = [], []
        self.closed = True


class MemoryOutput:
    """A transactional producer on the memory log: nothing is visible until ``commit``, which
    appends the records and stores the offsets atomically. ``fail_commit`` lets a test make the
    next commit fail (as a fenced or aborted transaction would)."""

    def __init__(
        self, log: MemoryLog, partitioner: Callable[[str, int], int] | None = None
    ) -> None:
        self.log = log
        self.partitioner = partitioner or (lambda key, n: sum(key.encode()) % n)
        self._records: list[OutRecord] = []
        self._offsets: dict[TP, Committed] = {}
        self._group: Any = None
        self._open = False
        self._doomed: TransactionFailed | None = None  # an abortable error: only abort is left
        self.fail_commit: Callable[[], bool] = lambda: False
        self.commits = 0

    def begin(self) -> None:
        if self._open:
            raise RuntimeError("transaction already open")
        self._open = True
        self._records, self._offsets = [], {}
        self._doomed = None

    def produce(self, record: OutRecord) -> None:
        assert self._open, "produce outside a transaction"
        self._records.append(record)

    def send_offsets(
        self,
        offsets: Mapping[TP, int],
        group_metadata: Any,
        metadata: Mapping[TP, str] | None = None,
    ) -> None:
        assert self._open, "send_offsets outside a transaction"
        if isinstance(group_metadata, MemoryGroupMetadata) and not group_metadata.current():
            self._doomed = TransactionFailed(
                "memory",
                f"send_offsets: ILLEGAL_GENERATION: group {group_metadata.group} moved past "
                f"generation {group_metadata.generation}",
                abortable=True,
            )
            raise self._doomed
        marks = metadata or {}
        self._offsets.update({tp: Committed(o, marks.get(tp, "")) for tp, o in offsets.items()})
        self._group = group_metadata

    def commit(self) -> None:
        assert self._open, "commit outside a transaction"
        if self._doomed is not None:
            raise TransactionFailed(
                "memory", f"commit after an abortable error: {self._doomed}", abortable=True
            )
        self._open = False
        if self.fail_commit():
            self._abandon()
            raise TransactionFailed("memory", "injected commit failure", abortable=True)
        with self.log.lock:
            written: set[TP] = set()
            for r in self._records:
                partition = self.partitioner(r.key, self.log.partitions[r.topic])
                self.log.append(
                    r.topic,
                    partition,
                    r.value,
                    r.key.encode(),
                    r.headers + ((RECORD_ID, r.record_id.encode()),),
                )
                written.add(TP(r.topic, partition))
            for tp in sorted(written):  # the commit markers
                self.log.unreadable(tp.topic, tp.partition)
            if self._offsets:
                group = (
                    self._group.group
                    if isinstance(self._group, MemoryGroupMetadata)
                    else str(self._group)
                )
                self.log.offsets.setdefault(group, {}).update(self._offsets)
        self._records, self._offsets = [], {}
        self.commits += 1

    def _abandon(self) -> None:
        """The transaction aborts: its records were written already (Kafka writes them as they
        are produced) and stay in the log, unreadable, followed by the abort markers."""
        with self.log.lock:
            counts: dict[TP, int] = {}
            for r in self._records:
                tp = TP(r.topic, self.partitioner(r.key, self.log.partitions[r.topic]))
                counts[tp] = counts.get(tp, 0) + 1
            for tp, count in sorted(counts.items()):
                self.log.unreadable(tp.topic, tp.partition, count + 1)
        self._records, self._offsets = [], {}

    def abort(self) -> None:
        self._open = False
        self._abandon()
        self._doomed = None

    def close(self) -> None:
        self.abort()


class MemoryOutputLog:
    """OutputLog over the memory log: committed records are all there is (an aborted
    transaction never reached the log), and the whole log is looked at."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log

    def find(self, records: Sequence[OutRecord], since_ms: int) -> set[str]:
        wanted = {r.record_id for r in records}
        found: set[str] = set()
        for topic in sorted({r.topic for r in records}):
            for record in self.log.all(topic):
                rid = record.header(RECORD_ID)
                if rid is not None and rid.decode() in wanted:
                    found.add(rid.decode())
        return found


class MemoryRedelivery:
    def __init__(self, log: MemoryLog, topic: str) -> None:
        self.log = log
        self.topic = topic
        self._positions: dict[int, int] = {}

    def assign(self, partition: int, offset: int | None) -> None:
        self._positions[partition] = offset or 0

    def unassign(self, partition: int) -> None:
        self._positions.pop(partition, None)

    def poll(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        for p, start in sorted(self._positions.items()):
            got = self.log.read(TP(self.topic, p), start, max_records - len(out))
            if got:
                self._positions[p] = got[-1].offset + 1
                out.extend(got)
        return out

    def close(self) -> None:
        self._positions.clear()


def cuts_from(sizes: Iterable[int]) -> Iterator[int]:
    """Batch sizes for a transport: the given ones, then 1,000 forever."""
    return itertools.chain(sizes, itertools.repeat(1000))


class MemoryReader:
    """LogReader over the memory log; ``start`` simulates retention having deleted a prefix."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.start: dict[TP, int] = {}

    def log_start(self, tp: TP) -> int:
        return self.start.get(tp, 0)

    def end(self, tp: TP) -> int:
        return self.log.end(tp)

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]:
        first = max(start, self.log_start(tp))
        for record in self.log.read(tp, first, max(end - first + 1, 0)):
            if record.offset > end:
                return
            yield record
