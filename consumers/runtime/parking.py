"""Parked projects: an event of a version newer than the subscription's code knows waits, with
every later event of its project, until a consumer that knows that version owns the partition.

Consumers are upgraded before writers emit a new version; when one is not, reading a version
the code was not written for would be wrong, skipping it would break the project's fold order,
and failing it would dead-letter it. So its project *parks* in that subscription's partition:

- the cursor keeps one entry per parked project (``Progress.parked``: the offset of its first
  parked event, and the type and version that parked it), committed with the batch like the
  rest of the cursor, so a restart keeps it and its size does not grow with the events waiting;
- the invariant: a parked project's events from that offset through the furthest offset the
  cursor counts handled (``acked_through``, or one in ``applied_beyond``) are neither applied
  nor claimed; the cursor passes them as it passes any handled record, and a later event of
  the project is parked too (it must not overtake the parked ones), while other projects of
  the partition flow and nothing counts as a failure;
- past ``parked_projects_max`` parked projects in a partition, the event that would park one
  more stops the partition there (retried after a backoff, logged as an error): the cost of
  a park stays bounded;
- a runner whose catalog knows the parked version (an upgraded consumer, on assignment or any
  turn of its loop after) *drains* the park: it re-reads the partition from the park's offset
  through that furthest offset with the operator controls' reader (the stream, or the archive
  for what the stream no longer holds), and applies only the parked projects' events, in
  order, through the usual batch path (claims looked up first, so nothing is applied twice).
  Each batch moves the park's offset on and the one that reaches that offset clears it, in the
  same commit; a new event of the project read meanwhile is parked behind, so it is applied
  after them.

Processors that see events as written (``keeps_wire``, files: the archive) never park.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

from consumers.runtime.runner_base import Outcome, PartitionState, RunnerBase
from consumers.runtime.types import TP, EffectKind, Park, Progress, Record
from streams.catalog import Catalog
from streams.envelopes import Event, decode_event
from streams.errors import ControlRefused, EnvelopeError, NewerThanKnown, Unreachable

log = logging.getLogger("rhumbatron.runtime")

__all__ = ["BatchParking", "Drain", "ParkVerdict", "ParkingMixin"]


class ParkVerdict(Enum):
    APPLY = "apply"  # judged as usual
    PARKED = "parked"  # handled for the cursor, not applied: its project waits
    STOP = "stop"  # the partition stops here: no room for one more parked project
    NEWER = "newer"  # a redelivered event newer than the code knows: it fails (NewerThanKnown)


@dataclass(frozen=True)
class Drain:
    """A batch of re-read records that applies parked projects' events: the parks (as the batch
    started) whose events it holds, every one of them from its park's offset through
    ``through``."""

    parks: dict[str, Park]
    through: int


def knows(catalog: Catalog, park: Park) -> bool:
    """Does ``catalog`` read the version that parked ``park``? (A type it does not catalog any
    more passes through untouched, as every uncataloged type does.)"""
    latest = catalog.latest(park.event_type)
    return not 0 < latest < park.version


def handled_through(progress: Progress) -> int:
    """The furthest offset the cursor counts handled: ``acked_through``, or past it an event
    applied (or parked) beyond a held-back one."""
    return max([progress.acked_through, *progress.applied_beyond])


class BatchParking:
    """One partition batch's parks: judged record by record, then written with its cursor."""

    def __init__(
        self, progress: Progress, catalog: Catalog, limit: int, drain: Drain | None, active: bool
    ) -> None:
        self.parks = dict(progress.parked)
        self.catalog = catalog
        self.limit = limit
        self.drain = drain
        self.active = active
        self.draining = set(drain.parks) if drain is not None else set()
        self.stopped_at: int | None = None  # the offset whose event found no room to park
        self.stopped_by: Event | None = None

    def judge(self, offset: int, event: Event, redelivered: bool) -> ParkVerdict:
        if not self.active:
            return ParkVerdict.APPLY
        if redelivered:  # an operator's retry, out of the stream's order anyway: never parked
            return ParkVerdict.NEWER if self.catalog.is_newer(event) else ParkVerdict.APPLY
        if self.stopped_at is not None:
            return ParkVerdict.STOP
        project = event.project_id
        park = self.parks.get(project)
        if park is not None and offset >= park.offset and project not in self.draining:
            return ParkVerdict.PARKED
        if self.catalog.is_newer(event):
            if park is None and len(self.parks) >= self.limit:
                self.stopped_at, self.stopped_by = offset, event
                return ParkVerdict.STOP
            # Parked here (or again, further on, by a still newer event while it drains).
            self.parks[project] = Park(offset, event.event_type, event.event_version)
            log.warning(
                "project %s parked at offset %d: its event %s is %s@%d, and this consumer knows "
                "%s up to @%d; its events wait (none fails) until a consumer that knows @%d "
                "owns the partition: upgrade the consumer",
                project,
                offset,
                event.event_id,
                event.event_type,
                event.event_version,
                event.event_type,
                self.catalog.latest(event.event_type),
                event.event_version,
            )
            self.draining.discard(project)
            return ParkVerdict.PARKED
        return ParkVerdict.APPLY

    def newer(self, event: Event) -> NewerThanKnown:
        known = self.catalog.latest(event.event_type)
        return NewerThanKnown(event.event_id, event.event_type, event.event_version, known)

    def finish(
        self, failed: Sequence[tuple[Record, Event, BaseException]], new: Progress
    ) -> dict[str, Park]:
        """The parks the batch's cursor (``new``) carries. A drained project moves on to its
        first event that failed, or past the batch; one past every handled offset is no longer
        parked."""
        if self.drain is None:
            return self.parks
        reached = handled_through(new)
        first_failed: dict[str, int] = {}
        for record, event, _ in failed:
            first = first_failed.get(event.project_id)
            if first is None or record.offset < first:
                first_failed[event.project_id] = record.offset
        for project in self.draining:
            park = self.parks[project]
            resume = first_failed.get(project, self.drain.through + 1)
            if resume > reached:
                del self.parks[project]
            else:
                self.parks[project] = park._replace(offset=resume)
        return self.parks

    def passed_batches(self) -> list[str]:
        """Failure counters (batch keys: the failing offset) of drained events now passed."""
        if self.drain is None:
            return []
        return [
            str(park.offset)
            for project, park in self.drain.parks.items()
            if self.parks.get(project) != park  # moved on, or cleared
        ]


class ParkingMixin(RunnerBase):
    def _parks_events(self) -> bool:
        """Whether this subscription parks: not one that sees events as written."""
        proc = self.processor
        return not proc.keeps_wire and proc.effect_kind != EffectKind.FILES

    def _batch_parking(self, progress: Progress, drain: Drain | None) -> BatchParking:
        return BatchParking(
            progress,
            self.policy.catalog,
            self.policy.parked_projects_max,
            drain,
            self._parks_events(),
        )

    def _parked_counts(self) -> dict[TP, int]:
        """Parked projects per partition this runner owns (the metrics read it)."""
        return {tp: len(part.progress.parked) for tp, part in list(self.parts.items())}

    def _drainable(self, part: PartitionState) -> dict[str, Park]:
        catalog = self.policy.catalog
        return {p: park for p, park in part.progress.parked.items() if knows(catalog, park)}

    def _drain_ready(self, part: PartitionState) -> bool:
        # A failure waiting for its retry goes first; a stop for want of room to park does not:
        # draining is what makes room.
        failing = (part.retry_at is not None or part.retry_from is not None) and (
            not part.parking_stops
        )
        return not (
            failing
            or part.needs_recovery
            or part.needs_refold
            or part.needs_first_fold
            or part.drain_blocked_until > self.clock.monotonic()
        )

    def _drain_waiting(self) -> bool:
        """A park this runner can drain waits for its turn (the loop is not idle)."""
        return any(
            self._drain_ready(part) and self._drainable(part) for part in self.parts.values()
        )

    def _drain_parked(self) -> None:
        """Apply the events of the parked projects whose version this code knows, in order,
        up to ``parked_drain_records`` re-read records per partition per turn."""
        if not self._parks_events():
            return
        for part in list(self.parts.values()):
            if self._drain_ready(part) and self._drainable(part):
                self._drain(part)

    def _drain(self, part: PartitionState) -> None:
        parks = self._drainable(part)
        if self.controls is None:
            self._drain_blocked(
                part,
                parks,
                "this runner has no controls, whose reader re-reads the partition; run it with "
                "them (as rhumbatron consume does)",
            )
            return
        first = min(park.offset for park in parks.values())
        through = handled_through(part.progress)
        log.info(
            "%s: %s: applying the events of %d parked project(s) (%s), offsets %d..%d",
            self.processor.slug,
            part.tp,
            len(parks),
            ", ".join(sorted(parks)[:5]) + (" …" if len(parks) > 5 else ""),
            first,
            through,
        )
        need = "the events its parked projects hold back cannot be applied"
        records = self.controls.read(part.tp, first, through, need)
        try:
            self._drain_from(part, records, through)
        except (ControlRefused, Unreachable) as exc:
            self._drain_blocked(part, parks, str(exc))
        finally:
            close = getattr(records, "close", None)
            if close is not None:
                close()

    def _drain_from(self, part: PartitionState, records: Iterator[Record], through: int) -> None:
        size = self.policy.batch_size
        budget = self.policy.parked_drain_records
        parks = self._drainable(part)
        chunk: list[Record] = []
        for scanned, record in enumerate(records, 1):
            if self._wanted(record, parks):
                chunk.append(record)
            if scanned % size == 0 or scanned >= budget:
                if not self._drain_batch(part, chunk, record.offset):
                    return
                chunk = []
                parks = self._drainable(part)
                if not parks or scanned >= budget:
                    return
        self._drain_batch(part, chunk, through)  # read to the cursor: the last batch

    def _wanted(self, record: Record, parks: dict[str, Park]) -> bool:
        try:
            event = decode_event(record.value, max_bytes=self.policy.max_envelope_bytes)
        except EnvelopeError:
            return False  # poison: dead-lettered when it was first read
        park = parks.get(event.project_id)
        return park is not None and record.offset >= park.offset

    def _drain_batch(self, part: PartitionState, records: list[Record], through: int) -> bool:
        """One batch of re-read records through the usual path; False when the partition cannot
        go on draining now (a failure waits for its retry, or it is no longer ours)."""
        self._apply_drain(part, records, Drain(self._drainable(part), through))
        current = self.parts.get(part.tp)
        return current is part and part.retry_at is None

    def _drain_blocked(self, part: PartitionState, parks: dict[str, Park], why: str) -> None:
        wait = self.policy.retry_backoff_max_s
        part.drain_blocked_until = self.clock.monotonic() + wait
        log.error(
            "%s: %s: cannot apply the events of parked project(s) %s from offset %d: %s; "
            "tried again in %.0f s",
            self.processor.slug,
            part.tp,
            ", ".join(sorted(parks)),
            min(park.offset for park in parks.values()),
            why,
            wait,
        )

    def _parking_stopped(self, part: PartitionState, outcome: Outcome) -> None:
        """A batch met an event that would park one project more than the partition may hold:
        the partition stops there, like a failure under the ``block`` policy (but counting
        none), and says so at every try."""
        part.parking_stops += 1
        at = outcome.stopped_at
        event = outcome.stopped_by
        what = f"{event.event_type}@{event.event_version}" if event is not None else "?"
        log.error(
            "%s: %s stopped at offset %s: its event (%s, project %s) is newer than this "
            "consumer knows, and %d projects of the partition are parked already "
            "(parked_projects_max): upgrade the consumer to one that knows %s, or raise "
            "parked_projects_max",
            self.processor.slug,
            part.tp,
            at,
            what,
            event.project_id if event is not None else "?",
            len(part.progress.parked),
            what,
        )
        self._schedule_retry(part, outcome.first_unapplied, part.parking_stops)

    def _apply_drain(self, part: PartitionState, records: list[Record], drain: Drain) -> None:
        """The runner's: process and commit ``records`` as one batch of ``part`` that drains."""
        raise NotImplementedError
