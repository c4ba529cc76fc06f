"""Failure: counting a batch's failures, retrying it after a backoff, dead-lettering it at the limit."""

from __future__ import annotations

import logging

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, batch_letter_id
from consumers.runtime.runner_base import DueLetter, Outcome, PartitionState
from consumers.runtime.slot_claims import slot_ref
from consumers.runtime.store import Commit
from consumers.runtime.tracing import TracingMixin
from consumers.runtime.types import (
    TP,
    EffectKind,
    Progress,
    Record,
)
from streams.envelopes import Event, format_time
from streams.errors import EnvelopeError, Fenced

log = logging.getLogger("rhumbatron.runtime")


class FailureMixin(TracingMixin):
    def _handle_failure(self, part: PartitionState, outcome: Outcome) -> None:
        # Only the owner counts and dead-letters: a files batch reaches here without a store
        # commit, so nothing has checked the epoch yet (and a fenced owner must not act).
        current = self.store.epoch(part.tp)
        if current != part.epoch:
            self.stats.fenced += 1
            log.warning("%s: %s", self.processor.slug, Fenced(part.tp, part.epoch, current))
            self._drop(part)
            return
        self.stats.failures += 1
        if outcome.first_unapplied is not None:
            batch_key = str(outcome.first_unapplied)
        else:  # only redelivered records failed
            batch_key = f"redelivery-{min(r.offset for r, _, _ in outcome.failed)}"
        attempts = self.store.count_failure(part.tp, batch_key)
        # Where to read again: the first unapplied offset; for files, the committed cursor (the
        # open part's lines were discarded with it).
        # A drain's failure is read again by the drain, from the park (consumers.runtime.parking).
        resume_at = None if outcome.drained else outcome.first_unapplied
        if self.processor.effect_kind == EffectKind.FILES and resume_at is not None:
            resume_at = part.progress.acked_through + 1
        if self.policy.on_failure == "block" or attempts < self.policy.max_batch_failures:
            self._schedule_retry(part, resume_at, attempts)
            return
        letter = self._batch_letter(part.tp, batch_key, outcome.failed, attempts)
        self._dead_letter(part, DueLetter(letter, batch_key, outcome.failed, resume_at))

    def _dead_letter(self, part: PartitionState, due: DueLetter) -> bool:
        """Write a batch's letter and pass its events. If the write fails, the letter stays due
        on the partition, which stays paused: the next try writes the same letter and runs
        nothing again, so the events are tried exactly ``max_batch_failures`` times and the
        letter says so (running the batch again would count more attempts than the letter's
        decision was made on, and more with every failed write). False: the write failed."""
        letter, failed, resume_at = due.letter, due.failed, due.resume_at
        try:
            self.dead_letters.write([letter])
        except Exception as exc:
            log.error(
                "%s: dead-letter write failed; writing %s again later: %s",
                self.processor.slug,
                letter.id,
                exc,
            )
            part.due_letter = due
            self._schedule_retry(part, resume_at, letter.attempts)
            return False
        part.due_letter = None
        self.stats.dead_lettered += 1
        self._traces_dead_lettered([r for r, _, _ in failed], letter.id)
        new = Progress.from_fields(part.progress.as_fields())
        redelivered = [r for r, _, _ in failed if self._is_redelivery(r)]
        stream_failed = [r.offset for r, _, _ in failed if not self._is_redelivery(r)]
        new.dead = sorted(set(new.dead) | set(stream_failed))
        for r in sorted(redelivered, key=lambda r: r.offset):
            if r.offset == new.redelivered_next:
                new.redelivered_next = r.offset + 1
        # Dead offsets at the head of the line let the cursor pass them right away.
        acked = new.acked_through
        while acked + 1 in new.dead or acked + 1 in new.applied_beyond:
            acked += 1
        if self.processor.reducer_version and new.reduced_through == new.acked_through:
            new.reduced_through = acked  # the fold, current, stays so: dead offsets are left out
        new.acked_through = acked
        new.dead = [o for o in new.dead if o > acked]
        new.applied_beyond = [o for o in new.applied_beyond if o > acked]
        commit = Commit(
            part.tp,
            part.epoch,
            part.progress.acked_through,
            part.progress.cursor_revision,
            new,
            excluded_add=sorted({self._origin_offset(r) for r, _, _ in failed}),
            dead_claims=sorted({e.event_id for r, e, _ in failed if not self._is_redelivery(r)}),
            slots={
                e.event_id: ref for r, e, _ in failed if (ref := slot_ref(r.headers, e)) is not None
            },
        )
        if not self._commit_or_refuse(part, commit):
            if part.retry_at is not None and part.tp in self.parts:
                # The SQL store's outage: the letter stays due, and is written again (the same
                # letter) with its commit after the backoff.
                part.due_letter = due
                return False
            return True
        part.progress = new
        self.store.clear_failures(part.tp, due.batch_key)
        if resume_at is not None:
            self.transport.seek(part.tp, resume_at)
        # Redelivered records held back behind the failing events are read again too.
        self._rewind_redelivery(part)
        log.error(
            "%s: dead-lettered %s after %d attempts: %s",
            self.processor.slug,
            letter.id,
            letter.attempts,
            letter.error,
        )
        return True

    def _resume_due(self) -> None:
        now = self.clock.monotonic()
        for part in list(self.parts.values()):
            if part.retry_at is not None and now >= part.retry_at:
                part.retry_at = None
                if part.due_letter is not None:
                    # Only the letter is tried again; the partition resumes once it is written.
                    if not self._dead_letter(part, part.due_letter) or part.tp not in self.parts:
                        continue
                    part.retry_from = None
                if part.retry_from is not None:
                    self.transport.seek(part.tp, part.retry_from)
                self.transport.resume([part.tp])
                self._rewind_redelivery(part)

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
            kind=LetterKind.EVENT_BATCH,
            subscription=self.processor.slug,
            source_topic=origin_tp.topic,
            source_partition=origin_tp.partition,
            error=f"{type(error).__name__}: {error}",
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=attempts,
            created_at=format_time(self.clock.now()),
            entries=[Entry.of(r, e, offset=self._origin_offset(r)) for r, e, _ in failed],
        )

    def _rejected_letter(
        self, tp: TP, record: Record, event: Event, error: BaseException
    ) -> DeadLetter:
        """The letter of an event the processor's ``validate`` refused: one attempt, its reason
        the exception's text. A redelivered copy refused again gets a letter of its own."""
        offset = self._origin_offset(record)
        again = f"-r{record.offset}" if self._is_redelivery(record) else ""
        return DeadLetter(
            id=batch_letter_id(
                self.processor.slug, tp.topic, tp.partition, offset, f"rejected{again}"
            ),
            kind=LetterKind.EVENT_BATCH,
            subscription=self.processor.slug,
            source_topic=tp.topic,
            source_partition=tp.partition,
            error=f"validate: {type(error).__name__}: {error}",
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=1,
            created_at=format_time(self.clock.now()),
            entries=[Entry.of(record, event, offset=offset)],
        )

    def _poison_letter(self, tp: TP, record: Record, error: EnvelopeError) -> DeadLetter:
        return DeadLetter(
            id=batch_letter_id(
                self.processor.slug, tp.topic, tp.partition, self._origin_offset(record), "poison"
            ),
            kind=LetterKind.POISON,
            subscription=self.processor.slug,
            source_topic=tp.topic,
            source_partition=tp.partition,
            error=str(error),
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            attempts=1,
            created_at=format_time(self.clock.now()),
            entries=[Entry.of(record, offset=self._origin_offset(record))],
        )
