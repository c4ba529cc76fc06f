"""The publisher: moves outbox rows to their projects' streams, in slot order, at least once.

A pass: due retries go back to pending; the first ``rows_per_project`` open rows of each project
are read; projects whose head is pending are sent (:mod:`streams.outbox.dispatch`); every result
is recorded in one transaction. A project whose head is ``failed`` is held back (its later rows
wait); one whose head is in ``retry_wait`` waits for it; every other project keeps flowing.

The fail-point ``publisher.after_ack`` sits between Kafka's acknowledgements and the transaction
that marks the rows published: a crash there re-sends those rows on restart (duplicates the
consumers absorb by event id), never loses them.

Waiting: a pass that sent rows is followed by another at once. A writer committing in the same
process wakes the publisher at once (:class:`~streams.outbox.store.CommitSignal`); writers in other
processes are only seen by polling, so an idle publisher polls with a wait that starts at
``poll_min_s`` after a pass that sent rows and doubles on each idle pass up to ``poll_interval_s``
(:class:`IdleWait`): a steady stream of writes is picked up within milliseconds, an outbox left
idle is polled as seldom as before. It never sleeps past the next due retry.

A pass takes the outbox's write lock only when it has something to write: retries are released
only when one is due (so an idle pass is reads only and does not queue the writers behind it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import groupby

from opentelemetry import metrics

from streams import failpoints, tracing
from streams.clock import Clock, SystemClock
from streams.headers import OUTBOX
from streams.log_context import log_fields
from streams.outbox.dispatch import Dispatch, Window
from streams.outbox.identity import PREFIX, is_outbox_id
from streams.outbox.sender import EventSender, SenderFactory
from streams.outbox.states import (
    Deferred,
    Outcome,
    Published,
    PublisherPolicy,
    RowFault,
    transition,
)
from streams.outbox.store import OutboxRow, OutboxStore, RowState, RowUpdate

log = logging.getLogger("rhumbatron.outbox.publisher")
meter = metrics.get_meter("rhumbatron.outbox")
# Seconds from a row's commit in the outbox to Kafka's acknowledgement of it: a healthy publisher
# is in the first buckets, one that waited out an outage in the last.
PUBLISH_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0
)  # fmt: skip
publish_latency = meter.create_histogram(
    "rhumbatron_publish_latency",
    unit="s",
    description="outbox commit to broker acknowledgement, per published row",
    explicit_bucket_boundaries_advisory=list(PUBLISH_LATENCY_BUCKETS_S),
)
outbox_published = meter.create_counter(
    "rhumbatron_outbox_published", unit="", description="outbox rows published"
)

AFTER_ACK = "publisher.after_ack"


@dataclass
class PublisherTotals:
    """Running figures of one publisher."""

    passes: int = 0  # passes that sent rows (idle polls are not counted)
    published: int = 0
    row_faults: int = 0  # sends refused because of the row itself
    deferred: int = 0  # sends that failed for other reasons (outage, producer rebuilt)
    failed: int = 0  # rows that became failed
    order_violations: int = 0
    producers_replaced: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def retries(self) -> int:
        """Failed sends that will be (or were) tried again."""
        return self.row_faults + self.deferred - self.failed

    def as_dict(self) -> dict[str, float | int]:
        return {
            "passes": self.passes,
            "published": self.published,
            "row_faults": self.row_faults,
            "deferred": self.deferred,
            "failed": self.failed,
            "order_violations": self.order_violations,
            "producers_replaced": self.producers_replaced,
        }


@dataclass(frozen=True, slots=True)
class PassReport:
    sent: int  # rows attempted this pass
    published: int

    @property
    def idle(self) -> bool:
        return self.sent == 0


class IdleWait:
    """How long an idle publisher waits before its next pass: ``shortest`` after a pass that sent
    rows, twice the last wait after each idle pass, never more than ``longest``."""

    def __init__(self, shortest: float, longest: float) -> None:
        if not 0 < shortest <= longest:
            raise ValueError(
                f"outbox_poll_min_interval_s ({shortest}) must be more than 0 and at most "
                f"outbox_poll_interval_s ({longest})"
            )
        self.shortest = shortest
        self.longest = longest
        self._next = longest  # nothing was sent yet: a fresh publisher polls as an idle one

    def sent(self) -> None:
        """A pass sent rows: more are likely soon."""
        self._next = self.shortest

    def idle(self) -> float:
        """A pass found nothing: the wait before the next one."""
        wait = self._next
        self._next = min(wait * 2, self.longest)
        return wait


def select_windows(rows: list[OutboxRow], stream_for: Callable[[str], str]) -> list[Window]:
    """Group sendable rows (slot order per project) into windows: each project's leading run of
    pending rows. The run stops at the first row that is not pending, so nothing is ever sent
    ahead of a row still waiting or failed."""
    windows: list[Window] = []
    for project_id, group in groupby(rows, key=lambda r: r.project_id):
        run: list[OutboxRow] = []
        for row in group:
            if row.state is not RowState.PENDING:
                break
            run.append(row)
        if run:
            windows.append(Window(project_id, stream_for(project_id), tuple(run)))
    return windows


def _identity(store: OutboxStore) -> str | None:
    """The outbox's identity, read once as a publisher starts (a migrate that adds it is seen
    at the next start: docs/outbox.md); None, with one warning saying what to do, when the
    outbox holds none or one that is not an identity."""
    found = store.outbox_id()
    if found is None:
        log.warning(
            "outbox %s holds no identity (a PostgreSQL outbox below schema version 3): its "
            "events go out without the %r header, so consumers cannot tell its slots from "
            "another outbox's; run `rhumbatron outbox migrate --outbox URL` (online), then "
            "restart this publisher",
            store.location,
            OUTBOX,
        )
        return None
    if not is_outbox_id(found):
        log.warning(
            "outbox %s holds the identity %r, which is not %s followed by 16 lowercase hex "
            "characters (changed by hand?): its events go out without the %r header; put back "
            "the identity it had (from a backup of its outbox_identity table) and restart "
            "this publisher",
            store.location,
            found,
            PREFIX,
            OUTBOX,
        )
        return None
    return found


class Publisher:
    """The one publisher of an outbox. Holds the store's publisher lease from construction until
    :meth:`close`, so constructing a second one raises PublisherLocked (a long-running one then
    stands by for the lease: :mod:`streams.outbox.standby`). Once it holds the lease it reads the
    outbox's identity (:attr:`outbox_id`), which every record it sends names."""

    def __init__(
        self,
        store: OutboxStore,
        sender_factory: SenderFactory,
        *,
        stream_for: Callable[[str], str],
        policy: PublisherPolicy,
        clock: Clock | None = None,
        poll_min_s: float | None = None,
    ) -> None:
        # Built before the lease is taken: a refused setting leaves nothing held.
        self._idle_wait = IdleWait(
            policy.poll_interval_s if poll_min_s is None else poll_min_s, policy.poll_interval_s
        )
        self._store = store
        self._factory = sender_factory
        self._stream_for = stream_for
        self._policy = policy
        self._clock: Clock = clock or SystemClock()
        self._lease = store.publisher_lease()
        self._lease.__enter__()
        try:
            self.outbox_id = _identity(store)
        except BaseException:
            self._lease.__exit__(None, None, None)
            raise
        self._sender: EventSender | None = None
        self._after_project: str | None = None
        self.totals = PublisherTotals()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        self._lease.__exit__(None, None, None)

    def _current_sender(self) -> EventSender:
        if self._sender is None:
            self._sender = self._factory()
        return self._sender

    def run_pass(self) -> PassReport:
        now = self._clock.now().timestamp()
        due = self._store.next_due_at()
        if due is not None and due <= now:
            self._store.release_due(now)
        rows = self._store.sendable(
            self._policy.rows_per_project, self._policy.rows_per_pass, self._after_project
        )
        windows = select_windows(rows, self._stream_for)
        if not windows:
            return PassReport(0, 0)
        # A pass cut short by rows_per_pass: the next one starts after the last project served,
        # so every project gets its turn.
        capped = len(rows) >= self._policy.rows_per_pass
        self._after_project = windows[-1].project_id if capped else None
        sender = self._current_sender()
        with tracing.tracer(__name__).start_as_current_span("outbox.publish_pass") as span:
            dispatch = Dispatch(
                sender,
                ordering=self._policy.ordering,
                delivery_timeout_s=self._policy.delivery_timeout_s,
                clock=self._clock,
                outbox_id=self.outbox_id,
            )
            outcomes = dispatch.run(windows)
            span.set_attribute("rhumbatron.outbox.rows", len(outcomes))
        failpoints.hit(AFTER_ACK)
        by_id = {row.event_id: row for row in rows}
        done = self._clock.now().timestamp()
        updates = [
            transition(by_id[event_id], outcome, self._policy, done)
            for event_id, outcome in outcomes.items()
        ]
        self._store.apply(updates)
        self._count(outcomes.values(), updates, dispatch.order_violations)
        self._observe(by_id, outcomes, done)
        if sender.broken or dispatch.lost_reports:
            sender.close()
            self._sender = None
            self.totals.producers_replaced += 1
        published = sum(1 for u in updates if u.state is RowState.PUBLISHED)
        return PassReport(len(outcomes), published)

    @staticmethod
    def _observe(rows: dict[str, OutboxRow], outcomes: dict[str, Outcome], acked: float) -> None:
        published = [event_id for event_id, o in outcomes.items() if isinstance(o, Published)]
        for event_id in published:
            publish_latency.record(max(acked - rows[event_id].created_at, 0.0))
        if published:
            outbox_published.add(len(published))

    def _count(
        self, outcomes: Iterable[Outcome], updates: list[RowUpdate], violations: int
    ) -> None:
        totals = self.totals
        totals.passes += 1
        for outcome in outcomes:
            if isinstance(outcome, RowFault):
                totals.row_faults += 1
            elif isinstance(outcome, Deferred):
                totals.deferred += 1
            elif isinstance(outcome, Published):
                totals.published += 1
        totals.failed += sum(1 for u in updates if u.state is RowState.FAILED)
        totals.order_violations += violations

    def drained(self) -> bool:
        """Nothing is left that this publisher could send, now or after a backoff, without an
        operator: no project's head is pending and no row waits in retry_wait (what remains is
        failed, or queued behind a failed row)."""
        return self._store.next_due_at() is None and not self._store.sendable(1, 1, None)

    def run(
        self,
        *,
        until_empty: bool = False,
        stop: threading.Event | None = None,
        progress: Callable[[PublisherTotals], None] | None = None,
        progress_interval_s: float = 0.0,
        tick: Callable[[], None] = lambda: None,
    ) -> PublisherTotals:
        """Publish until ``stop`` is set (or, with ``until_empty``, until :meth:`drained`).
        ``tick`` is called once each time round the loop (a health beat)."""
        stop = stop or threading.Event()
        last_progress = self._clock.monotonic()
        # On every record the publisher logs (the location names no password).
        with log_fields(outbox=self._store.location):
            while not stop.is_set():
                tick()
                generation = self._store.commits.generation
                report = self.run_pass()
                if progress and self._clock.monotonic() - last_progress >= progress_interval_s:
                    progress(self.totals)
                    last_progress = self._clock.monotonic()
                if not report.idle:
                    self._idle_wait.sent()
                    continue
                if until_empty and self.drained():
                    break
                wait = self._idle_wait.idle()
                due = self._store.next_due_at()
                if due is not None:
                    wait = min(wait, max(due - self._clock.now().timestamp(), 0.0))
                if wait > 0:
                    self._store.commits.wait(generation, wait)
        return self.totals
