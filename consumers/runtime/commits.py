"""A poll's commits, the runner's side: sent to the store in one call, then landed — the answers
read, and what follows each commit that applied (its Kafka transaction, its group offset, its
failures) done.

For effects in Redis the two halves are apart: the commits go out, the next poll's records are
fetched and decoded while Redis applies them, and only then are the answers read
(:meth:`CommitMixin._land`), before anything of the next poll is processed. Nothing is decided
on a commit's outcome before it is known: until it lands its partition counts as not read
through (its records are handed over but not done), and records polled ahead of it are dropped
if landing (or anything after) moved their partition (a refusal reloads it, a failure seeks it
back). Other effects land at once: a Kafka transaction follows its commit, and a files
processor commits with its part."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consumers.runtime.failures import FailureMixin
from consumers.runtime.files import FilesMixin
from consumers.runtime.runner_base import Outcome, PartitionState
from consumers.runtime.transactions import TransactionMixin
from consumers.runtime.types import TP, EffectKind
from streams.errors import ClaimsFound, Fenced

log = logging.getLogger("rhumbatron.runtime")


@dataclass
class InFlight:
    """A poll's commits, sent and not yet answered, with the slices they came from (processed
    again, looked up, where a commit met claims it had not looked up)."""

    ready: list[Outcome]
    owners: list[PartitionState]  # each commit's partition as it stood when sent
    slices: list[Any]
    answers: Callable[[], list[Exception | None]]


class CommitMixin(FilesMixin, TransactionMixin, FailureMixin):
    def _again(self, slices: list[Any], met: set[TP]) -> None:
        """Process and commit again, looked up, the slices of the partitions in ``met``."""
        raise NotImplementedError

    def _send(self, outcomes: list[Outcome], slices: list[Any]) -> InFlight:
        """Write each outcome's poison to the dead-letter store, hand a files processor's to its
        part, and send the rest's commits in one store call (each atomic on its own)."""
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
                self.stats.poison_dead_lettered += len(outcome.letters)
            if self.processor.effect_kind == EffectKind.FILES:
                if outcome.failed:
                    part.open_part = None  # its lines are read again from the committed cursor
                    self._handle_failure(part, outcome)
                else:
                    self._fill_part(part, outcome)
                continue
            ready.append(outcome)
        owners = [self.parts[o.commit.tp] for o in ready]
        for owner in owners:
            self.failpoint("runtime.before_store_commit")
            owner.in_flight = True
        commits = [o.commit for o in ready]
        answers = self.store.send_commits(commits) if commits else list
        return InFlight(ready, owners, slices, answers)

    def _land(self, flight: InFlight) -> None:
        """Read the answers of a poll's commits and do what follows each that applied; the
        partitions whose commit met claims it had not looked up are processed again at once."""
        try:
            met = self._committed(flight)
        finally:
            self._close_traces()  # the failed applies' spans, once their failures are handled
        if met:
            self._again(flight.slices, met)

    def _committed(self, flight: InFlight) -> set[TP]:
        try:
            refusals = flight.answers()
        finally:
            for owner in flight.owners:
                owner.in_flight = False
        committed: list[Outcome] = []
        met: set[TP] = set()
        for outcome, owner, refusal in zip(flight.ready, flight.owners, refusals, strict=True):
            part = self.parts.get(outcome.commit.tp)
            if part is not owner:
                # Revoked while its commit was in flight (and maybe assigned again: that owner
                # read the store after the commit, or fenced it). Its outcome is no one's now,
                # but a refused late write is still told.
                if isinstance(refusal, Fenced):
                    self.stats.fenced += 1
                    log.warning("%s: %s", self.processor.slug, refusal)
                continue
            if isinstance(refusal, ClaimsFound):
                met.add(outcome.commit.tp)
                for name, n in outcome.counted.items():
                    setattr(self.stats, name, getattr(self.stats, name) - n)
                continue
            if refusal is not None:
                self._refused(part, refusal)
                continue
            part.progress = outcome.commit.progress
            self._keep_states(part, outcome.commit.states)
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
            elif outcome.first_unapplied is None and part.retry_from is not None:
                part.retry_from = None
        return met
