"""The runner's state and the steps every part of it shares (see runner.py for the loop)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from consumers.runtime.controls import Controls
from consumers.runtime.dead_letters import DeadLetter, DeadLetterStore
from consumers.runtime.parts import Line, OpenPart, PartWriter
from consumers.runtime.store import Commit, Store
from consumers.runtime.transport import Output, OutputLog, Redelivery, Transport
from consumers.runtime.types import (
    JSON,
    TP,
    EffectKind,
    Processor,
    Progress,
    Record,
)
from streams.catalog import CATALOG, Catalog
from streams.clock import Clock
from streams.envelopes import Event
from streams.errors import (
    ClaimsFound,
    CursorMoved,
    EnvelopeError,
    Fenced,
    PendingEffects,
    ServerRefused,
    StatementsFailed,
    Unreachable,
)
from streams.headers import ORIGIN_OFFSET
from streams.topology import redelivery_origin, redelivery_partition

if TYPE_CHECKING:  # the metrics read this module's Stats
    from consumers.runtime.metrics import RuntimeInstruments

log = logging.getLogger("rhumbatron.runtime")


@dataclass(frozen=True)
class RuntimePolicy:
    batch_size: int
    max_batch_failures: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    max_envelope_bytes: int
    on_failure: str = "dead-letter"  # or "block": retry forever, skip_through the only escape
    control_check_interval_s: float = 1.0
    # How far before a pending copy's store time recovery looks for its records on the output
    # topics (clock skew between this host and the one that stored the copy).
    output_search_margin_ms: int = 60_000
    # The streams this subscription reads, for the redelivery mapping (streams.topology).
    streams: tuple[str, ...] = ()
    partitions_per_stream: int = 1
    # Records per poll while the subscription is behind (its last poll found a full batch
    # waiting); 0: batch_size always.
    batch_size_behind: int = 0
    # Folds kept in memory between polls, over all the partitions this process owns, by count
    # and by their encoded bytes (0: no bound); a project's fold past its partition's share of
    # either is read back from the store.
    fold_cache_projects: int = 0
    fold_cache_bytes: int = 0
    # The event types and versions this code knows: events are upcast to the newest version
    # before a processor sees them, and one newer than it knows parks its project.
    catalog: Catalog = CATALOG
    # Projects one partition may hold parked before it stops; records a drain re-reads per loop
    # turn (consumers.runtime.parking).
    parked_projects_max: int = 1_000
    parked_drain_records: int = 50_000

    def behind_batch_size(self) -> int:
        return max(self.batch_size, self.batch_size_behind)

    def redelivery_partition(self, tp: TP) -> int | None:
        return redelivery_partition(
            self.streams, self.partitions_per_stream, tp.topic, tp.partition
        )

    def origin_of(self, redelivered: int) -> TP | None:
        origin = redelivery_origin(self.streams, self.partitions_per_stream, redelivered)
        return None if origin is None else TP(*origin)


@dataclass
class Stats:
    batches: int = 0
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    filtered: int = 0
    failures: int = 0
    dead_lettered: int = 0
    poison: int = 0
    poison_dead_lettered: int = 0  # of dead_lettered: poison records (the rest: failed batches)
    fenced: int = 0
    redelivered: int = 0
    transactions: int = 0
    recovered: int = 0
    parts: int = 0
    parked: int = 0  # events held back behind their project's park


@dataclass(frozen=True)
class DueLetter:
    """A batch's dead letter whose write failed: written again, as it is, before the partition
    moves on."""

    letter: DeadLetter
    batch_key: str
    failed: list[tuple[Record, Event, BaseException]]
    resume_at: int | None  # where the partition is read again once it is written


@dataclass
class PartitionState:
    tp: TP
    epoch: int
    progress: Progress
    live_from: int
    # The folds kept between polls, the latest written last, and the encoded size of each the
    # store wrote (one read from the store and not written since counts 0 until it is).
    states: dict[str, JSON | None] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    kept_bytes: int = 0
    retry_at: float | None = None
    retry_from: int | None = None
    due_letter: DueLetter | None = None
    needs_recovery: bool = False
    needs_refold: bool = False
    needs_first_fold: bool = False
    redelivery: int | None = None
    open_part: OpenPart | None = None  # files processors: the part being filled
    # The offset this owner last committed to the group (-1: none yet); the cursor in the store
    # is what resumes work, and the two differ by the transaction markers past the cursor.
    group_offset: int = -1
    # The SQL store's outages met in a row, for the backoff before the partition is read again
    # (none counts as a failure of its events).
    outages: int = 0
    # Parked projects (consumers.runtime.parking): when a drain refused for want of the records
    # may be tried again (monotonic seconds), and the stops for want of room met in a row.
    drain_blocked_until: float = 0.0
    parking_stops: int = 0

    def forget_states(self) -> None:
        self.states.clear()
        self.state_bytes.clear()
        self.kept_bytes = 0


@dataclass
class Outcome:
    """What processing one partition's slice of a batch produced."""

    commit: Commit
    failed: list[tuple[Record, Event, BaseException]]
    first_unapplied: int | None
    letters: list[DeadLetter]
    lines: list[Line] = field(default_factory=list)
    applied_ms: list[int] = field(default_factory=list)  # the applied events' timestamps
    # What processing added to Stats (applied, duplicates, filtered, redelivered), taken back
    # when the commit is refused with ClaimsFound and the slice is processed again.
    counted: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # of ``letters``: events validate refused (the rest are poison)
    # The offset (and event) where the partition stopped for want of room to park one more
    # project; and whether the batch re-read parked projects' events (consumers.runtime.parking).
    stopped_at: int | None = None
    stopped_by: Event | None = None
    drained: bool = False


class RunnerBase:
    """What every part of the runner reads and the small steps they all take."""

    processor: Processor
    transport: Transport
    store: Store
    dead_letters: DeadLetterStore
    policy: RuntimePolicy
    clock: Clock
    output: Output | None
    output_log: OutputLog | None
    redelivery: Redelivery | None
    controls: Controls | None
    failpoint: Callable[[str], None]
    stats: Stats
    instruments: RuntimeInstruments
    parts: dict[TP, PartitionState]

    def _writer(self) -> PartWriter:
        return cast(PartWriter, self.processor)

    def _next_transaction(self, new: Progress, progress: Progress, *, pending: bool) -> None:
        """``new``, the cursor a commit writes over ``progress``: whether it leaves Kafka
        effects pending, and for a Kafka-effects processor the sequence of the transaction of
        its own that every such commit is."""
        new.pending_effects = pending
        if self.processor.effect_kind == EffectKind.KAFKA:
            new.txn_seq = progress.txn_seq + 1
            new.pending_since_ms = int(self.clock.now().timestamp() * 1000) if pending else 0

    def _clear_pending(self, part: PartitionState) -> None:
        try:
            self.store.clear_pending(part.tp, part.epoch)
            part.progress.pending_effects = False
            part.needs_recovery = False
        except Fenced:
            self._drop(part)

    def _read_through(self, part: PartitionState, progress: Progress) -> int | None:
        """The transport's position, when it is not behind the cursor and every record it handed
        over of this partition is done (nothing held back, failed, waiting for a retry, deferred or
        in an open part): the offsets between the cursor and it hold no record a reader is
        handed (transaction markers, aborted records). None otherwise.

        A group that commits it reads lag 0 once caught up, where ``acked_through + 1`` stays
        one behind the log end for every marker at the end. The cursor stays where it is: the
        next owner starts after it and reads nothing but the markers again."""
        if (
            progress.applied_beyond
            or progress.dead
            or part.retry_at is not None
            or part.needs_recovery
            or part.needs_refold
            or part.needs_first_fold
            or part.open_part is not None
        ):
            return None
        position = self.transport.position(part.tp)
        if position is None or position < progress.acked_through + 1:
            return None
        return position

    def _group_offset(self, part: PartitionState, progress: Progress) -> int:
        """Where the group is told a partition stands: past the markers when it was read
        through (``_read_through``), else the next offset after the cursor."""
        through = self._read_through(part, progress)
        return through if through is not None else progress.acked_through + 1

    def _settled(self, part: PartitionState) -> bool:
        """Between batches: no failure of this partition waits to be retried or passed, and no
        effect is pending."""
        return (
            part.retry_at is None and part.retry_from is None and not part.progress.pending_effects
        )

    def _commit_group_offsets(
        self, parts: Iterable[PartitionState], clean: Container[TP] | None = None
    ) -> None:
        """Record the partitions' progress in the group, for lag tooling (Kafka effects commit
        theirs in their transactions). ``clean``: the partitions whose batch just committed
        with nothing failed, when called for a batch (before its failures are handled); else
        each partition's own state says whether it is settled."""
        if self.processor.effect_kind == EffectKind.KAFKA:
            return
        offsets: dict[TP, int] = {}
        chosen = list(parts)
        for p in chosen:
            settled = p.tp in clean if clean is not None else self._settled(p)
            offset = self._group_offset(p, p.progress) if settled else p.progress.acked_through + 1
            if offset > 0:
                offsets[p.tp] = offset
        if offsets:
            self.transport.commit_offsets(
                offsets, {p.tp: p.progress.cursor_marker() for p in chosen if p.tp in offsets}
            )
            for p in chosen:
                if p.tp in offsets:
                    p.group_offset = offsets[p.tp]

    def _rewind_redelivery(self, part: PartitionState) -> None:
        if part.redelivery is not None and self.redelivery is not None:
            self.redelivery.assign(part.redelivery, part.progress.redelivered_next)

    def _defer(self, part: PartitionState) -> None:
        """Put a partition's fetched records back: read them again once it is ready."""
        self.transport.seek(part.tp, part.progress.acked_through + 1)
        self._rewind_redelivery(part)

    def _keep_states(self, part: PartitionState, commit: Commit) -> None:
        """Keep a committed batch's folds as its partition's latest, within the partition's
        share of ``fold_cache_projects`` and of ``fold_cache_bytes`` (each fold's size as the
        store encoded it): those written longest ago go first (the store holds them; a later
        event of theirs reads them back). The latest written fold is always kept."""
        kept, sizes = part.states, part.state_bytes
        for project, state in commit.states.items():
            kept.pop(project, None)  # to the end: written most recently
            kept[project] = state
            size = commit.state_bytes.get(project, 0)
            part.kept_bytes += size - sizes.get(project, 0)
            sizes[project] = size
        owners = max(1, len(self.parts))
        projects, nbytes = self.policy.fold_cache_projects, self.policy.fold_cache_bytes
        most = max(1, projects // owners) if projects > 0 else len(kept)
        most_bytes = max(1, nbytes // owners) if nbytes > 0 else part.kept_bytes
        over, over_bytes = len(kept) - most, part.kept_bytes - most_bytes
        if over <= 0 and over_bytes <= 0:
            return
        oldest: list[str] = []  # one pass from the front (each lookup from it would rescan)
        for project in kept:
            if (over <= 0 and over_bytes <= 0) or len(oldest) == len(kept) - 1:
                break
            oldest.append(project)
            over -= 1
            over_bytes -= sizes.get(project, 0)
        for project in oldest:
            del kept[project]
            part.kept_bytes -= sizes.pop(project, 0)

    def _reload(self, part: PartitionState) -> None:
        part.open_part = None
        part.progress = self.store.load(part.tp)
        part.forget_states()
        part.retry_at = None
        part.retry_from = None
        self.transport.resume([part.tp])
        self.transport.seek(part.tp, part.progress.acked_through + 1)
        self._rewind_redelivery(part)

    def _store_commit(self, part: PartitionState, commit: Commit) -> bool:
        """Commit one partition's batch to the store. False when refused: fenced (the partition
        is dropped) or the cursor moved under us (reloaded; pending effects recovered first)."""
        self.failpoint("runtime.before_store_commit")
        return self._commit_or_refuse(part, commit)

    def _store_commit_many(
        self, commits: Sequence[tuple[PartitionState, Commit]]
    ) -> list[Exception | None]:
        """:meth:`_store_commit` for every partition of a poll in one store call: per commit, in
        order, None if it applied, else what refused it (a refused one's partition is handled as
        there; ClaimsFound and StatementsFailed are left to the caller, which looks up and
        processes again)."""
        if not commits:
            return []
        for _ in commits:
            self.failpoint("runtime.before_store_commit")
        try:
            refusals = self.store.commit_many([commit for _, commit in commits])
        except (Unreachable, ServerRefused) as exc:
            if self.processor.effect_kind != EffectKind.SQL:
                raise
            # The database's outage: the call's commits share one transaction, none was written.
            refusals = [exc for _ in commits]
        for (part, _), refusal in zip(commits, refusals, strict=True):
            if refusal is not None and not isinstance(refusal, (ClaimsFound, StatementsFailed)):
                self._refused(part, refusal)
        return refusals

    def _commit_or_refuse(self, part: PartitionState, commit: Commit) -> bool:
        """The store commit and what a refusal means for the partition, shared by the batch's
        commit and the failure path's dead-letter commit."""
        try:
            self.store.commit(commit)
        except (Fenced, CursorMoved, PendingEffects) as exc:
            self._refused(part, exc)
            return False
        except (Unreachable, ServerRefused) as exc:
            if self.processor.effect_kind != EffectKind.SQL:
                raise
            self._refused(part, exc)
            return False
        return True

    def _refused(self, part: PartitionState, refusal: Exception) -> None:
        """A store commit of this partition was refused: fenced (the partition is dropped), the
        cursor moved under us (reloaded; pending effects recovered first), or the SQL store met
        an outage (read again after a backoff)."""
        if isinstance(refusal, Fenced):
            self.stats.fenced += 1
            log.warning("%s: %s", self.processor.slug, refusal)
            self._drop(part)
        elif isinstance(refusal, (CursorMoved, PendingEffects)):
            log.warning("%s: %s; reloading", self.processor.slug, refusal)
            self._reload(part)
            part.needs_recovery = part.progress.pending_effects
        elif isinstance(refusal, (Unreachable, ServerRefused)):
            # The SQL store's outage (a lost connection, a serialization failure, a deadlock):
            # nothing was written and no event failed, so nothing is counted.
            part.outages += 1
            log.warning(
                "%s: %s; %s is read again after a backoff", self.processor.slug, refusal, part.tp
            )
            self._schedule_retry(part, part.progress.acked_through + 1, part.outages)
        else:
            raise refusal

    def _schedule_retry(
        self, part: PartitionState, first_unapplied: int | None, attempts: int
    ) -> None:
        delay = min(
            self.policy.retry_backoff_s * 2 ** max(attempts - 1, 0), self.policy.retry_backoff_max_s
        )
        part.retry_at = self.clock.monotonic() + delay
        part.retry_from = first_unapplied
        self.transport.pause([part.tp])
        if first_unapplied is not None:
            self.transport.seek(part.tp, first_unapplied)

    def _drop(self, part: PartitionState) -> None:
        """We were fenced: another process owns this partition now. Stop touching it; the group
        will revoke it from us shortly."""
        self.parts.pop(part.tp, None)
        self.transport.pause([part.tp])

    def _is_redelivery(self, record: Record) -> bool:
        """Only records read from this subscription's redelivery topic are redeliveries: the
        ``rh.origin_*`` headers of a record anywhere else are just bytes, and it is judged on
        its value like any other."""
        return self.redelivery is not None and record.topic == self.redelivery.topic

    def _redelivered(self, records: list[Record]) -> list[Record]:
        return records

    def _origin_tp(self, record: Record) -> TP | None:
        """The stream partition a record belongs to; for a redelivery, the one its redelivery
        partition stands for (None: a partition no stream maps to)."""
        if not self._is_redelivery(record):
            return record.tp
        return self.policy.origin_of(record.partition)

    def _redelivery_problem(self, record: Record) -> EnvelopeError | None:
        """Why a redelivered record cannot be taken as one (it is then dead-lettered as poison)."""
        raw = record.header(ORIGIN_OFFSET)
        if _offset_in(raw) is None:
            return EnvelopeError(
                "redelivery", ORIGIN_OFFSET, raw, "must be the event's offset in its stream"
            )
        return None

    def _origin_offset(self, record: Record) -> int:
        raw = record.header(ORIGIN_OFFSET) if self._is_redelivery(record) else None
        offset = _offset_in(raw)
        return offset if offset is not None else record.offset


def _offset_in(raw: bytes | None) -> int | None:
    """A Kafka offset (an int64: at most 19 digits) written as digits; None for anything else,
    a number int() would refuse past Python's digit limit included."""
    if raw is None or not raw.isdigit() or len(raw) > 19:
        return None
    return int(raw)
