"""The consume loop of one subscription process: poll a batch → decode → claim → apply → commit.

Per partition of a batch, in offset order:

- a record that does not decode is a *poison* record: dead-lettered at once with its raw bytes and
  the reason, then treated as done;
- an event of a type the processor does not consume, or already claimed at the current cursor
  revision (a duplicate), or already applied / dead-lettered per the cursor, is done;
- a fresh event is folded (``reduce``) and processed (``process``); if either raises, it fails and
  every later event *of its project* in the batch is held back; other projects go on;
- the claims, Redis effects, fold changes, pending Kafka effects and the new cursor commit in one
  atomic step, fenced by the owner epoch and compare-and-set on the cursor;
- Kafka effects then go out in one transaction with the consumed offsets; the pending copy is
  cleared once it committed (a crash in between is recovered by whoever owns the partition next:
  if the group's committed offset shows the transaction landed, the copy is dropped, else it is
  re-sent with the same ids);
- a failure is counted under (subscription, topic, partition, first unapplied offset); below the
  limit the partition pauses, seeks back and retries after a backoff while others flow; at the
  limit the failing events are dead-lettered, marked done, and the partition moves on (or, under
  the ``block`` policy, it retries forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from opentelemetry import trace

from consumers.runtime.controls import Controls
from consumers.runtime.dead_letters import DeadLetter, DeadLetterStore, Entry, batch_letter_id
from consumers.runtime.parts import Line, OpenPart, PartWriter, is_part, part_record
from consumers.runtime.store import Commit, CursorMoved, Fenced, PendingEffects, Store
from consumers.runtime.transport import CommittedUnknown, Output, Redelivery, Transport
from consumers.runtime.types import (
    JSON,
    TP,
    Delivery,
    EffectKind,
    OutRecord,
    Phase,
    Processor,
    Progress,
    Record,
    RedisOp,
)
from streams import failpoints
from streams.clock import Clock
from streams.envelopes import Event, decode_event, format_time
from streams.errors import EnvelopeError, TransactionFailed

log = logging.getLogger("rhumbatron.runtime")
tracer = trace.get_tracer("rhumbatron.runtime")


@dataclass(frozen=True)
class RuntimePolicy:
    batch_size: int
    max_batch_failures: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    max_envelope_bytes: int
    on_failure: str = "dead-letter"  # or "block": retry forever, skip_through the only escape
    control_check_interval_s: float = 1.0
    # Redelivery topic partition k belongs to origin (streams[k // P], k % P).
    streams: tuple[str, ...] = ()
    partitions_per_stream: int = 1

    def redelivery_partition(self, tp: TP) -> int | None:
        if tp.topic not in self.streams:
            return None
        return self.streams.index(tp.topic) * self.partitions_per_stream + tp.partition


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
    fenced: int = 0
    redelivered: int = 0
    transactions: int = 0
    recovered: int = 0
    parts: int = 0


@dataclass
class _Partition:
    tp: TP
    epoch: int
    progress: Progress
    live_from: int
    states: dict[str, JSON | None] = field(default_factory=dict)
    retry_at: float | None = None
    retry_from: int | None = None
    needs_recovery: bool = False
    needs_refold: bool = False
    redelivery: int | None = None
    open_part: OpenPart | None = None  # files processors: the part being filled


@dataclass
class _Outcome:
    """What processing one partition's slice of a batch produced."""

    commit: Commit
    failed: list[tuple[Record, Event, BaseException]]
    first_unapplied: int | None
    letters: list[DeadLetter]
    lines: list[Line] = field(default_factory=list)


class ProcessorError(Exception):
    """Wraps what a processor raised, keeping which step (reduce or process) it came from."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        self.cause = cause
        super().__init__(f"{step} raised {type(cause).__name__}: {cause}")


class Runner:
    def __init__(
        self,
        processor: Processor,
        transport: Transport,
        store: Store,
        dead_letters: DeadLetterStore,
        policy: RuntimePolicy,
        clock: Clock,
        *,
        output: Output | None = None,
        redelivery: Redelivery | None = None,
        controls: Controls | None = None,
        failpoint: Callable[[str], None] = failpoints.hit,
    ) -> None:
        if processor.effect_kind == EffectKind.KAFKA and output is None:
            raise ValueError(f"{processor.slug} has Kafka effects and needs an output producer")
        self.processor = processor
        self.transport = transport
        self.store = store
        self.dead_letters = dead_letters
        self.policy = policy
        self.clock = clock
        self.output = output
        self.redelivery = redelivery
        self.controls = controls
        self.failpoint = failpoint
        self.stats = Stats()
        self.parts: dict[TP, _Partition] = {}
        self._last_control_check = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, topics: list[str]) -> None:
        self.transport.subscribe(topics, self._on_assign, self._on_revoke)

    def close(self) -> None:
        self._close_all_parts(self.parts.values())
        if self.parts:
            self._commit_group_offsets(self.parts.values())
        self.transport.close()
        if self.redelivery is not None:
            self.redelivery.close()
        if self.output is not None:
            self.output.close()

    def _on_assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        starts: dict[TP, int | None] = {}
        for tp in tps:
            epoch = self.store.acquire(tp)  # any older owner is fenced from here on
            progress = self.store.load(tp)
            part = _Partition(
                tp, epoch, progress, live_from=self.transport.high_watermark(tp, cached=False)
            )
            part.needs_recovery = progress.pending_effects
            part.needs_refold = bool(
                self.processor.reducer_version
                and progress.acked_through >= 0
                and progress.reducer_version != self.processor.reducer_version
            )
            part.redelivery = self.policy.redelivery_partition(tp)
            self.parts[tp] = part
            starts[tp] = progress.acked_through + 1 if progress.acked_through >= 0 else None
            if self.redelivery is not None and part.redelivery is not None:
                self.redelivery.assign(part.redelivery, progress.redelivered_next)
            log.info(
                "%s: assigned %s at epoch %d from offset %s",
                self.processor.slug,
                tp,
                epoch,
                starts[tp],
            )
        return starts

    def _on_revoke(self, tps: list[TP]) -> None:
        # An open part closes before its partition goes: the next owner starts after it.
        self._close_all_parts([self.parts[tp] for tp in tps if tp in self.parts])
        gone = [self.parts.pop(tp) for tp in tps if tp in self.parts]
        # A partition paused for a retry leaves clean: resumed, its retry forgotten (the failure
        # count lives in the store under the batch key, so the next owner continues it).
        self.transport.resume([p.tp for p in gone if p.retry_at is not None])
        if self.redelivery is not None:
            for p in gone:
                if p.redelivery is not None:
                    self.redelivery.unassign(p.redelivery)
        self._commit_group_offsets(gone)
        for p in gone:
            log.info("%s: revoked %s", self.processor.slug, p.tp)

    # -- the loop --------------------------------------------------------------------------------
    def run_once(self, timeout: float = 0.5) -> int:
        """One poll and everything it brings. Returns the number of records handled."""
        self._resume_due()
        self._check_controls()
        self._refold()
        self._recover_pending()
        self._flush_due()
        records = self.transport.poll(self.policy.batch_size, timeout)
        if self.redelivery is not None:
            records += self._redelivered(self.redelivery.poll(self.policy.batch_size))
        # Partitions assigned inside this poll: refold and finish their pending effects before any
        # new record of theirs is processed (new pending effects must never replace old ones).
        self._refold()
        self._recover_pending()
        if not records:
            return 0
        self.stats.batches += 1
        self.stats.records += len(records)
        by_tp: dict[TP, list[Record]] = {}
        for record in records:
            origin = self._origin_tp(record)
            part = self.parts.get(origin)
            if part is None or part.retry_at is not None:
                continue  # not ours any more, or waiting for its retry: it will come again
            if part.needs_recovery or part.needs_refold:
                self._defer(part)
                continue
            by_tp.setdefault(origin, []).append(record)
        with tracer.start_as_current_span(
            f"{self.processor.slug} batch", attributes={"records": len(records)}
        ):
            outcomes = []
            for tp, recs in by_tp.items():
                outcome = self._process_partition(self.parts[tp], recs)
                if outcome is not None:
                    outcomes.append(outcome)
            self._commit(outcomes)
        return len(records)

    def idle(self) -> bool:
        """Nothing paused for a retry and nothing pending."""
        return all(p.retry_at is None and not p.needs_recovery for p in self.parts.values())

    def run(
        self,
        *,
        until_idle_s: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
    ) -> Stats:
        quiet_since = self.clock.monotonic()
        while not should_stop():
            tick()
            handled = self.run_once()
            now = self.clock.monotonic()
            if handled or not self.idle() or not self.parts:
                quiet_since = now
            elif until_idle_s is not None and now - quiet_since >= until_idle_s:
                break
        return self.stats

    # -- one partition ---------------------------------------------------------------------------
    def _process_partition(self, part: _Partition, records: list[Record]) -> _Outcome | None:
        proc = self.processor
        # With an open part, what it holds is done already, though not yet committed.
        progress = part.open_part.progress if part.open_part else part.progress
        fresh_candidates: list[tuple[Record, Event]] = []
        poison: list[tuple[Record, EnvelopeError]] = []
        decoded: dict[int, Event | None] = {}
        redelivered_max = progress.redelivered_next
        for record in records:
            if self._is_redelivery(record):
                if record.offset < redelivered_max:
                    decoded[id(record)] = None
                    continue
            elif progress.is_done(record.offset):
                decoded[id(record)] = None
                continue
            try:
                event = decode_event(record.value, max_bytes=self.policy.max_envelope_bytes)
            except EnvelopeError as exc:
                poison.append((record, exc))
                decoded[id(record)] = None
                continue
            decoded[id(record)] = event
            if proc.consumes is None or event.event_type in proc.consumes:
                fresh_candidates.append((record, event))
        claimed = self.store.claimed(
            part.tp, progress.cursor_revision, [e.event_id for _, e in fresh_candidates]
        )
        if proc.reducer_version:
            missing = {e.project_id for _, e in fresh_candidates if e.project_id not in part.states}
            part.states.update(self.store.states(part.tp, missing))

        letters = [self._poison_letter(part.tp, r, exc) for r, exc in poison]
        self.stats.poison += len(poison)
        done: set[int] = {id(r) for r, _ in poison}
        held: set[str] = set()
        failed: list[tuple[Record, Event, BaseException]] = []
        claims: list[str] = []
        seen_ids: set[str] = set(part.open_part.claims) if part.open_part else set()
        lines: list[Line] = []
        ops: list[RedisOp] = []
        out: list[OutRecord] = []
        changed: dict[str, JSON | None] = {}  # the fold after this batch; cached once committed
        high = self.transport.high_watermark(part.tp)
        for record in records:
            rid = id(record)
            maybe = decoded.get(rid)
            if rid in done:
                continue
            if maybe is None or (
                proc.consumes is not None and maybe.event_type not in proc.consumes
            ):
                done.add(rid)
                self.stats.filtered += maybe is not None
                continue
            event = maybe
            if event.event_id in claimed or event.event_id in seen_ids:
                done.add(rid)
                self.stats.duplicates += 1
                continue
            if event.project_id in held:
                continue
            delivery = self._delivery(part, record, high)
            try:
                state = (
                    changed[event.project_id]
                    if event.project_id in changed
                    else part.states.get(event.project_id)
                )
                try:
                    new_state = proc.reduce(state, event) if proc.reducer_version else None
                except Exception as exc:
                    raise ProcessorError("reduce", exc) from exc
                try:
                    effects = proc.process(event, new_state, delivery)
                except Exception as exc:
                    raise ProcessorError("process", exc) from exc
            except ProcessorError as exc:
                failed.append((record, event, exc.cause))
                held.add(event.project_id)
                log.warning(
                    "%s: %s at %s@%d failed: %s",
                    proc.slug,
                    event.event_id,
                    part.tp,
                    record.offset,
                    exc,
                )
                continue
            done.add(rid)
            seen_ids.add(event.event_id)
            claims.append(event.event_id)
            ops.extend(effects.redis)
            out.extend(effects.records)
            ts = int(event.timestamp.timestamp() * 1000)
            lines.extend(Line(record.offset, ts, data) for data in effects.lines)
            if proc.reducer_version:
                changed[event.project_id] = new_state
            if self._is_redelivery(record):
                self.stats.redelivered += 1
        self.stats.applied += len(claims)

        # The new cursor: contiguous over done stream records; done ones past a hold-back are
        # remembered in applied_beyond. Redelivered records advance only the redelivery cursor.
        new = Progress.from_fields(progress.as_fields())
        new.reducer_version = proc.reducer_version
        acked = progress.acked_through
        beyond = set(progress.applied_beyond)
        first_unapplied: int | None = None
        for record in records:
            if self._is_redelivery(record):
                if id(record) in done and record.offset == new.redelivered_next:
                    new.redelivered_next = record.offset + 1
                continue
            if id(record) in done:
                if first_unapplied is None:
                    acked = max(acked, record.offset)
                else:
                    beyond.add(record.offset)
            elif first_unapplied is None:
                first_unapplied = record.offset
        new.acked_through = acked
        new.applied_beyond = sorted(o for o in beyond if o > acked)
        new.dead = sorted(o for o in progress.dead if o > acked)
        new.reduced_through = acked if proc.reducer_version else new.reduced_through
        new.pending_effects = bool(out)
        commit = Commit(
            tp=part.tp,
            epoch=part.epoch,
            expected_acked=progress.acked_through,
            expected_revision=progress.cursor_revision,
            progress=new,
            claims=claims,
            redis=ops,
            states=changed,
            pending=out if out else None,
        )
        return _Outcome(commit, failed, first_unapplied, letters, lines)

    # -- committing ------------------------------------------------------------------------------
    def _commit(self, outcomes: list[_Outcome]) -> None:
        committed: list[_Outcome] = []
        for outcome in outcomes:
            part = self.parts.get(outcome.commit.tp)
            if part is None:
                continue
            if outcome.letters:
                # Poison records go to the dead-letter store before the cursor passes them; if
                # that write fails, nothing of this partition commits and the batch comes again.
                try:
                    self.dead_letters.write(outcome.letters)
                except Exception as exc:
                    log.error(
                        "%s: dead-letter write failed, %s not committed: %s",
                        self.processor.slug,
                        part.tp,
                        exc,
                    )
                    self._schedule_retry(part, outcome.commit.expected_acked + 1, 1)
                    self._rewind_redelivery(part)
                    continue
                self.stats.dead_lettered += len(outcome.letters)
            if self.processor.effect_kind == EffectKind.FILES:
                if outcome.failed:
                    part.open_part = None  # its lines are read again from the committed cursor
                    self._handle_failure(part, outcome)
                else:
                    self._fill_part(part, outcome)
                continue
            self.failpoint("runtime.before_store_commit")
            try:
                self.store.commit(outcome.commit)
            except Fenced as exc:
                self.stats.fenced += 1
                log.warning("%s: %s", self.processor.slug, exc)
                self._drop(part)
                continue
            except (CursorMoved, PendingEffects) as exc:
                log.warning("%s: %s; reloading", self.processor.slug, exc)
                self._reload(part)
                part.needs_recovery = part.progress.pending_effects
                continue
            part.progress = outcome.commit.progress
            part.states.update(outcome.commit.states)
            committed.append(outcome)
            self.failpoint("runtime.after_store_commit")
        if self.processor.effect_kind == EffectKind.KAFKA and committed:
            # Every batch commits its offsets in a transaction, with its records if it has any.
            self._publish(committed)
        self._commit_group_offsets(
            [self.parts[o.commit.tp] for o in committed if o.commit.tp in self.parts]
        )
        self.failpoint("runtime.after_offsets_commit")
        for outcome in committed:
            part = self.parts.get(outcome.commit.tp)
            if part is None:
                continue
            if outcome.failed:
                self._handle_failure(part, outcome)
            elif outcome.first_unapplied is None and part.retry_from is not None:
                part.retry_from = None

    # -- files: open parts ------------------------------------------------------------------------
    def _writer(self) -> PartWriter:
        return cast(PartWriter, self.processor)

    def _fill_part(self, part: _Partition, outcome: _Outcome) -> None:
        if part.open_part is None:
            part.open_part = OpenPart(opened_at=self.clock.monotonic(), progress=part.progress)
        part.open_part.add(outcome.commit.progress, outcome.commit.claims, outcome.lines)
        self._close_part_if_done(part)

    def _close_part_if_done(self, part: _Partition) -> None:
        open_part = part.open_part
        if open_part is None:
            return
        age = self.clock.monotonic() - open_part.opened_at
        if self._writer().should_close(len(open_part.lines), open_part.size, age):
            self._close_part(part)

    def _close_part(self, part: _Partition) -> None:
        """Record the part's boundaries with the cursor, then write it, then clear the record."""
        open_part, part.open_part = part.open_part, None
        if open_part is None:
            return
        writer = self._writer()
        pending = None
        if open_part.lines:
            key, blob = writer.finish(part.tp, open_part.lines)
            pending = [part_record(key, blob)]
        new = Progress.from_fields(open_part.progress.as_fields())
        new.pending_effects = pending is not None
        commit = Commit(
            part.tp,
            part.epoch,
            part.progress.acked_through,
            part.progress.cursor_revision,
            new,
            claims=open_part.claims,
            pending=pending,
        )
        self.failpoint("runtime.before_store_commit")
        try:
            self.store.commit(commit)
        except Fenced as exc:
            self.stats.fenced += 1
            log.warning("%s: %s", self.processor.slug, exc)
            self._drop(part)
            return
        except (CursorMoved, PendingEffects) as exc:
            log.warning("%s: %s; reloading", self.processor.slug, exc)
            self._reload(part)
            part.needs_recovery = part.progress.pending_effects
            return
        part.progress = new
        self.failpoint("runtime.after_store_commit")
        if pending is not None:
            writer.store(pending[0].key, pending[0].value)
            self.stats.parts += 1
            self.failpoint("runtime.after_part_write")
            self._clear_pending(part)
        self._commit_group_offsets([part])

    def _flush_due(self) -> None:
        if self.processor.effect_kind != EffectKind.FILES:
            return
        for part in list(self.parts.values()):
            self._close_part_if_done(part)

    def _close_all_parts(self, parts: Iterable[_Partition]) -> None:
        if self.processor.effect_kind != EffectKind.FILES:
            return
        for part in list(parts):
            if part.open_part is not None and part.tp in self.parts:
                self._close_part(part)

    def _publish(self, outcomes: list[_Outcome]) -> None:
        """Kafka effects of committed partitions, in one transaction with their offsets."""
        assert self.output is not None
        offsets = {o.commit.tp: o.commit.progress.acked_through + 1 for o in outcomes}
        records = [r for o in outcomes for r in (o.commit.pending or [])]
        try:
            self._transact(records, offsets)
        except TransactionFailed as exc:
            # The pending copies stay in the store; recovery re-sends them (same ids) before
            # anything else of those partitions is processed.
            log.warning("%s: transaction failed, will re-send: %s", self.processor.slug, exc)
            for o in outcomes:
                if o.commit.tp in self.parts:
                    self.parts[o.commit.tp].needs_recovery = True
            return
        for o in outcomes:
            part = self.parts.get(o.commit.tp)
            if part is not None:
                self._clear_pending(part)

    def _transact(self, records: list[OutRecord], offsets: Mapping[TP, int]) -> None:
        assert self.output is not None
        self.output.begin()
        try:
            for record in records:
                self.output.produce(record)
            self.output.send_offsets(offsets, self.transport.group_metadata())
            self.failpoint("runtime.before_transaction_commit")
            self.output.commit()
        except TransactionFailed:
            self.output.abort()
            raise
        except Exception as exc:
            self.output.abort()
            raise TransactionFailed("output", str(exc), abortable=True) from exc
        self.stats.transactions += 1
        self.failpoint("runtime.after_transaction_commit")

    def _clear_pending(self, part: _Partition) -> None:
        try:
            self.store.clear_pending(part.tp, part.epoch)
            part.progress.pending_effects = False
            part.needs_recovery = False
        except Fenced:
            self._drop(part)

    def _refold(self) -> None:
        """A processor whose ``reducer_version`` changed rebuilds its fold before going on: no
        effects run again, only ``reduce``."""
        for part in [p for p in self.parts.values() if p.needs_refold]:
            if self.controls is None:
                raise RuntimeError(
                    f"{self.processor.slug}: reducer_version changed but no controls to refold {part.tp}"
                )
            old = part.progress.reducer_version
            self.controls.re_reduce(
                part.tp,
                who="runtime",
                why=f"reducer_version {old!r} -> {self.processor.reducer_version!r}",
                epoch=part.epoch,
            )
            part.needs_refold = False
            part.progress = self.store.load(part.tp)
            part.states.clear()

    def _recover_pending(self) -> None:
        """Finish Kafka effects a crash or an aborted transaction left pending."""
        todo = [p for p in self.parts.values() if p.needs_recovery]
        if todo and self.processor.effect_kind == EffectKind.FILES:
            for part in todo:
                for record in self.store.pending(part.tp):
                    if is_part(record):
                        self._writer().store(record.key, record.value)
                        self.stats.recovered += 1
                self._clear_pending(part)
            return
        if not todo or self.output is None:
            for p in todo:
                p.needs_recovery = False
            return
        try:
            committed = self.transport.committed([p.tp for p in todo])
        except CommittedUnknown as exc:
            log.info(
                "%s: cannot tell yet whether pending effects landed (%s); will ask again",
                self.processor.slug,
                exc,
            )
            return
        for part in todo:
            landed = committed.get(part.tp)
            records = self.store.pending(part.tp)
            if records and (landed is None or landed <= part.progress.acked_through):
                try:
                    self._transact(records, {part.tp: part.progress.acked_through + 1})
                except TransactionFailed as exc:
                    log.warning(
                        "%s: recovery of %s failed, will retry: %s",
                        self.processor.slug,
                        part.tp,
                        exc,
                    )
                    continue
                self.stats.recovered += len(records)
            self._clear_pending(part)

    def _commit_group_offsets(self, parts: Iterable[_Partition]) -> None:
        offsets = {
            p.tp: p.progress.acked_through + 1 for p in parts if p.progress.acked_through >= 0
        }
        if offsets and self.processor.effect_kind != EffectKind.KAFKA:
            self.transport.commit_offsets(offsets)

    # -- failure ---------------------------------------------------------------------------------
    def _handle_failure(self, part: _Partition, outcome: _Outcome) -> None:
        self.stats.failures += 1
        if outcome.first_unapplied is not None:
            batch_key = str(outcome.first_unapplied)
        else:  # only redelivered records failed
            batch_key = f"redelivery-{min(r.offset for r, _, _ in outcome.failed)}"
        attempts = self.store.count_failure(part.tp, batch_key)
        # Where to read again: the first unapplied offset; for files, the committed cursor (the
        # open part's lines were discarded with it).
        resume_at = outcome.first_unapplied
        if self.processor.effect_kind == EffectKind.FILES and resume_at is not None:
            resume_at = part.progress.acked_through + 1
        if self.policy.on_failure == "block" or attempts < self.policy.max_batch_failures:
            self._schedule_retry(part, resume_at, attempts)
            return
        letter = self._batch_letter(part.tp, batch_key, outcome.failed, attempts)
        try:
            self.dead_letters.write([letter])
        except Exception as exc:
            log.error(
                "%s: dead-letter write failed; retrying the batch: %s", self.processor.slug, exc
            )
            self._schedule_retry(part, resume_at, attempts)
            return
        self.stats.dead_lettered += 1
        new = Progress.from_fields(part.progress.as_fields())
        redelivered = [r for r, _, _ in outcome.failed if self._is_redelivery(r)]
        stream_failed = [r.offset for r, _, _ in outcome.failed if not self._is_redelivery(r)]
        new.dead = sorted(set(new.dead) | set(stream_failed))
        for r in sorted(redelivered, key=lambda r: r.offset):
            if r.offset == new.redelivered_next:
                new.redelivered_next = r.offset + 1
        # Dead offsets at the head of the line let the cursor pass them right away.
        acked = new.acked_through
        while acked + 1 in new.dead or acked + 1 in new.applied_beyond:
            acked += 1
        new.acked_through = acked
        new.dead = [o for o in new.dead if o > acked]
        new.applied_beyond = [o for o in new.applied_beyond if o > acked]
        commit = Commit(
            part.tp, part.epoch, part.progress.acked_through, part.progress.cursor_revision, new
        )
        try:
            self.store.commit(commit)
        except (Fenced, CursorMoved) as exc:
            log.warning("%s: %s", self.processor.slug, exc)
            self._reload(part)
            return
        part.progress = new
        self.store.clear_failures(part.tp, batch_key)
        if resume_at is not None:
            self.transport.seek(part.tp, resume_at)
        log.error(
            "%s: dead-lettered %s after %d attempts: %s",
            self.processor.slug,
            letter.id,
            attempts,
            letter.error,
        )

    def _schedule_retry(self, part: _Partition, first_unapplied: int | None, attempts: int) -> None:
        delay = min(
            self.policy.retry_backoff_s * 2 ** max(attempts - 1, 0), self.policy.retry_backoff_max_s
        )
        part.retry_at = self.clock.monotonic() + delay
        part.retry_from = first_unapplied
        self.transport.pause([part.tp])
        if first_unapplied is not None:
            self.transport.seek(part.tp, first_unapplied)

    def _resume_due(self) -> None:
        now = self.clock.monotonic()
        for part in self.parts.values():
            if part.retry_at is not None and now >= part.retry_at:
                part.retry_at = None
                if part.retry_from is not None:
                    self.transport.seek(part.tp, part.retry_from)
                self.transport.resume([part.tp])
                self._rewind_redelivery(part)

    def _rewind_redelivery(self, part: _Partition) -> None:
        if part.redelivery is not None and self.redelivery is not None:
            self.redelivery.assign(part.redelivery, part.progress.redelivered_next)

    def _batch_letter(
        self,
        tp: TP,
        batch_key: str,
        failed: list[tuple[Record, Event, BaseException]],
        attempts: int,
    ) -> DeadLetter:
        record, _, error = failed[-1]
        origin_tp = tp
        return DeadLetter(
            id=batch_letter_id(
                self.processor.slug,
                origin_tp.topic,
                origin_tp.partition,
                self._origin_offset(record),
                f"event-batch-{batch_key}",
            ),
            kind="event-batch",
            subscription=self.processor.slug,
            source_topic=origin_tp.topic,
            source_partition=origin_tp.partition,
            error=f"{type(error).__name__}: {error}",
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=attempts,
            created_at=format_time(self.clock.now()),
            entries=[
                Entry(
                    offset=self._origin_offset(r),
                    value=r.value,
                    key=r.key,
                    headers=list(r.headers),
                    event_id=e.event_id,
                    event_type=e.event_type,
                    project_id=e.project_id,
                )
                for r, e, _ in failed
            ],
        )

    def _poison_letter(self, tp: TP, record: Record, error: EnvelopeError) -> DeadLetter:
        return DeadLetter(
            id=batch_letter_id(
                self.processor.slug, tp.topic, tp.partition, self._origin_offset(record), "poison"
            ),
            kind="poison",
            subscription=self.processor.slug,
            source_topic=tp.topic,
            source_partition=tp.partition,
            error=str(error),
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=1,
            created_at=format_time(self.clock.now()),
            entries=[
                Entry(
                    offset=self._origin_offset(record),
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                )
            ],
        )

    # -- operator controls, ownership ------------------------------------------------------------
    def _check_controls(self) -> None:
        """Notice cursor moves made by operator controls while this process owns the partition."""
        now = self.clock.monotonic()
        if now - self._last_control_check < self.policy.control_check_interval_s:
            return
        self._last_control_check = now
        for part in list(self.parts.values()):
            stored = self.store.load(part.tp)
            if (stored.acked_through, stored.cursor_revision) != (
                part.progress.acked_through,
                part.progress.cursor_revision,
            ):
                if self.store.epoch(part.tp) != part.epoch:
                    self.stats.fenced += 1
                    self._drop(part)
                else:
                    self._reload(part)

    def _defer(self, part: _Partition) -> None:
        """Put a partition's fetched records back: read them again once it is ready."""
        self.transport.seek(part.tp, part.progress.acked_through + 1)
        self._rewind_redelivery(part)

    def _reload(self, part: _Partition) -> None:
        part.open_part = None
        part.progress = self.store.load(part.tp)
        part.states.clear()
        part.retry_at = None
        part.retry_from = None
        self.transport.resume([part.tp])
        self.transport.seek(part.tp, part.progress.acked_through + 1)
        self._rewind_redelivery(part)

    def _drop(self, part: _Partition) -> None:
        """We were fenced: another process owns this partition now. Stop touching it; the group
        will revoke it from us shortly."""
        self.parts.pop(part.tp, None)
        self.transport.pause([part.tp])

    # -- deliveries and redeliveries -------------------------------------------------------------
    def _delivery(self, part: _Partition, record: Record, high: int) -> Delivery:
        offset = self._origin_offset(record)
        return Delivery(
            tp=part.tp,
            offset=offset,
            phase=Phase.LIVE if record.offset >= part.live_from else Phase.CATCHING_UP,
            caught_up=record.offset + 1 >= high if high >= 0 else False,
            cursor_revision=part.progress.cursor_revision,
            redelivered=self._is_redelivery(record),
        )

    def _is_redelivery(self, record: Record) -> bool:
        return record.header("rh.origin_topic") is not None

    def _redelivered(self, records: list[Record]) -> list[Record]:
        return records

    def _origin_tp(self, record: Record) -> TP:
        topic = record.header("rh.origin_topic")
        if topic is None:
            return record.tp
        return TP(topic.decode(), int(record.header("rh.origin_partition") or b"0"))

    def _origin_offset(self, record: Record) -> int:
        raw = record.header("rh.origin_offset")
        return int(raw) if raw is not None else record.offset
