"""Kafka effects in transactions, recovery of pending effects, and refolds."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from consumers.runtime.parts import is_part
from consumers.runtime.runner_base import Outcome, PartitionState, RunnerBase
from consumers.runtime.transport import Committed
from consumers.runtime.types import (
    TP,
    EffectKind,
    OutRecord,
    parse_txn_marker,
)
from streams.errors import CommittedUnknown, TransactionFailed, Unreachable

log = logging.getLogger("rhumbatron.runtime")


class TransactionMixin(RunnerBase):
    def _publish(self, outcomes: list[Outcome]) -> None:
        """Kafka effects of committed partitions, in one transaction with their offsets."""
        assert self.output is not None
        # A partition whose batch took everything it was handed commits past the markers it
        # read through; one with a failure in its batch, the next offset after its cursor.
        offsets = {
            o.commit.tp: (
                self._group_offset(self.parts[o.commit.tp], o.commit.progress)
                if not o.failed and o.commit.tp in self.parts
                else o.commit.progress.acked_through + 1
            )
            for o in outcomes
        }
        marks = {o.commit.tp: o.commit.progress.txn_marker() for o in outcomes}
        records = [r for o in outcomes for r in (o.commit.pending or [])]
        try:
            self._transact(records, offsets, marks)
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
                part.group_offset = offsets[o.commit.tp]
                self._clear_pending(part)

    def _commit_read_through(self) -> None:
        """Between batches: tell the group where partitions stand that were read on since this
        owner last committed them: past the markers behind their cursor (a batch that filled
        up stops before the marker after its last record; the next poll reads it and finds the
        end), or at a cursor an operator moved, or, once after an assignment, wherever they
        are. Kafka effects' offsets go in a transaction of their own, with the marker of the
        partition's latest transaction (none is pending: it names one that landed)."""
        ends: dict[TP, int] = {}
        for part in self.parts.values():
            if not self._settled(part):
                continue
            through = self._read_through(part, part.progress)
            if through is not None and through != part.group_offset:
                ends[part.tp] = through
        if not ends:
            return
        if self.processor.effect_kind != EffectKind.KAFKA:
            marks = {tp: self.parts[tp].progress.cursor_marker() for tp in ends}
            self.transport.commit_offsets(ends, marks)
        elif self.output is not None:
            marks = {tp: self.parts[tp].progress.txn_marker() for tp in ends}
            try:
                self._transact([], ends, marks, step="read_through")
            except TransactionFailed as exc:
                # Only lag figures wait for it: the next loop tries again.
                log.info("%s: offsets past the markers not committed: %s", self.processor.slug, exc)
                return
        for tp, offset in ends.items():
            self.parts[tp].group_offset = offset

    def _transact(
        self,
        records: list[OutRecord],
        offsets: Mapping[TP, int],
        marks: Mapping[TP, str],
        *,
        step: str = "transaction",
    ) -> None:
        """One Kafka transaction. ``step`` names its fail-points: ``transaction`` for a batch's
        (or a recovery's) effects, ``read_through`` for offsets alone. They are told apart so that
        a crash test armed at the N-th effects transaction dies with effects pending, whatever
        number of offsets-only commits the timing of the polls put before it."""
        assert self.output is not None
        self.output.begin()
        try:
            for record in records:
                self.output.produce(record)
            self.output.send_offsets(offsets, self.transport.group_metadata(), marks)
            self.failpoint(f"runtime.before_{step}_commit")
            self.output.commit()
        except TransactionFailed:
            self.output.abort()
            raise
        except Exception as exc:
            self.output.abort()
            raise TransactionFailed("output", str(exc), abortable=True) from exc
        self.stats.transactions += 1
        self.failpoint(f"runtime.after_{step}_commit")

    def _unlanded(
        self, part: PartitionState, records: list[OutRecord], committed: Committed | None
    ) -> list[OutRecord]:
        """Which of a pending copy's records its transaction did not land. The committed
        offset's marker says it when it names this partition's transactions: the pending one
        (landed) or an earlier one (not landed) — never an offset comparison, since a batch
        held back by a failing head event commits the same offset as the batch before it.
        Without a marker of ours (offsets rewritten from outside), the output topics say it."""
        seq = parse_txn_marker(committed.metadata) if committed is not None else None
        if seq == part.progress.txn_seq:
            return []
        if seq is not None and seq < part.progress.txn_seq:
            return records
        assert self.output_log is not None
        log.warning(
            "%s: %s's committed offset carries no marker of ours (%r); looking for the pending "
            "records on their topics",
            self.processor.slug,
            part.tp,
            committed.metadata if committed is not None else None,
        )
        found = self.output_log.find(
            records, part.progress.pending_since_ms - self.policy.output_search_margin_ms
        )
        return [r for r in records if r.record_id not in found]

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
            part.forget_states()
        first = [p for p in self.parts.values() if p.needs_first_fold]
        if not first:
            return
        if self.controls is None:
            raise RuntimeError(
                f"{self.processor.slug}: {first[0].tp} starts past its history and there are "
                "no controls to fold it from the archive"
            )
        committed = self._committed([p.tp for p in first], "whether Redis is behind the group")
        if committed is None:
            return
        controls = self.controls
        due = {
            p.tp
            for p in first
            if not p.progress.has_cursor() or controls.behind(p.progress, committed.get(p.tp))
        }
        restored = any(p.progress.has_cursor() for p in first if p.tp in due)
        letters = controls.letters_by_partition(restored=restored) if due else {}
        for part in first:
            part.needs_first_fold = False
            if part.tp not in due:
                continue
            if part.progress.has_cursor():
                log.warning(
                    "%s: %s's store is behind its group's committed offset (%s; the store holds "
                    "through %d): a Redis restored from an older copy, or one that lost writes",
                    self.processor.slug,
                    part.tp,
                    committed.get(part.tp),
                    part.progress.acked_through,
                )
            read = part.progress.acked_through
            controls.first_fold(
                part.tp,
                epoch=part.epoch,
                committed=committed.get(part.tp),
                letters=letters.get(part.tp, []),
            )
            part.progress = self.store.load(part.tp)
            part.needs_recovery = part.progress.pending_effects
            part.forget_states()
            if part.progress.acked_through != read:  # else it reads on from where it was
                self.transport.seek(part.tp, part.progress.acked_through + 1)

    def _committed(self, tps: list[TP], what: str) -> Mapping[TP, Committed | None] | None:
        """The group's committed offsets of ``tps``; None (logged, asked again at the next
        loop) while the broker cannot say, so ``what`` cannot be told yet."""
        try:
            return self.transport.committed(tps)
        except CommittedUnknown as exc:
            log.info("%s: cannot tell yet %s (%s); will ask again", self.processor.slug, what, exc)
            return None

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
        committed = self._committed([p.tp for p in todo], "whether pending effects landed")
        if committed is None:
            return
        for part in todo:
            records = self.store.pending(part.tp)
            if records:
                try:
                    missing = self._unlanded(part, records, committed.get(part.tp))
                    if missing:
                        self._transact(
                            missing,
                            {part.tp: part.progress.acked_through + 1},
                            {part.tp: part.progress.txn_marker()},
                        )
                        part.group_offset = part.progress.acked_through + 1
                except (TransactionFailed, Unreachable) as exc:
                    log.warning(
                        "%s: recovery of %s failed, will retry: %s",
                        self.processor.slug,
                        part.tp,
                        exc,
                    )
                    continue
                self.stats.recovered += len(missing)
            self._clear_pending(part)
