"""Kafka effects in transactions, recovery of pending effects, and refolds."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from consumers.runtime.parts import is_part
from consumers.runtime.runner_base import Outcome, RunnerBase
from consumers.runtime.transport import CommittedUnknown
from consumers.runtime.types import (
    TP,
    EffectKind,
    OutRecord,
)
from streams.errors import TransactionFailed

log = logging.getLogger("rhumbatron.runtime")


class TransactionMixin(RunnerBase):
    def _publish(self, outcomes: list[Outcome]) -> None:
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
        for part in [p for p in self.parts.values() if p.needs_first_fold]:
            if self.controls is None:
                raise RuntimeError(
                    f"{self.processor.slug}: {part.tp} starts past its history and there are "
                    "no controls to fold it from the archive"
                )
            self.controls.first_fold(part.tp, epoch=part.epoch)
            part.needs_first_fold = False
            part.progress = self.store.load(part.tp)
            part.states.clear()
            self.transport.seek(part.tp, part.progress.acked_through + 1)

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
