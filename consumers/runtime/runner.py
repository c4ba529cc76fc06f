"""The consume loop of one subscription process: poll a batch → decode → claim → apply → commit.

The store is asked twice per poll, whatever the number of partitions in it: one claim lookup
(``Store.decisions_many``) for every partition's decoded events, then one ``Store.commit_many``
carrying each partition's atomic commit (each fenced and compare-and-set on its own; a refused
one is handled for its partition alone).

Per partition of a batch, in offset order:

- a record that does not decode is a *poison* record: dead-lettered at once with its raw bytes and
  the reason, then treated as done;
- an event of a type the processor does not consume, or already claimed at the current cursor
  revision (a duplicate), or already applied / dead-lettered per the cursor, is done;
- a fresh event is folded (``reduce``) and processed (``process``); if either raises, it fails and
  every later event *of its project* in the batch is held back; other projects go on;
- the claims, Redis effects, fold changes, pending Kafka effects and the new cursor commit in one
  atomic step, fenced by the owner epoch and compare-and-set on the cursor;
- SQL effects run in that step, in one PostgreSQL transaction with the rest (``sql_store``): an
  event whose statements fail (a constraint, a bad value) refuses the commit, writing nothing,
  and the batch is processed again with that event failed as if ``process`` had raised; an
  outage of the database (SQLSTATE classes 08 and 40, a lost connection) commits nothing,
  counts no failure, and the partition's records are read again after a backoff;
- Kafka effects then go out in one transaction with the consumed offsets, whose metadata names
  the transaction (a per-partition sequence stored with the pending copy); the pending copy is
  cleared once it committed (a crash or an abort in between is recovered by whoever owns the
  partition next: if the committed marker names that transaction, the copy is dropped; if it
  names an earlier one, it is re-sent with the same ids; if the marker is gone, the output topics
  are searched for the copy's ids, and only what is missing is sent);
- a failure is counted under (subscription, topic, partition, first unapplied offset); below the
  limit the partition pauses, seeks back and retries after a backoff while others flow; at the
  limit the failing events are dead-lettered, marked done, and the partition moves on (or, under
  the ``block`` policy, it retries forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Concatenate, ParamSpec, TypeVar

from consumers.runtime.caught_up import CaughtUpMixin, caught_up_mark
from consumers.runtime.controls import Controls
from consumers.runtime.dead_letters import DeadLetterStore
from consumers.runtime.failures import FailureMixin
from consumers.runtime.files import FilesMixin
from consumers.runtime.metrics import RuntimeInstruments, runtime_instruments
from consumers.runtime.parking import Drain, ParkingMixin, ParkVerdict
from consumers.runtime.parts import Line
from consumers.runtime.runner_base import Outcome, PartitionState, RuntimePolicy, Stats
from consumers.runtime.slot_claims import SlotRef, slot_ref
from consumers.runtime.store import OPS, Commit, Decisions, EventStatements, Slots, Store
from consumers.runtime.tracing import BatchTraces
from consumers.runtime.transactions import TransactionMixin
from consumers.runtime.transport import Output, OutputLog, Redelivery, Transport
from consumers.runtime.types import (
    JSON,
    TP,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    Phase,
    Processor,
    Progress,
    Record,
    RedisOp,
)
from consumers.runtime.versions import upcast_for
from streams import failpoints
from streams.clock import Clock
from streams.envelopes import Event, decode_event, decode_with_wire
from streams.errors import (
    ClaimsFound,
    EnvelopeError,
    Fenced,
    ProcessorError,
    Rejected,
    SlotTaken,
    StatementsFailed,
)
from streams.log_context import log_fields

log = logging.getLogger("rhumbatron.runtime")

__all__ = ["Runner", "RuntimePolicy", "Stats"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _logged_with_partition(
    process: Callable[Concatenate[Runner, PartitionState, _P], _R],
) -> Callable[Concatenate[Runner, PartitionState, _P], _R]:
    """Every record logged while a partition's records are processed (by the runtime, or by the
    processor itself) names that partition's topic and partition."""

    def processing(
        self: Runner, part: PartitionState, /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        with log_fields(topic=part.tp.topic, partition=part.tp.partition):
            return process(self, part, *args, **kwargs)

    return processing


@dataclass
class _Slice:
    """One partition's records of a poll, decoded, before the store is asked about them."""

    part: PartitionState
    records: list[Record]
    progress: Progress  # the cursor they are judged against (an open part's, when one is open)
    # Per record, in order: its event, or None when it is done already or poison.
    events: list[Event | None] = field(default_factory=list)
    poison: list[tuple[Record, EnvelopeError]] = field(default_factory=list)
    candidates: list[tuple[Record, Event]] = field(default_factory=list)  # events consumed
    # By record index: the value, when it is its event's canonical encoding (keeps_wire only).
    wires: dict[int, bytes] = field(default_factory=dict)
    # By record index: what the processor's validate raised for the event (it is refused).
    rejected: dict[int, Exception] = field(default_factory=dict)
    # By record index: what upcasting the event raised (it fails as if its reduce had).
    upcast_failed: dict[int, Exception] = field(default_factory=dict)
    # Whether its claims are looked up before processing (else the commit checks them, and a
    # commit that meets one is refused and the slice processed again, looked up: ``again``).
    look: bool = True
    again: bool = False
    # By event id: the error its SQL statements met when the slice was committed before; it is
    # judged failed without running (StatementsFailed).
    failed_statements: dict[str, BaseException] = field(default_factory=dict)
    # Records re-read to apply parked projects' events (consumers.runtime.parking), or None.
    drain: Drain | None = None
    # By event id: where its events published from an outbox sit (claimed, or passed, by slot).
    slots: dict[str, SlotRef] = field(default_factory=dict)


_NO_DECISIONS = Decisions(set(), set(), set())


class Runner(FilesMixin, TransactionMixin, FailureMixin, CaughtUpMixin, ParkingMixin):
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
        output_log: OutputLog | None = None,
        redelivery: Redelivery | None = None,
        controls: Controls | None = None,
        failpoint: Callable[[str], None] = failpoints.hit,
        instruments: RuntimeInstruments | None = None,
    ) -> None:
        if processor.effect_kind == EffectKind.KAFKA and (output is None or output_log is None):
            raise ValueError(
                f"{processor.slug} has Kafka effects and needs an output producer and an output "
                "log (to read back what a transaction left when its marker is gone)"
            )
        self.processor = processor
        self.transport = transport
        self.store = store
        self.dead_letters = dead_letters
        self.policy = policy
        self.clock = clock
        self.output = output
        self.output_log = output_log
        self.redelivery = redelivery
        self.controls = controls
        self.failpoint = failpoint
        self.stats = Stats()
        self.instruments = instruments or runtime_instruments()
        self.instruments.watch(processor.slug, self.stats)
        self.instruments.watch_parked(processor.slug, self._parked_counts)
        self.parts: dict[TP, PartitionState] = {}
        self._last_control_check = 0.0
        self._behind = False  # the last poll brought a full batch: poll batch_size_behind
        self._caught_up_retry = {}  # when a failed eventless caught-up call is tried again

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
            part = PartitionState(
                tp, epoch, progress, live_from=self.transport.high_watermark(tp, cached=False)
            )
            part.needs_recovery = progress.pending_effects
            part.needs_refold = bool(
                self.processor.reducer_version
                and progress.has_cursor()
                and progress.reducer_version != self.processor.reducer_version
            )
            # Before reading, a partition without a cursor (a new subscription, or a Redis that
            # lost the partition's state) or with one behind its group's committed offset (a
            # Redis restored from an older copy) takes what Kafka keeps of it
            # (Controls.first_fold): its dead letters and skips, with Kafka effects the fold
            # through the group's offset, and a new fold's history from the archive.
            part.needs_first_fold = self.controls is not None or bool(
                self.processor.reducer_version
                and not progress.has_cursor()
                and self.transport.log_start(tp) > 0
            )
            part.redelivery = self.policy.redelivery_partition(tp)
            self.parts[tp] = part
            starts[tp] = self._start(tp, progress)
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

    def _start(self, tp: TP, progress: Progress) -> int | None:
        """Where a new owner reads ``tp`` from: after the stored cursor; without one, for effects
        in Redis, the log start. The group's committed offset is for lag tooling (and its
        metadata tells a store that went back: Controls.behind) and is committed after the store, so it can be ahead of what Redis holds: a Redis that lost its
        latest writes (append-only with fsync every second loses up to about two seconds when
        the machine fails or the disk stalls; a restore from an older copy) may have lost a
        partition's first cursor with its claims and effects, and reading from the committed
        offset would never apply those events. SQL effects the same: a database restored from a
        backup lost its cursor with its effects. Other effects keep the committed offset: Kafka
        effects commit it in their transaction, files record their parts against it."""
        if progress.has_cursor():
            return progress.acked_through + 1
        if self.processor.effect_kind in (EffectKind.REDIS, EffectKind.SQL):
            return self.transport.log_start(tp)
        return None

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
        # Every partition the group takes is said, one this process had dropped already (fenced
        # by a newer owner) too: the log is the history of what the group gave and took.
        for tp in tps:
            log.info("%s: revoked %s", self.processor.slug, tp)

    def run_once(self, timeout: float = 0.5) -> int:
        """One poll and everything it brings. Returns the number of records handled."""
        self._resume_due()
        self._check_controls()
        self._refold()
        self._recover_pending()
        self._drain_parked()
        self._flush_due()
        records = self.transport.poll(self._poll_size(), timeout)
        # Behind: the poll brought at least a normal batch, so more is waiting.
        self._behind = len(records) >= self.policy.batch_size
        if self.redelivery is not None:
            records += self._redelivered(self.redelivery.poll(self.policy.batch_size))
        # Partitions assigned inside this poll: refold and finish their pending effects before any
        # new record of theirs is processed (new pending effects must never replace old ones).
        self._refold()
        self._recover_pending()
        if not records:
            self._commit_read_through()
            self._caught_up_calls()
            return 0
        self.stats.batches += 1
        self.stats.records += len(records)
        try:
            self._handle(records)
        except BaseException:
            # Broken off (the store went away mid-batch, a crash): what the poll handed over is
            # not done. Put it back, so that nothing takes these partitions as read through it,
            # least of all the offsets committed on the way out (by ``close`` and the revoke
            # callback): past the cursor, the group would read lag 0 while those records wait.
            with suppress(Exception):  # the error that broke the batch is the one to raise
                for part in list(self.parts.values()):
                    self._defer(part)
            raise
        self._commit_read_through()
        self._caught_up_calls()
        return len(records)

    def _handle(self, records: list[Record]) -> None:
        """Apply and commit one poll's records."""
        read: dict[tuple[str, int], list[Record]] = {}  # by topic and partition, in order
        for record in records:
            key = (record.topic, record.partition)
            same = read.get(key)
            if same is None:
                read[key] = same = []
            same.append(record)
        by_tp: dict[TP, list[Record]] = {}
        for same in read.values():
            origin = self._origin_tp(same[0])  # one for every record of a topic partition
            part = self.parts.get(origin) if origin is not None else None
            if origin is None or part is None or part.retry_at is not None:
                continue  # not ours any more, or waiting for its retry: it will come again
            if part.needs_recovery or part.needs_refold or part.needs_first_fold:
                self._defer(part)
                continue
            by_tp.setdefault(origin, []).extend(same)
        slices = [self._decoded(self.parts[tp], recs) for tp, recs in by_tp.items()]
        for piece in slices:
            piece.look = self._must_look(piece)
        self._run_slices(slices)

    def _apply_drain(self, part: PartitionState, records: list[Record], drain: Drain) -> None:
        piece = self._decoded(part, records, drain)
        piece.look = True  # re-read events: their claims say what is applied already
        self._run_slices([piece])

    def _run_slices(self, slices: list[_Slice]) -> None:
        met = self._process_and_commit(slices)
        while met:
            # Their commits met claims (duplicates, or events of an earlier revision), or SQL
            # statements that failed, and wrote nothing: the same records again, looked up
            # first, as the batch of one partition with duplicates always was, and those
            # events failed. Each round knows more failed events, so the rounds end.
            again = []
            for piece in slices:
                failed = met.get(piece.part.tp)
                if failed is None or (
                    piece.look and failed.keys() <= piece.failed_statements.keys()
                ):
                    continue
                piece.look = piece.again = True
                piece.failed_statements.update(failed)
                again.append(piece)
            met = self._process_and_commit(again) if again else {}

    def _must_look(self, piece: _Slice) -> bool:
        """Whether a slice's claims are looked up before it is processed. The live path leaves
        them to its commit (one round trip a poll, not two), which refuses it if any of its
        events has a claim stored at all. Looked up first: a files processor's (its claims
        commit with a part, polls later), and records an earlier claim may not make duplicates
        (an operator's redelivery, the re-run range of a reprocess_from), which the commit's
        check would refuse every time; and records a first fold claimed (``look_through``),
        which that check would find only after trying them."""
        if self.processor.effect_kind == EffectKind.FILES or piece.rejected:
            return True  # an event refused is judged a copy or not before its letter is written
        through = max(piece.progress.rerun_through, piece.progress.look_through)
        return any(r.offset <= through or self._is_redelivery(r) for r, _ in piece.candidates)

    def _process_and_commit(self, slices: list[_Slice]) -> dict[TP, dict[str, BaseException]]:
        """Process every slice and commit them together; the partitions whose commit met claims
        it had not looked up, or SQL statements that failed (:meth:`_commit`)."""
        decisions = self._decisions([s for s in slices if s.look])
        try:
            outcomes = []
            for piece in slices:
                part = piece.part
                traces = self._traces(piece.records)
                try:
                    with self._batch_span(part.tp, traces, len(piece.records)):
                        outcome = self._process_partition(
                            part, piece, decisions.get(part.tp, _NO_DECISIONS), traces
                        )
                except Fenced as exc:
                    self.stats.fenced += 1
                    log.warning("%s: %s", self.processor.slug, exc)
                    self._drop(part)
                    continue
                outcomes.append(outcome)
            return self._commit(outcomes)
        finally:
            self._close_traces()  # the failed applies' spans, once their failures are handled

    def _poll_size(self) -> int:
        """How many records the next poll may bring: ``batch_size_behind`` while the last poll
        found a full normal batch waiting, else ``batch_size``."""
        return self.policy.behind_batch_size() if self._behind else self.policy.batch_size

    def _decisions(self, slices: list[_Slice]) -> dict[TP, Decisions]:
        """The claims of every partition's candidate events at their cursor revision, asked in
        one lookup for the whole poll."""
        asking = [s for s in slices if s.candidates]
        if not asking:
            return {}
        answers = self.store.decisions_many(
            [
                (s.part.tp, s.progress.cursor_revision, [e.event_id for _, e in s.candidates])
                for s in asking
            ],
            {e: ref for s in asking for e, ref in s.slots.items()},
        )
        return {s.part.tp: answer for s, answer in zip(asking, answers, strict=True)}

    def idle(self) -> bool:
        """Nothing paused for a retry, nothing pending, and every partition read to its end (a
        consumer that merely got nothing for a while, on a loaded broker, is not idle)."""
        if not all(p.retry_at is None and not p.needs_recovery for p in self.parts.values()):
            return False
        if any(tp in self.parts for tp in self._caught_up_retry):
            return False  # a caught-up call waits to be tried again
        if self._drain_waiting():
            return False  # a parked project's events wait to be applied
        return self.transport.caught_up(self.parts)

    def run(
        self,
        *,
        until_idle_s: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
    ) -> Stats:
        quiet_since = self.clock.monotonic()
        with log_fields(subscription=self.processor.slug):  # on every record the loop logs
            while not should_stop():
                tick()
                handled = self.run_once()
                now = self.clock.monotonic()
                if handled or not self.idle() or not self.parts:
                    quiet_since = now
                elif until_idle_s is not None and now - quiet_since >= until_idle_s:
                    break
        return self.stats

    def _decoded(
        self, part: PartitionState, records: list[Record], drain: Drain | None = None
    ) -> _Slice:
        """A partition's records of this poll decoded and sorted: done already per the cursor,
        poison (undecodable), or events, of which those the processor consumes are candidates."""
        consumes = self.processor.consumes
        keeps_wire = self.processor.keeps_wire
        validate = _validator(self.processor)
        max_bytes = self.policy.max_envelope_bytes
        # With an open part, what it holds is done already, though not yet committed.
        progress = part.open_part.progress if part.open_part else part.progress
        piece = _Slice(part, records, progress, drain=drain)
        redelivered_max = progress.redelivered_next
        for record in records:
            event: Event | None = None
            if self._is_redelivery(record):
                if record.offset < redelivered_max:
                    piece.events.append(None)
                    continue
                problem = self._redelivery_problem(record)
                if problem is not None:
                    piece.poison.append((record, problem))
                    piece.events.append(None)
                    continue
            elif drain is None and progress.is_done(record.offset):
                piece.events.append(None)
                continue
            try:
                if keeps_wire:
                    event, wire = decode_with_wire(Event, record.value, max_bytes=max_bytes)
                    if wire is not None:
                        piece.wires[len(piece.events)] = wire
                else:
                    event = decode_event(record.value, max_bytes=max_bytes)
            except EnvelopeError as exc:
                piece.poison.append((record, exc))
                piece.events.append(None)
                continue
            if (consumes is None or event.event_type in consumes) and not keeps_wire:
                # The version the processor's code knows (versions.py); a processor keeping
                # the wire sees the event as written, which is what its bytes say.
                try:
                    event = upcast_for(self.policy, event)
                except Exception as exc:
                    piece.upcast_failed[len(piece.events)] = exc
            piece.events.append(event)
            ref = slot_ref(record.headers, event)
            if ref is not None:
                piece.slots[event.event_id] = ref
            if consumes is None or event.event_type in consumes:
                piece.candidates.append((record, event))
                if validate is not None:
                    try:
                        validate(event)
                    except Exception as exc:
                        piece.rejected[len(piece.events) - 1] = exc
        return piece

    @_logged_with_partition
    def _process_partition(
        self,
        part: PartitionState,
        piece: _Slice,
        decisions: Decisions,
        traces: BatchTraces | None = None,
    ) -> Outcome:
        proc = self.processor
        consumes = proc.consumes
        records, progress, poison = piece.records, piece.progress, piece.poison
        fresh_candidates = piece.candidates
        applied, claimed, stale = self._claimed(
            part, progress, fresh_candidates, decisions, piece.slots
        )
        # A stream copy of another event than the one holding its slot: refused, dead-lettered
        # as a conflict. An operator's retry of that letter applies it, claimed by its id.
        conflicts = decisions.conflicts
        for i, event in enumerate(piece.events):
            if (
                event is not None
                and event.event_id in conflicts
                and i not in piece.rejected
                and not self._is_redelivery(records[i])
            ):
                ref = piece.slots[event.event_id]
                piece.rejected[i] = SlotTaken(event.event_id, ref.project, ref.outbox, ref.slot)
        if proc.reducer_version:
            missing = {e.project_id for _, e in fresh_candidates if e.project_id not in part.states}
            if missing:
                part.states.update(self.store.states(part.tp, missing))

        if piece.again:  # its poison went to the dead-letter store the first time
            poison = []
        letters = [self._poison_letter(part.tp, r, exc) for r, exc in poison]
        self.stats.poison += len(poison)
        counted = {"filtered": 0, "duplicates": 0, "redelivered": 0, "parked": 0}
        parking = self._batch_parking(progress, piece.drain)
        if traces is not None:
            for r, problem in poison:
                offset = self._origin_offset(r)
                traces.skipped(proc.slug, r, None, "dead-lettered", offset=offset, error=problem)
        # Per record, in the order of ``records``: handled (applied, skipped, dead-lettered).
        done = [False] * len(records)
        held: set[str] = set()
        failed: list[tuple[Record, Event, BaseException]] = []
        claims: list[str] = []
        passed: list[str] = []  # outbox events it does not consume: their slots are handled
        unclaimed: list[str] = []  # fresh but not applied: failed, or held behind a failure
        seen_ids: set[str] = set(part.open_part.claims) if part.open_part else set()
        lines: list[Line] = []
        applied_ms: list[int] = []
        ops: list[RedisOp] = []
        out: list[OutRecord] = []
        statements: list[EventStatements] = []
        changed: dict[str, JSON | None] = {}  # the fold after this batch; cached once committed
        readmitted: list[int] = []  # dead-lettered offsets applied now through a redelivery
        rejected_ids: list[str] = []  # refused by validate: dead-lettered at once
        rejected_offsets: list[int] = []
        rejections = 0  # letters written for them (not again when the slice is redone)
        caught_up_seen = False  # an applied event was delivered caught up
        owner_check = self._owner_check(part)
        deliveries = self._deliveries(part, owner_check)
        for i, record in enumerate(records):
            event = piece.events[i]
            if event is None:  # done per the cursor, or poison
                done[i] = True
                continue
            if consumes is not None and event.event_type not in consumes:
                done[i] = True
                counted["filtered"] += 1
                if event.event_id in piece.slots:
                    passed.append(event.event_id)
                continue
            # A redelivery (an operator's retry of a dead letter) is a duplicate only if the
            # event was applied since; a stream copy also if it was dead-lettered.
            redelivered = self._is_redelivery(record)
            known = applied if redelivered else claimed
            if (
                event.event_id in known
                or event.event_id in seen_ids
                or (not redelivered and record.offset in stale)
            ):
                done[i] = True
                counted["duplicates"] += 1
                if traces is not None:
                    offset = self._origin_offset(record)
                    traces.skipped(proc.slug, record, event, "duplicate", offset=offset)
                continue
            if event.project_id in held:
                unclaimed.append(event.event_id)
                continue
            verdict = parking.judge(record.offset, event, redelivered)
            if verdict is ParkVerdict.PARKED:
                done[i] = True  # its project waits for a consumer that knows its version
                counted["parked"] += 1
                continue
            if verdict is ParkVerdict.STOP:
                unclaimed.append(event.event_id)
                continue
            delivery = deliveries(record, redelivered, piece.wires.get(i))
            if traces is not None:  # current while the processor runs
                traces.start(proc.slug, record, event, offset=delivery.offset)
            try:
                state = (
                    changed[event.project_id]
                    if event.project_id in changed
                    else part.states.get(event.project_id)
                )
                unreadable = piece.upcast_failed.get(i)
                if unreadable is not None:
                    raise ProcessorError("upcast", unreadable)
                if verdict is ParkVerdict.NEWER:
                    raise ProcessorError("version", parking.newer(event))
                refusal = piece.rejected.get(i)
                if refusal is not None:
                    raise Rejected(refusal)
                statements_error = piece.failed_statements.get(event.event_id)
                if statements_error is not None:  # when this slice was committed before
                    raise ProcessorError("statements", statements_error)
                try:
                    new_state = proc.reduce(state, event) if proc.reducer_version else None
                except Exception as exc:
                    raise ProcessorError("reduce", exc) from exc
                try:
                    effects = proc.process(event, new_state, delivery)
                    wrong = _wrong_effects(effects, proc.effect_kind)
                    if wrong is not None:
                        raise TypeError(wrong)
                except Fenced:
                    raise  # not the event's failure: this process lost the partition
                except Exception as exc:
                    raise ProcessorError("process", exc) from exc
            except Rejected as exc:
                # Bad input, by the processor's own word: dead-lettered at once, done; its
                # project goes on (a retry of the letter runs validate again).
                done[i] = True
                seen_ids.add(event.event_id)  # a later copy in this batch is its duplicate
                if not redelivered:
                    rejected_ids.append(event.event_id)
                    rejected_offsets.append(record.offset)
                    unclaimed.append(event.event_id)  # a copy of an applied one: refused
                if not piece.again:  # its letter went to the dead-letter store the first time
                    letters.append(self._rejected_letter(part.tp, record, event, exc.cause))
                    rejections += 1
                if traces is not None:
                    offset = self._origin_offset(record)
                    traces.skipped(
                        proc.slug, record, event, "dead-lettered", offset=offset, error=exc.cause
                    )
                continue
            except ProcessorError as exc:
                if traces is not None:
                    traces.fail(record, exc.cause)
                failed.append((record, event, exc.cause))
                unclaimed.append(event.event_id)
                held.add(event.project_id)
                log.warning(
                    "%s: %s at %s@%d failed: %s",
                    proc.slug,
                    event.event_id,
                    part.tp,
                    record.offset,
                    exc,
                    extra={"offset": record.offset},
                )
                continue
            done[i] = True
            seen_ids.add(event.event_id)
            claims.append(event.event_id)
            caught_up_seen = caught_up_seen or delivery.caught_up
            if effects.redis:
                ops.extend(effects.redis)
            if effects.records:
                out.extend(self._traced_effects(traces, effects.records))
            if effects.sql:
                statements.append(EventStatements(event.event_id, event.project_id, effects.sql))
            if traces is not None:
                traces.applied()
            ts = int(event.timestamp.timestamp() * 1000)
            if effects.lines:
                lines.extend(Line(record.offset, ts, data) for data in effects.lines)
            applied_ms.append(ts)
            if proc.reducer_version:
                changed[event.project_id] = new_state
            if redelivered:
                counted["redelivered"] += 1
                readmitted.append(delivery.offset)
        counted["applied"] = len(claims)
        for name, n in counted.items():
            setattr(self.stats, name, getattr(self.stats, name) + n)
        if out:
            out = proc.finish_batch(out, ops, owner_check)

        # The new cursor: contiguous over done stream records; done ones past a hold-back are
        # remembered in applied_beyond. Redelivered records advance only the redelivery cursor.
        new = Progress.from_fields(progress.as_fields())
        new.reducer_version = proc.reducer_version
        acked = progress.acked_through
        beyond = set(progress.applied_beyond)
        first_unapplied: int | None = None
        for i, record in enumerate(records):
            if self._is_redelivery(record):
                if done[i] and record.offset == new.redelivered_next:
                    new.redelivered_next = record.offset + 1
                continue
            if done[i]:
                if first_unapplied is None:
                    acked = max(acked, record.offset)
                else:
                    beyond.add(record.offset)
            elif first_unapplied is None:
                first_unapplied = record.offset
        if piece.drain is not None:  # re-read records: the cursor is where it was
            acked, beyond = progress.acked_through, set(progress.applied_beyond)
        new.acked_through = acked
        new.applied_beyond = sorted(o for o in beyond if o > acked)
        new.parked = parking.finish(failed, new)
        new.dead = sorted(o for o in progress.dead if o > acked)
        if readmitted:
            # A retried dead letter applied now is in the fold, so a rebuild must fold it too:
            # its offset leaves the skipped ranges (a skip_through after a reprocess_from can
            # have passed it) as it leaves the excluded set.
            new.skipped = _ranges_less(new.skipped, set(readmitted))
        if acked >= new.rerun_through:
            new.rerun_duplicates = []
        new.reduced_through = acked if proc.reducer_version else new.reduced_through
        if caught_up_seen and first_unapplied is None:
            new.caught_up = caught_up_mark(new)  # no eventless call follows a caught-up event
        self._next_transaction(new, progress, pending=bool(out))
        commit = Commit(
            tp=part.tp,
            epoch=part.epoch,
            expected_acked=progress.acked_through,
            expected_revision=progress.cursor_revision,
            progress=new,
            claims=claims,
            redis=ops,
            sql=statements,
            states=changed,
            pending=out if out else None,
            cleared_failures=_passed_batches(progress, new) + parking.passed_batches(),
            excluded_add=rejected_offsets,
            excluded_remove=readmitted,
            dead_claims=rejected_ids,
            passed=passed,
            slots={e: ref for e, ref in piece.slots.items() if e not in conflicts},
            looked=piece.look,
            unclaimed=[] if piece.look else unclaimed,
        )
        return Outcome(
            commit,
            failed,
            first_unapplied,
            letters,
            lines,
            applied_ms,
            counted,
            rejections,
            stopped_at=parking.stopped_at,
            stopped_by=parking.stopped_by,
            drained=piece.drain is not None,
        )

    def _commit(self, outcomes: list[Outcome]) -> dict[TP, dict[str, BaseException]]:
        """Commit the outcomes (each partition's atomic on its own) and what follows each that
        applied: its Kafka effects, its group offset, its failures. The partitions whose commit
        met claims it had not looked up, or SQL statements that failed (by event id, their
        errors), writing nothing: their counts are taken back, and the caller processes them
        again."""
        ready: list[Outcome] = []
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
                self.stats.poison_dead_lettered += len(outcome.letters) - outcome.rejected
            if self.processor.effect_kind == EffectKind.FILES:
                if outcome.failed:
                    part.open_part = None  # its lines are read again from the committed cursor
                    self._handle_failure(part, outcome)
                else:
                    self._fill_part(part, outcome)
                continue
            ready.append(outcome)
        # Every partition's commit in one store call, each atomic on its own.
        refusals = self._store_commit_many([(self.parts[o.commit.tp], o.commit) for o in ready])
        committed: list[Outcome] = []
        met: dict[TP, dict[str, BaseException]] = {}
        for outcome, refusal in zip(ready, refusals, strict=True):
            if isinstance(refusal, (ClaimsFound, StatementsFailed)):
                failed = refusal.failures if isinstance(refusal, StatementsFailed) else {}
                met[outcome.commit.tp] = failed
                for name, n in outcome.counted.items():
                    setattr(self.stats, name, getattr(self.stats, name) - n)
                continue
            part = self.parts.get(outcome.commit.tp)
            if refusal is not None or part is None:
                continue
            part.progress = outcome.commit.progress
            part.outages = 0
            self._keep_states(part, outcome.commit)
            committed.append(outcome)
            self.failpoint("runtime.after_store_commit")
        if self.processor.effect_kind == EffectKind.KAFKA and committed:
            # Every batch commits its offsets in a transaction, with its records if it has any.
            self._publish(committed)
        if committed:
            now = self.clock.now().timestamp()
            for outcome in committed:
                self.instruments.committed(self.processor.slug, outcome.applied_ms, now)
        self._commit_group_offsets(
            [self.parts[o.commit.tp] for o in committed if o.commit.tp in self.parts],
            clean={o.commit.tp for o in committed if not o.failed},
        )
        self.failpoint("runtime.after_offsets_commit")
        for outcome in committed:
            part = self.parts.get(outcome.commit.tp)
            if part is None:
                continue
            if outcome.failed:
                self._handle_failure(part, outcome)
            elif outcome.stopped_at is not None:
                self._parking_stopped(part, outcome)
            elif outcome.first_unapplied is None and part.retry_from is not None:
                part.retry_from = None
            if outcome.stopped_at is None and not outcome.drained:
                part.parking_stops = 0
        return met

    def _check_controls(self) -> None:
        """Notice cursor moves and rebuilt folds made by operator controls while this process owns
        the partition (a commit from stale folds would be refused anyway: compare-and-set)."""
        now = self.clock.monotonic()
        if now - self._last_control_check < self.policy.control_check_interval_s:
            return
        self._last_control_check = now
        for part in list(self.parts.values()):
            stored = self.store.load(part.tp)
            if (stored.acked_through, stored.cursor_revision, stored.fold_generation) != (
                part.progress.acked_through,
                part.progress.cursor_revision,
                part.progress.fold_generation,
            ):
                if self.store.epoch(part.tp) != part.epoch:
                    self.stats.fenced += 1
                    self._drop(part)
                else:
                    self._reload(part)

    def _claimed(
        self,
        part: PartitionState,
        progress: Progress,
        candidates: list[tuple[Record, Event]],
        decisions: Decisions,
        slots: Slots,
    ) -> tuple[set[str], set[str], set[int]]:
        """(applied, duplicates, stale copies). ``applied``: the candidates' events applied at
        this revision. ``duplicates``: events a stream copy of would duplicate — applied or
        dead-lettered at this revision, or (after a ``reprocess_from``) events before its
        offset whose copies sit in the re-run range, which ``reprocess_from`` listed. ``stale
        copies``: offsets past the re-run range whose event was applied or dead-lettered at an
        earlier revision (its first copy came earlier). Together: the events a fold by id
        takes once. ``decisions``: (applied, dead-lettered) among the candidates at this
        revision, as the store answered for the whole poll."""
        revision = progress.cursor_revision
        ids = [e.event_id for _, e in candidates]
        applied, dead_lettered, _ = decisions
        claimed = applied | dead_lettered
        stale: set[int] = set()
        if revision == 0:
            return applied, claimed, stale
        claimed |= set(ids) & set(progress.rerun_duplicates)
        # An event with a copy still to judge in the re-run range is judged there, at this
        # revision: a later copy of it is not stale even if an earlier revision claimed it (a
        # skip's dead claim, re-admitted by the reprocess). A batch starts at the first offset
        # not yet handled, so that copy is in this batch whenever a later one is.
        rerun = {
            e.event_id
            for r, e in candidates
            if e.event_id not in claimed
            and not self._is_redelivery(r)
            and r.offset <= progress.rerun_through
        }
        later = {
            r.offset: e.event_id
            for r, e in candidates
            if e.event_id not in claimed
            and e.event_id not in rerun
            and not self._is_redelivery(r)
            and r.offset > progress.rerun_through
        }
        for earlier in range(revision - 1, -1, -1):
            for dead in (False, True):
                if not later:
                    return applied, claimed, stale
                found = self.store.claimed(
                    part.tp, earlier, sorted(set(later.values())), dead=dead, slots=slots
                )
                stale.update(o for o, e in later.items() if e in found)
                later = {o: e for o, e in later.items() if e not in found}
        return applied, claimed, stale

    def _owner_check(self, part: PartitionState) -> Callable[[], None]:
        """One partition batch's ownership check: the first call asks the store; later ones
        within ``control_check_interval_s`` trust that answer (a Redis read per side effect
        cost the router a quarter of its rate), and a process frozen past its session finds
        the interval long over when it wakes, so it asks again."""
        checked_at: list[float] = []

        def check() -> None:
            now = self.clock.monotonic()
            if checked_at and now - checked_at[0] < self.policy.control_check_interval_s:
                return
            current = self.store.epoch(part.tp)
            if current != part.epoch:
                raise Fenced(part.tp, part.epoch, current)
            checked_at[:] = [now]

        return check

    def _deliveries(
        self, part: PartitionState, owner_check: Callable[[], None]
    ) -> Callable[[Record, bool, bytes | None], Delivery]:
        """What ``process`` learns of each record of one partition batch (the partition's end
        and revision read once for the batch, and the batch's ownership check)."""
        high = self.transport.high_watermark(part.tp)
        tp, live_from, revision = part.tp, part.live_from, part.progress.cursor_revision

        def delivery(record: Record, redelivered: bool, wire: bytes | None) -> Delivery:
            return Delivery(
                tp=tp,
                offset=self._origin_offset(record) if redelivered else record.offset,
                phase=Phase.LIVE if record.offset >= live_from else Phase.CATCHING_UP,
                caught_up=0 <= high <= record.offset + 1,
                cursor_revision=revision,
                redelivered=redelivered,
                wire=wire,
                check_owner=owner_check,
            )

        return delivery


# What each effect kind may return beside its own: Redis ops ride with every kind whose store is
# Redis (committed with the claims and the cursor); a SQL processor's store is its database.
_KIND_FIELDS = {
    EffectKind.REDIS: ("redis",),
    EffectKind.KAFKA: ("records", "redis"),
    EffectKind.FILES: ("lines", "redis"),
    EffectKind.SQL: ("sql",),
    EffectKind.NONE: ("redis",),
}


def _wrong_effects(effects: object, kind: EffectKind) -> str | None:
    """Why what ``process`` returned cannot be applied, or None: not an ``Effects``, effects a
    processor of its kind cannot have, or a Redis op the stores do not have. Such an event
    fails like one whose ``process`` raised (retried, then dead-lettered with this reason)."""
    if not isinstance(effects, Effects):
        return f"process must return Effects, got {type(effects).__name__}"
    allowed = _KIND_FIELDS[kind]
    for name in ("redis", "records", "lines", "sql"):
        if name not in allowed and getattr(effects, name):
            return f"a processor of effect kind {kind.value!r} returned {name} effects"
    for op in effects.redis:
        if not isinstance(op, RedisOp) or op.op not in OPS:
            return f"not a Redis op of {', '.join(sorted(OPS))}: {op!r}"
    return None


def _validator(processor: Processor) -> Callable[[Event], None] | None:
    """The processor's ``validate``, or None when it keeps the default (which accepts all)."""
    validate = getattr(type(processor), "validate", None)
    if validate is None or validate is BaseProcessor.validate:
        return None
    return processor.validate


def _passed_batches(old: Progress, new: Progress) -> list[str]:
    """Batch keys (the failure counters' names) a commit moves past: once the event that
    failed there is done, its count must not carry over to a later failure at the same offset
    (after a reprocess_from, say)."""
    keys = []
    if new.acked_through > old.acked_through:
        keys.append(str(old.acked_through + 1))
    if new.redelivered_next > old.redelivered_next:
        keys.append(f"redelivery-{old.redelivered_next}")
    return keys


def _ranges_less(ranges: list[list[int]], offsets: set[int]) -> list[list[int]]:
    """[first, last] ranges (a cursor's skipped ones) without ``offsets``."""
    out: list[list[int]] = []
    for first, last in ranges:
        start = first
        for offset in sorted(o for o in offsets if first <= o <= last):
            if offset > start:
                out.append([start, offset - 1])
            start = offset + 1
        if start <= last:
            out.append([start, last])
    return out
