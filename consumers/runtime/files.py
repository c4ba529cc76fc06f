"""Effects in files, the runner's side: filling, closing and flushing open parts (see parts.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from consumers.runtime.parts import OpenPart, part_record
from consumers.runtime.runner_base import Outcome, PartitionState, RunnerBase
from consumers.runtime.store import Commit
from consumers.runtime.types import (
    EffectKind,
    Progress,
)

log = logging.getLogger("rhumbatron.runtime")


class FilesMixin(RunnerBase):
    def _fill_part(self, part: PartitionState, outcome: Outcome) -> None:
        if part.open_part is None:
            part.open_part = OpenPart(opened_at=self.clock.monotonic(), progress=part.progress)
        part.open_part.add(outcome.commit.progress, outcome.commit.claims, outcome.lines)
        self._close_part_if_done(part)

    def _close_part_if_done(self, part: PartitionState) -> None:
        open_part = part.open_part
        if open_part is None:
            return
        age = self.clock.monotonic() - open_part.opened_at
        if self._writer().should_close(len(open_part.lines), open_part.size, age):
            self._close_part(part)

    def _close_part(self, part: PartitionState) -> None:
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
        if not self._store_commit(part, commit):
            return
        part.progress = new
        self.failpoint("runtime.after_store_commit")
        if pending is not None:
            writer.store(pending[0].key, pending[0].value)
            self.stats.parts += 1
            stamps = (line.timestamp_ms for line in open_part.lines)
            self.instruments.committed(self.processor.slug, stamps, self.clock.now().timestamp())
            self.failpoint("runtime.after_part_write")
            self._clear_pending(part)
        self._commit_group_offsets([part])

    def _flush_due(self) -> None:
        if self.processor.effect_kind != EffectKind.FILES:
            return
        for part in list(self.parts.values()):
            self._close_part_if_done(part)

    def _close_all_parts(self, parts: Iterable[PartitionState]) -> None:
        if self.processor.effect_kind != EffectKind.FILES:
            return
        for part in list(parts):
            if part.open_part is not None and part.tp in self.parts:
                self._close_part(part)
