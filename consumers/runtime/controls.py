"""Operator controls per topic-partition (from 002's runner), each appended to an audit log with
who, when and why:

- ``re_reduce``: rebuild the fold from the log, no effects (also automatic when a processor's
  ``reducer_version`` changes);
- ``reprocess_from(offset, expected_revision)``: compare-and-set; bumps the cursor revision, so
  the events from ``offset`` on run their effects again under new claims and new idempotency keys;
- ``skip_through(offset, reason)``: the escape past a poison event; advances the cursor without
  running anything.

The stream keeps 7 days. A control that needs events the stream no longer holds refuses and says
which offsets are missing (the archive, when present, fills them in first: ``ArchiveReader``).
A running owner notices a moved cursor within a second and continues from it.

A fold reads each event as the live path hands it to the processor: upcast to the newest version
``catalog`` knows (``consumers.runtime.versions``), so a fold rebuilt from a log of mixed versions
equals the one built live.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# The audit log lives in its own module; its names stay importable from here.
from consumers.runtime.audit_log import AuditLog, MemoryAuditLog, RedisAuditLog
from consumers.runtime.dead_letters import (
    DeadLetter,
    DeadLetterStore,
    Entry,
    LetterKind,
    LetterStatus,
    batch_letter_id,
)
from consumers.runtime.slot_claims import SlotRef, slot_ref
from consumers.runtime.store import Store
from consumers.runtime.transport import Committed
from consumers.runtime.types import (
    JSON,
    TP,
    EffectKind,
    Processor,
    Progress,
    Record,
    parse_cursor_marker,
    parse_txn_marker,
)
from consumers.runtime.versions import reads_as_written, upcast_for
from streams.catalog import CATALOG, Catalog
from streams.clock import Clock
from streams.envelopes import Event, decode_event, format_time
from streams.errors import ControlRefused, EnvelopeError

__all__ = [
    "ArchiveReader",
    "AuditLog",
    "Controls",
    "Fold",
    "LogReader",
    "MemoryAuditLog",
    "RedisAuditLog",
]


@dataclass
class Fold:
    """A rebuilt fold: the states, the event ids it took, and the events its reduce refused."""

    states: dict[str, JSON] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    refused: list[tuple[Record, Event, Exception]] = field(default_factory=list)


class LogReader(Protocol):
    """Reads a partition's retained records (for refolds), oldest first."""

    def log_start(self, tp: TP) -> int: ...

    def end(self, tp: TP) -> int:
        """The partition's end: one past its last offset (the high watermark)."""

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]:
        """Records with start <= offset <= end."""


class ArchiveReader(Protocol):
    """Events older than the stream's retention, from the long-term archive."""

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]: ...


@dataclass
class Controls:
    processor: Processor
    store: Store
    reader: LogReader
    audit: AuditLog
    dead_letters: DeadLetterStore
    clock: Clock
    max_envelope_bytes: int
    archive: ArchiveReader | None = None
    # The event types and versions the processor's code knows (its RuntimePolicy's).
    catalog: Catalog = CATALOG
    # Rebuilds the dead-letter index and the audit logs from the audit topic before a first fold
    # reads its letters (router.wiring.state): when Redis lost them (argument False: only if the
    # index's marker is gone), or everything the index lacks (True: a Redis restored from an
    # older copy holds the marker, and lacks the letters written since).
    rebuild_index: Callable[[bool], object] | None = None

    def _entry(self, action: str, tp: TP, who: str, why: str, **details: Any) -> dict[str, Any]:
        return {
            "action": action,
            "subscription": self.processor.slug,
            "topic": tp.topic,
            "partition": tp.partition,
            "who": who,
            "why": why,
            "at": format_time(self.clock.now()),
            **details,
        }

    # -- folds -----------------------------------------------------------------------------------
    def _excluded(self, tp: TP, progress: Progress) -> tuple[set[int], set[int]]:
        """Offsets the fold must not contain: (dead-lettered ones not applied since, kept per
        partition by the store, all of them; skipped ones)."""
        skipped: set[int] = set()
        for first, last in progress.skipped:
            skipped.update(range(first, last + 1))
        return set(progress.dead) | self.store.excluded(tp), skipped

    def _records(self, tp: TP, through: int) -> Iterator[Record]:
        return self.read(tp, 0, through, "the fold cannot be rebuilt without them")

    def read(self, tp: TP, first: int, through: int, need: str) -> Iterator[Record]:
        """The records of ``tp`` from ``first`` through ``through``, oldest first: from the
        archive where the stream no longer holds them. Refuses (``need``: what they are for)
        when neither holds them."""
        start = self.reader.log_start(tp)
        if start > first:
            if self.archive is None:
                raise ControlRefused(
                    f"{tp} no longer holds offsets {first}..{start - 1} (past the stream's "
                    f"retention) and no archive reader is configured; {need}"
                )
            yield from self.archive.read(tp, first, min(start - 1, through))
        if through >= start:
            yield from self.reader.read(tp, max(start, first), through)

    def fold(
        self, tp: TP, progress: Progress, through: int, *, also_dead: set[int] | None = None
    ) -> Fold:
        """The processor's fold of every event of ``tp`` up to ``through`` that counts (leaving
        out ``also_dead`` too). An event whose ``reduce`` raises is left out and reported
        (``refused``), as the live path leaves out an event that fails: a refold never aborts on
        one event."""
        proc = self.processor
        result = Fold()
        if not proc.reducer_version:
            return result
        dead, skipped = self._excluded(tp, progress)
        dead |= also_dead or set()
        as_written = reads_as_written(proc)
        wanted = set(progress.applied_beyond)
        last = max([through, *wanted]) if wanted else through
        states = result.states
        for record in self._records(tp, last):
            if record.offset > through and record.offset not in wanted:
                continue
            try:
                event = decode_event(record.value, max_bytes=self.max_envelope_bytes)
            except EnvelopeError:
                continue  # poison: dead-lettered, never folded
            if record.offset in dead or record.offset in skipped:
                # Not folded (a dead letter until retried; or skipped): a later copy of it is a
                # duplicate of that decision.
                result.seen.add(event.event_id)
                continue
            if progress.parks(event.project_id, record.offset):
                continue  # its project is parked: not applied yet (consumers.runtime.parking)
            if (
                proc.consumes is not None and event.event_type not in proc.consumes
            ) or event.event_id in result.seen:
                continue
            try:
                if not as_written:
                    event = upcast_for(self, event)
                new = proc.reduce(states.get(event.project_id), event)
            except Exception as exc:
                result.refused.append((record, event, exc))
                continue
            result.seen.add(event.event_id)
            if new is None:
                states.pop(event.project_id, None)
            else:
                states[event.project_id] = new
        return result

    def _ids_in(self, tp: TP, start: int, end: int) -> set[str]:
        return set(self._ids_by_offset(tp, start, end).values())

    def _ids_by_offset(self, tp: TP, start: int, end: int) -> dict[int, str]:
        """The event id at each offset of ``start..end`` that holds an event."""
        ids: dict[int, str] = {}
        if end < start:
            return ids
        records = (
            self.reader.read(tp, start, end)
            if start >= self.reader.log_start(tp)
            else self._records(tp, end)
        )
        for record in records:
            if record.offset < start:
                continue
            try:
                event = decode_event(record.value, max_bytes=self.max_envelope_bytes)
            except EnvelopeError:
                continue
            ids[record.offset] = event.event_id
        return ids

    def _dead_letter_refused(self, tp: TP, fold: Fold, why: str) -> list[int]:
        """Record the events a refold left out, one dead letter each (idempotent on its id), so
        operators see them and why; returns their offsets."""
        letters = [
            DeadLetter(
                id=batch_letter_id(self.processor.slug, tp.topic, tp.partition, r.offset, "refold"),
                kind=LetterKind.EVENT_BATCH,
                subscription=self.processor.slug,
                source_topic=tp.topic,
                source_partition=tp.partition,
                error=f"{type(exc).__name__}: {exc} (reduce refused it during a refold: {why})",
                error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                attempts=1,
                created_at=format_time(self.clock.now()),
                entries=[Entry.of(r, e)],
            )
            for r, e, exc in fold.refused
        ]
        if letters:
            self.dead_letters.write(letters)
        return [r.offset for r, _, _ in fold.refused]

    def _swap_fold(
        self,
        tp: TP,
        epoch: int | None,
        read: Progress,
        new: Progress,
        fold: Fold,
        why: str,
        audit: Callable[[list[int]], dict[str, Any]],
        readmit: list[int] | None = None,
    ) -> list[int]:
        """Swap in a rebuilt fold and ``new`` cursor (compare-and-set on what was ``read``, its
        fold generation included, and bumping it), after dead-lettering what the fold's reduce
        refused, audited with the entry ``audit`` makes of the refused offsets; returns them."""
        refused = self._dead_letter_refused(tp, fold, why)
        new.fold_generation = read.fold_generation + 1
        with self.audit.recording(audit(refused)):
            self.store.replace_fold(
                tp,
                epoch,
                (read.acked_through, read.cursor_revision),
                new,
                fold.states,
                expected_generation=read.fold_generation,
                exclude=refused,
                readmit=readmit or [],
            )
        return refused

    def re_reduce(self, tp: TP, *, who: str, why: str, epoch: int | None = None) -> int:
        """Rebuild the fold through the acknowledged cursor. No effects run. Returns the number of
        projects in the rebuilt fold."""
        progress = self.store.load(tp)
        fold = self.fold(tp, progress, progress.acked_through)
        new = Progress.from_fields(progress.as_fields())
        new.reducer_version = self.processor.reducer_version
        new.reduced_through = progress.acked_through
        self._swap_fold(
            tp,
            epoch,
            progress,
            new,
            fold,
            why,
            lambda refused: self._entry(
                "re_reduce",
                tp,
                who,
                why,
                reduced_through=progress.acked_through,
                projects=len(fold.states),
                refused=refused,
            ),
        )
        return len(fold.states)

    # -- a partition without a cursor ----------------------------------------------------------
    def letters_by_partition(self, *, restored: bool = False) -> dict[TP, list[DeadLetter]]:
        """This subscription's letters by source partition, from the index, first rebuilt from
        the audit topic (``rebuild_index``) if Redis lost it or, ``restored``, went back to an
        older copy."""
        if self.rebuild_index is not None:
            self.rebuild_index(restored)
        out: dict[TP, list[DeadLetter]] = {}
        for letter in self.dead_letters.list(limit=sys.maxsize):
            if letter.subscription == self.processor.slug and letter.kind != LetterKind.COMMAND:
                out.setdefault(TP(letter.source_topic, letter.source_partition), []).append(letter)
        return out

    def behind(self, progress: Progress, committed: Committed | None) -> bool:
        """Whether a partition's stored cursor is behind what its group committed: a Redis
        restored from an older copy, or one that lost writes it had acknowledged. The committed
        offset's metadata says what the store held when it was committed (the runtime commits it
        after the store): with Kafka effects a later transaction than the store's, with effects
        in Redis or SQL a later cursor. Files effects record their parts against the committed
        offset; an offset committed without our metadata says nothing."""
        if committed is None or not progress.has_cursor():
            return False
        kind = self.processor.effect_kind
        if kind == EffectKind.KAFKA:
            seq = parse_txn_marker(committed.metadata)
            return seq is not None and seq > progress.txn_seq
        cursor = parse_cursor_marker(committed.metadata)
        return kind != EffectKind.FILES and cursor is not None and cursor > progress.acked_through

    def first_fold(
        self,
        tp: TP,
        *,
        epoch: int | None = None,
        committed: Committed | None = None,
        letters: Sequence[DeadLetter] = (),
    ) -> int:
        """What a partition takes before its owner first reads it, when it has no cursor (a new
        subscription, or a Redis that lost its state) or a cursor :meth:`behind` its group's
        (a Redis restored from an older copy): what Kafka keeps durably, past the cursor.

        - ``letters`` (this partition's, from the dead-letter index) and the ranges its audit
          log says an operator skipped: their events claimed as handled without effect and
          their offsets left out of every fold, so reading them again neither applies them nor
          dead-letters them again. A letter retried, or one whose events a later
          ``reprocess_from`` judged again, does not count; nor does a skip a later
          ``reprocess_from`` reached back before;
        - with Kafka effects, the group's ``committed`` offset: the fold of every event before
          it, with no effects (their transactions committed that offset: sending them again
          would send them twice), and the cursor just before it;
        - a new fold over a stream that no longer starts at 0: the history the stream lost,
          from the archive (no effects: it is history), and the cursor just before the
          stream's first retained offset.

        Effects in Redis are not restored here: the owner reads on from the cursor (the log
        start, without one) and applies them again into the state Redis holds, whose claims
        went back with it. Returns the number of projects folded."""
        progress = self.store.load(tp)
        behind = self.behind(progress, committed)
        if progress.has_cursor() and not behind:
            return 0
        after = progress.acked_through  # what the store holds through
        moves = self._moves(tp)
        counted = [
            letter
            for letter in letters
            if _still_dead(letter, moves) and max(letter.offsets, default=-1) > after
        ]
        skipped = [[max(f, after + 1), last] for f, last in _skipped_ranges(moves) if last > after]
        through = after
        if not progress.has_cursor() and self.processor.reducer_version:
            through = max(through, self.reader.log_start(tp) - 1)
        if self.processor.effect_kind == EffectKind.KAFKA and committed is not None:
            through = max(through, committed.offset - 1)
        if through == after and not counted and not skipped:
            return 0  # a new subscription, or a store behind by nothing it must take
        new = Progress.from_fields(progress.as_fields())
        new.skipped = [*progress.skipped, *skipped]
        dead_offsets = sorted({o for letter in counted for o in letter.offsets})
        states: dict[str, JSON] | None = None  # the fold as it is
        refused: list[int] = []
        why = "the store holds less than Kafka: taken from the dead letters, the audit log"
        if through != after:
            new.acked_through = through
            new.reduced_through = through
            new.reducer_version = self.processor.reducer_version
            new.applied_beyond = [o for o in progress.applied_beyond if o > through]
            new.dead = [o for o in progress.dead if o > through]
            if committed is not None and self.processor.effect_kind == EffectKind.KAFKA:
                new.txn_seq = max(progress.txn_seq, parse_txn_marker(committed.metadata) or 0)
                new.pending_effects = False  # its transaction is one the group committed
                why += " and the group's offset"
            fold = self.fold(tp, new, through, also_dead=set(dead_offsets))
            states = fold.states
            refused = self._dead_letter_refused(tp, fold, why)
        new.fold_generation = progress.fold_generation + 1
        dead_ids, slots = self._handled(tp, counted, skipped)
        new.look_through = max([progress.look_through, *dead_offsets, *(r[1] for r in skipped)])
        entry = self._entry(
            "first_fold",
            tp,
            "runtime",
            why,
            after=after,
            through=through,
            projects=len(states) if states is not None else None,
            letters=[letter.id for letter in counted],
            skipped=skipped,
            refused=refused,
        )
        with self.audit.recording(entry):
            self.store.replace_fold(
                tp,
                epoch,
                (progress.acked_through, progress.cursor_revision),
                new,
                states,
                expected_generation=progress.fold_generation,
                exclude=sorted({*refused, *dead_offsets}),
                dead_claims=dead_ids,
                slots=slots,
            )
        if progress.pending_effects and not new.pending_effects:
            self.store.clear_pending(tp, epoch if epoch is not None else self.store.epoch(tp))
        return len(states) if states is not None else 0

    def _moves(self, tp: TP) -> list[dict[str, Any]]:
        """The operator moves of ``tp`` its audit log holds (every one that took), oldest first."""
        return [
            e
            for e in reversed(self.audit.entries(limit=sys.maxsize))
            if e.get("topic") == tp.topic
            and e.get("partition") == tp.partition
            and e.get("action") in ("skip_through", "reprocess_from")
        ]

    def _handled(
        self, tp: TP, letters: Sequence[DeadLetter], skipped: list[list[int]]
    ) -> tuple[list[str], dict[str, SlotRef]]:
        """The events of these letters and skipped ranges, and where the outbox events among
        them sit (claimed by slot, as the live path claims them)."""
        ids: list[str] = []
        slots: dict[str, SlotRef] = {}
        for letter in letters:
            for entry in letter.entries:
                if entry.event_id is None or entry.value is None:
                    continue  # poison bytes: no event to claim (their offset is left out)
                ids.append(entry.event_id)
                with contextlib.suppress(EnvelopeError):
                    event = decode_event(entry.value, max_bytes=self.max_envelope_bytes)
                    headers = [(k, v) for k, v in entry.headers if v is not None]
                    ref = slot_ref(headers, event)
                    if ref is not None:
                        slots[event.event_id] = ref
        for first, last in skipped:
            for record in self.read(tp, first, last, "the skipped events cannot be claimed"):
                try:
                    event = decode_event(record.value, max_bytes=self.max_envelope_bytes)
                except EnvelopeError:
                    continue
                ids.append(event.event_id)
                ref = slot_ref(record.headers, event)
                if ref is not None:
                    slots[event.event_id] = ref
        return list(dict.fromkeys(ids)), slots

    def reprocess_from(
        self, tp: TP, offset: int, expected_revision: int, *, who: str, why: str
    ) -> Progress:
        progress = self.store.load(tp)
        if progress.cursor_revision != expected_revision:
            raise ControlRefused(
                f"{tp} is at cursor revision {progress.cursor_revision}, not {expected_revision}: "
                "someone else moved it; read the current revision and decide again"
            )
        start = self.reader.log_start(tp)
        # Backwards only, and only over events something still holds: a forward "reprocess"
        # would fold events without their effects and record no skipped range.
        low = 0 if self.archive is not None else start
        high = progress.acked_through + 1
        if not low <= offset <= high:
            held = "the stream and the archive hold" if self.archive else "the stream holds"
            raise ControlRefused(
                f"cannot reprocess {tp} from {offset}: it takes an offset in {low}..{high} "
                f"({held} offsets from {low}; the cursor is acknowledged through "
                f"{progress.acked_through}, so {high} is the furthest)"
            )
        new = Progress.from_fields(progress.as_fields())
        new.acked_through = offset - 1
        new.cursor_revision = progress.cursor_revision + 1
        new.applied_beyond = []
        new.dead = [o for o in progress.dead if o < offset]
        # Everything from the offset on is judged again: what was skipped or dead-lettered
        # there runs again too (and is skipped or dead-lettered again only if it fails again).
        new.skipped = [
            [first, min(last, offset - 1)] for first, last in progress.skipped if first < offset
        ]
        readmitted = sorted(o for o in self.store.excluded(tp) if o >= offset)
        new.pending_effects = progress.pending_effects
        fold = self.fold(tp, new, offset - 1)
        # The live path claims at the new revision; events folded above whose copies it will
        # meet again in the re-run range are duplicates, as the fold (by id) takes them.
        # (A reprocess of a reprocess not yet caught up keeps the earlier, longer range.)
        reached = max([progress.acked_through, *progress.applied_beyond])
        new.rerun_through = max(reached, progress.rerun_through)
        new.rerun_duplicates = sorted(self._ids_in(tp, offset, new.rerun_through) & fold.seen)
        new.reduced_through = offset - 1
        new.reducer_version = self.processor.reducer_version
        self._swap_fold(
            tp,
            None,
            progress,
            new,
            fold,
            why,
            lambda refused: self._entry(
                "reprocess_from",
                tp,
                who,
                why,
                offset=offset,
                revision=new.cursor_revision,
                refused=refused,
            ),
            readmitted,
        )
        return new

    def skip_through(self, tp: TP, offset: int, *, who: str, why: str) -> Progress:
        if not why.strip():
            raise ControlRefused(
                "skip_through needs a reason: it is the audited escape past an event"
            )
        progress = self.store.load(tp)
        if offset <= progress.acked_through:
            raise ControlRefused(
                f"{tp} is already acknowledged through {progress.acked_through}; nothing to skip"
            )
        last = self.reader.end(tp) - 1
        if offset > last:
            raise ControlRefused(
                f"cannot skip {tp} through {offset}: the partition ends at offset {last}; "
                "events that have not arrived cannot be skipped"
            )
        new = Progress.from_fields(progress.as_fields())
        # Events applied already at this revision were not skipped: past a held-back one
        # (applied_beyond), or through a retry of their dead letter. They stay in the fold, so
        # they stay out of the skipped ranges.
        ids = self._ids_by_offset(tp, progress.acked_through + 1, offset)
        applied = self.store.claimed(tp, progress.cursor_revision, sorted(set(ids.values())))
        holes = set(progress.applied_beyond) | {o for o, e in ids.items() if e in applied}
        ranges = _ranges_without(progress.acked_through + 1, offset, holes)
        new.skipped = [*progress.skipped, *ranges]
        # A skipped event is handled (without effect), as a dead-lettered one is: a later copy
        # of it is a duplicate for the live path, as it is for a fold (which saw its id).
        skipped_ids = {e for o, e in ids.items() if o not in holes}
        new.acked_through = offset
        new.applied_beyond = [o for o in progress.applied_beyond if o > offset]
        new.dead = [o for o in progress.dead if o > offset]
        if self.processor.reducer_version:
            new.reduced_through = offset
        entry = self._entry(
            "skip_through",
            tp,
            who,
            why,
            offset=offset,
            skipped_from=progress.acked_through + 1,
            ranges=ranges,
        )
        with self.audit.recording(entry):
            self.store.replace_fold(
                tp,
                None,
                (progress.acked_through, progress.cursor_revision),
                new,
                None,
                expected_generation=progress.fold_generation,
                dead_claims=sorted(skipped_ids),
            )
        return new


def _ranges_without(first: int, last: int, holes: set[int]) -> list[list[int]]:
    """[first, last] as [start, end] ranges that leave out the offsets in ``holes``."""
    out: list[list[int]] = []
    start = None
    for offset in range(first, last + 1):
        if offset in holes:
            if start is not None:
                out.append([start, offset - 1])
                start = None
        elif start is None:
            start = offset
    if start is not None:
        out.append([start, last])
    return out


def _still_dead(letter: DeadLetter, moves: list[dict[str, Any]]) -> bool:
    """A letter whose events stay handled without effect: not retried, and not judged again by a
    ``reprocess_from`` made after it from an offset at or before its first."""
    if letter.status == LetterStatus.RETRIED:
        return False
    first = min(letter.offsets, default=0)
    return not any(
        m["action"] == "reprocess_from" and m["offset"] <= first and m["at"] > letter.created_at
        for m in moves
    )


def _skipped_ranges(moves: list[dict[str, Any]]) -> list[list[int]]:
    """The ranges the moves (oldest first) leave skipped: each skip's (an entry from before
    skips recorded their ranges: its whole span), cut back by every later ``reprocess_from``."""
    ranges: list[list[int]] = []
    for move in moves:
        if move["action"] == "skip_through":
            ranges += move.get("ranges") or [[move["skipped_from"], move["offset"]]]
        else:
            cut = move["offset"]
            ranges = [[first, min(last, cut - 1)] for first, last in ranges if first < cut]
    return ranges
