"""The pump's run: read the checkpoint, then page after page of the feed, each page's identity
checked before any of its events is published, each batch and its checkpoint committed in one
Kafka transaction.

The parts it runs on are protocols, so the run is one piece of code over the real feed (HTTP),
the real broker and Redis, and over the tests' own: ``Feed`` (one page after a sequence),
``Sink`` (the checkpoint, and a batch committed with the checkpoint after it) and ``Legacy``
(the bare sequence an earlier pump kept)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streams.errors import (
    FeedUnavailable,
    LegacyCheckpointAmbiguous,
    PumpError,
    TransactionFailed,
    Unreachable,
)
from streams.pump.identity import Checkpoint, Identity, check_same, identity_of
from streams.pump.page import FeedEvent, batches, read_page

log = logging.getLogger("rhumbatron.pump")


@dataclass(frozen=True)
class FeedResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


class Feed(Protocol):
    def fetch(self, after: int, expected: Identity | None, limit: int) -> FeedResponse:
        """The page after ``after`` (at most ``limit`` lines), sending ``expected`` as the
        expected pair when there is one. Raises FeedUnavailable when the feed cannot be read."""
        ...


class Sink(Protocol):
    def checkpoint(self) -> Checkpoint | None:
        """The feed's last committed checkpoint (None before the first)."""
        ...

    def commit(self, events: Sequence[FeedEvent], checkpoint: Checkpoint) -> None:
        """The events and then the checkpoint, in one transaction: both or neither."""
        ...


class Legacy(Protocol):
    def read(self) -> int | None: ...

    def delete(self) -> None: ...


@dataclass(frozen=True)
class Limits:
    page_size: int
    batch_max_events: int
    batch_max_bytes: int
    max_envelope_bytes: int


@dataclass
class PassResult:
    published: int = 0
    batches: int = 0
    pages: int = 0
    checkpoint: Checkpoint | None = None
    migrated: bool = False
    stopped: bool = False  # asked to stop between batches


@dataclass
class PumpStats:
    """What the pump did in this process: its metrics read these."""

    pages: int = 0
    events: int = 0
    batches: int = 0
    rejections: int = 0
    retries: int = 0
    checkpoint: Checkpoint | None = None  # the latest read or committed
    caught_up_at: float | None = None  # monotonic time of the last caught-up page
    migrated: bool = False

    @property
    def sequence(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.sequence

    def lag_s(self, now: float) -> float | None:
        """Seconds since the feed was last read to its end (None before the first time)."""
        return None if self.caught_up_at is None else max(0.0, now - self.caught_up_at)


@dataclass
class Backoff:
    first_s: float
    max_s: float
    _next: float = 0.0

    def wait(self) -> float:
        self._next = self.first_s if self._next == 0 else min(self._next * 2, self.max_s)
        return self._next

    def reset(self) -> None:
        self._next = 0.0


def transient(exc: BaseException) -> bool:
    """Worth another try in a long-running pump: the feed or Kafka out for a while. Not: an
    identity, a bad line, a checkpoint that does not parse, a fenced pump."""
    if isinstance(exc, FeedUnavailable | Unreachable):
        return True
    return isinstance(exc, TransactionFailed) and not exc.fenced


@dataclass
class Pump:
    feed: Feed
    sink: Sink
    limits: Limits
    legacy: Legacy | None = None
    attested: Identity | None = None  # the operator's corpus id and lineage for a legacy value
    should_stop: Callable[[], bool] = field(default=lambda: False)
    stats: PumpStats = field(default_factory=PumpStats)
    clock: Callable[[], float] = time.monotonic

    def run(
        self, *, once: bool, stop: threading.Event, poll_interval_s: float, backoff: Backoff
    ) -> PassResult:
        """Passes until stopped: once, or for as long as the process runs, waiting
        ``poll_interval_s`` once caught up. Transient failures (the feed or Kafka away) are
        tried again after a doubling wait in a long-running pump; what ``transient`` does not
        name stops it, raised."""
        stats = self.stats
        start = (stats.events, stats.batches, stats.pages)
        self.should_stop = stop.is_set
        stopped = False
        while not stop.is_set():
            try:
                result = self.pass_once()
            except Exception as exc:
                if once or not transient(exc):
                    raise
                stats.retries += 1
                wait = backoff.wait()
                log.warning("pump: %s; trying again in %.1fs", exc, wait)
                stop.wait(wait)
                continue
            backoff.reset()
            if once or result.stopped:
                stopped = result.stopped
                break
            stop.wait(poll_interval_s)
        # From the stats: a pass that failed and was tried again published what it committed.
        return PassResult(
            published=stats.events - start[0],
            batches=stats.batches - start[1],
            pages=stats.pages - start[2],
            checkpoint=stats.checkpoint,
            migrated=stats.migrated,
            stopped=stopped or stop.is_set(),
        )

    def pass_once(self) -> PassResult:
        """Pages until the feed is caught up (a page with no line). Raises what stops
        the pump: identity (FeedIdentityError), a bad line (FeedLineRejected, after the lines
        before it are committed), the feed (FeedUnavailable), Kafka (TransactionFailed)."""
        result = PassResult()
        checkpoint = self.sink.checkpoint()
        legacy = self.legacy.read() if self.legacy is not None else None
        if checkpoint is not None and legacy is not None:
            assert self.legacy is not None
            log.info(
                "a v1 checkpoint exists (%s): the legacy sequence %d is deleted", checkpoint, legacy
            )
            self.legacy.delete()
            legacy = None
        expected: Identity | None
        if checkpoint is not None:
            expected, after = checkpoint.identity, checkpoint.sequence
        elif legacy is not None:
            if self.attested is None:
                raise LegacyCheckpointAmbiguous(
                    f"a legacy checkpoint (sequence {legacy}) and no v1 checkpoint: a bare "
                    "sequence names no corpus or lineage, so it is not used. If verified "
                    "evidence says which corpus and lineage it belongs to, run again with "
                    "--legacy-corpus-id and --legacy-lineage; nothing was changed"
                )
            expected, after = self.attested, legacy
        else:
            expected, after = None, 0
        result.checkpoint = checkpoint
        if checkpoint is not None:
            self.stats.checkpoint = checkpoint
        while True:
            response = self.feed.fetch(after, expected, self.limits.page_size)
            result.pages += 1
            self.stats.pages += 1
            if response.status >= 500:
                raise FeedUnavailable(f"the feed answered {response.status} for after={after}")
            found = identity_of(response.headers)
            if expected is not None:
                check_same(expected, found)
            if response.status != 200:
                raise PumpError(
                    f"the feed answered {response.status} for after={after}: "
                    f"{response.body[:200]!r}"
                )
            if checkpoint is None:
                # A new installation, or a legacy value the feed has just confirmed: the
                # identity is stored before any event of the page is published.
                checkpoint = Checkpoint(found, after)
                self.sink.commit([], checkpoint)
                if legacy is not None:
                    assert self.legacy is not None
                    self.legacy.delete()
                    legacy = None
                    result.migrated = self.stats.migrated = True
                expected = found
                result.checkpoint = self.stats.checkpoint = checkpoint
            page = read_page(
                response.body, after=after, max_envelope_bytes=self.limits.max_envelope_bytes
            )
            for batch in batches(
                page.events,
                max_events=self.limits.batch_max_events,
                max_bytes=self.limits.batch_max_bytes,
            ):
                checkpoint = checkpoint.advanced(batch[-1].sequence)
                self.sink.commit(batch, checkpoint)
                self.stats.events += len(batch)
                self.stats.batches += 1
                result.checkpoint = self.stats.checkpoint = checkpoint
                result.published += len(batch)
                result.batches += 1
                after = checkpoint.sequence
                if self.should_stop():
                    result.stopped = True
                    return result
            if page.rejected is not None:
                self.stats.rejections += 1
                raise page.rejected
            # Caught up only on an empty page: a feed may serve fewer lines a page than the pump
            # asks for (its own page size), so a short page is no proof that nothing follows.
            if page.lines == 0:
                self.stats.caught_up_at = self.clock()
                return result
            if self.should_stop():
                result.stopped = True
                return result


def skip_through(sink: Sink, sequence: int) -> tuple[Checkpoint, Checkpoint]:
    """The checkpoint moved forward to ``sequence``, same identity (the way past a line the pump
    refuses; the CLI audits it): (before, after). Refused without a checkpoint, or backwards."""
    checkpoint = sink.checkpoint()
    if checkpoint is None:
        raise PumpError(
            "no checkpoint to skip from: the pump has not established the feed's identity yet"
        )
    if sequence <= checkpoint.sequence:
        raise PumpError(
            f"skip-through {sequence} does not move forward: the checkpoint is at "
            f"{checkpoint.sequence}"
        )
    moved = checkpoint.advanced(sequence)
    sink.commit([], moved)
    return checkpoint, moved
