"""The eventless caught-up call: reconciliation as ordinary ``process`` logic.

A processor with ``caught_up_call = True`` learns that it has read a partition to its end. The
last event of a scan that reaches the end is delivered with ``delivery.caught_up`` set; when that
scan held no event for the processor (its last records were of other types, duplicates, poison,
or there were none), the runner makes one call ``process(None, folds, delivery)`` instead:
``folds`` is the partition's per-project folds (read on first use), ``delivery.caught_up`` is
True and ``delivery.offset`` is ``acked_through``, so ``delivery.idempotency_key(...)`` is the
same for every try of that call and new after the cursor moves or a ``reprocess_from``.

At most once per (partition, ``acked_through``, cursor revision): the call's effects commit with
the mark ``Progress.caught_up``, as a batch's do with its cursor, so a restart does not repeat
them; a caught-up event records the same mark, so no eventless call follows it. A call that
raises is logged and tried again after ``retry_backoff_s``; nothing of it is committed.
Processors whose effects are files (the archive) get no such call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from consumers.runtime.runner_base import Outcome, PartitionState, RunnerBase
from consumers.runtime.store import Commit, EventStatements
from consumers.runtime.types import JSON, TP, Delivery, EffectKind, Phase, Progress
from streams.errors import Fenced

log = logging.getLogger("rhumbatron.runtime")


def caught_up_mark(progress: Progress) -> str:
    """What a caught-up call at this cursor records: (acked_through, cursor revision)."""
    return f"{progress.acked_through}:{progress.cursor_revision}"


class Folds(Mapping[str, JSON]):
    """A partition's folds by project, read from the store on first use."""

    def __init__(self, read: Any) -> None:
        self._read = read
        self._folds: dict[str, JSON] | None = None

    def _all(self) -> dict[str, JSON]:
        if self._folds is None:
            self._folds = dict(self._read())
        return self._folds

    def __getitem__(self, project: str) -> JSON:
        return self._all()[project]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class CaughtUpMixin(RunnerBase):
    _caught_up_retry: dict[TP, float]

    def _caught_up_calls(self) -> None:
        """Make the eventless call on every partition read to its end since its last one."""
        proc = self.processor
        if not getattr(proc, "caught_up_call", False) or proc.effect_kind == EffectKind.FILES:
            return
        now = self.clock.monotonic()
        for part in list(self.parts.values()):
            progress = part.progress
            if (
                progress.acked_through < 0
                or progress.caught_up == caught_up_mark(progress)
                or not self._settled(part)
                or part.needs_refold
                or part.needs_first_fold
                or progress.applied_beyond
                or progress.dead
                or now < self._caught_up_retry.get(part.tp, 0.0)
                or self._read_through(part, progress) is None
                or not self.transport.caught_up([part.tp])
            ):
                continue
            self._caught_up_call(part)

    def _caught_up_call(self, part: PartitionState) -> None:
        proc = self.processor
        progress = part.progress
        owner_check = self._owner_check(part)
        delivery = Delivery(
            tp=part.tp,
            offset=progress.acked_through,
            phase=Phase.LIVE,
            caught_up=True,
            cursor_revision=progress.cursor_revision,
            check_owner=owner_check,
        )
        folds = Folds(lambda: self.store.all_states(part.tp)) if proc.reducer_version else None
        try:
            effects = proc.process(cast(Any, None), cast(Any, folds), delivery)
            records = list(effects.records)
            ops = list(effects.redis)
            # SQL effects run as an event's do, all or nothing (no event: no id, no project).
            statements = [EventStatements("", "", effects.sql)] if effects.sql else []
            if records:
                records = proc.finish_batch(records, ops, owner_check)
        except Fenced:
            self.stats.fenced += 1
            self._drop(part)
            return
        except Exception as exc:
            self._caught_up_retry[part.tp] = self.clock.monotonic() + self.policy.retry_backoff_s
            log.warning(
                "%s: the caught-up call on %s at offset %d failed: %s: %s",
                proc.slug,
                part.tp,
                progress.acked_through,
                type(exc).__name__,
                exc,
            )
            return
        self._caught_up_retry.pop(part.tp, None)
        new = Progress.from_fields(progress.as_fields())
        new.caught_up = caught_up_mark(progress)
        self._next_transaction(new, progress, pending=bool(records))
        commit = Commit(
            tp=part.tp,
            epoch=part.epoch,
            expected_acked=progress.acked_through,
            expected_revision=progress.cursor_revision,
            progress=new,
            redis=ops,
            sql=statements,
            pending=records or None,
        )
        failed = self._commit([Outcome(commit, [], None, [])]).get(part.tp)
        if failed:
            # Its SQL statements failed: nothing of it was committed; tried again later.
            self._caught_up_retry[part.tp] = self.clock.monotonic() + self.policy.retry_backoff_s
            error = next(iter(failed.values()))
            log.warning(
                "%s: the caught-up call on %s at offset %d failed: %s: %s",
                proc.slug,
                part.tp,
                progress.acked_through,
                type(error).__name__,
                error,
            )

    if TYPE_CHECKING:  # the runner's own

        def _commit(self, outcomes: list[Outcome]) -> dict[TP, dict[str, BaseException]]: ...

        def _owner_check(self, part: PartitionState) -> Callable[[], None]: ...
