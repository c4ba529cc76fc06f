"""One publisher pass through the sender, under either ordering strategy.

The rule both strategies keep: Kafka never holds slot N+1 of a project without slot N before it.

- **serial**: one row in flight per project; the next is produced from the previous one's
  acknowledgement. A failure stops the project for this pass.
- **pipelined**: each project's whole window (up to ``rows_per_project`` rows) is produced at
  once. The producer runs with ``enable.gapless.guarantee``: a failed batch fails every later
  record of its partition (the producer goes fatal and purges them) instead of letting them
  land behind the hole; an outage is cut short by purging everything outstanding (see
  :mod:`streams.outbox.sender`). A row that fails synchronously stops its project's window.

Whatever the strategy, rows of a project after its first failed row are left untouched (still
pending, no counter used: the failure was not theirs) and go out after it in a later pass.

A head row that has failed on its own before (``attempts > 0``) is first sent alone, with nothing
else outstanding: a broker rejects a whole batch, so a row that merely shared a batch with a bad
one must get a clean try instead of being charged again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from streams import tracing
from streams.clock import Clock
from streams.headers import CONTENT_TYPE as CONTENT_TYPE_HEADER
from streams.headers import EVENT_ID, EVENT_TYPE, OUTBOX
from streams.outbox.sender import EventSender
from streams.outbox.states import Deferred, NoStream, Ordering, Outcome, Published, RowFault
from streams.outbox.store import OutboxRow
from streams.producer import CONTENT_TYPE, DeliveryReport, Fault, Headers

log = logging.getLogger("rhumbatron.outbox.publisher")

# The longest single wait for delivery reports; short so the delivery deadline is checked often.
POLL_SLICE_S = 0.05
# Pipelined sending serves reports every this many records, so acknowledgements are processed
# (and the local queue drained) while a large window is still being handed over.
POLL_EVERY_RECORDS = 1000


@dataclass(frozen=True, slots=True)
class Window:
    """The rows of one project to send this pass, in slot order, and the stream they go to."""

    project_id: str
    stream: str
    rows: tuple[OutboxRow, ...]


class Dispatch:
    """Sends one pass and collects the outcome of every row that was attempted."""

    def __init__(
        self,
        sender: EventSender,
        *,
        ordering: Ordering,
        delivery_timeout_s: float,
        clock: Clock,
        outbox_id: str | None = None,
    ) -> None:
        self._sender = sender
        # Every record names the outbox its slot is numbered in; none when it has no identity.
        self._identity: Headers = [] if outbox_id is None else [(OUTBOX, outbox_id.encode())]
        self._ordering = ordering
        self._timeout = delivery_timeout_s
        self._clock = clock
        self.outcomes: dict[str, Outcome] = {}
        self.order_violations = 0
        self.lost_reports = False  # reports never came even after abandoning: replace the sender
        # event id -> produced at, in send order. An OrderedDict, because finding the oldest in a
        # plain dict after many deletions scans their leftover hash-table entries: quadratic over a pass.
        self._in_flight: OrderedDict[str, float] = OrderedDict()
        self._stopped: set[str] = set()  # projects with a failure this pass
        self._abandoned_at: float | None = None
        # A span per row only when someone is tracing: the writer was (its context is stored
        # with the row) or this pass is. Untraced, it would cost a fifth of the publish rate.
        self._tracer = tracing.tracer(__name__) if tracing.active() else None
        self._parent_based = self._tracer is not None and tracing.parent_based()
        self._traced = trace.get_current_span().is_recording()

    @property
    def halted(self) -> bool:
        """Nothing more should be sent this pass (the sender broke or an outage was declared)."""
        return self._sender.broken or self._abandoned_at is not None or self.lost_reports

    def run(self, windows: list[Window]) -> dict[str, Outcome]:
        missing = self._sender.missing_streams({w.stream for w in windows})
        live: list[Window] = []
        for window in windows:
            if window.stream in missing:
                self.outcomes[window.rows[0].event_id] = NoStream(window.stream)
            else:
                live.append(window)
        rest: list[Window] = []
        for window in live:
            head = window.rows[0]
            if head.attempts == 0:
                rest.append(window)
                continue
            if self.halted:
                continue
            self._produce(head, window.stream, None)
            self._wait_all()
            if isinstance(self.outcomes.get(head.event_id), Published) and len(window.rows) > 1:
                rest.append(Window(window.project_id, window.stream, window.rows[1:]))
        if self._ordering is Ordering.SERIAL:
            self._serial(rest)
        else:
            self._pipelined(rest)
        self._settle(live)
        return self.outcomes

    # -- strategies ------------------------------------------------------------------------------
    def _serial(self, windows: list[Window]) -> None:
        queues = {w.project_id: deque(w.rows) for w in windows}
        streams = {w.project_id: w.stream for w in windows}
        ready: deque[str] = deque(queues)

        def next_of(project: str) -> Callable[[], None]:
            return lambda: ready.append(project) if queues[project] else None

        while ready or self._in_flight:
            while ready and not self.halted:
                project = ready.popleft()
                if queues[project] and project not in self._stopped:
                    self._produce(queues[project].popleft(), streams[project], next_of(project))
            if self._in_flight:
                self._poll_once()
            elif self.halted:
                break

    def _pipelined(self, windows: list[Window]) -> None:
        handed = 0
        for window in windows:
            for row in window.rows:
                if self.halted or window.project_id in self._stopped:
                    break
                self._produce(row, window.stream, None)
                handed += 1
                if handed % POLL_EVERY_RECORDS == 0:
                    self._poll_once(0)
        self._wait_all()

    # -- the producer boundary -------------------------------------------------------------------
    def _produce(self, row: OutboxRow, stream: str, then: Callable[[], None] | None) -> None:
        headers: Headers = [
            (EVENT_TYPE, row.event_type.encode()),
            (EVENT_ID, row.event_id.encode()),
            *self._identity,
            (CONTENT_TYPE_HEADER, CONTENT_TYPE),
        ]
        span: trace.Span | None = None
        wanted = not self._unsampled(row) if row.trace_context else self._traced
        if self._tracer is not None and wanted:
            # The PRODUCER span of the send, in the writer's trace: the record carries it.
            parent: Context | None = (
                propagate.extract(row.trace_context) if row.trace_context else None
            )
            span = self._tracer.start_span(
                f"publish {stream}",
                context=parent,
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    tracing.MESSAGING_SYSTEM: tracing.KAFKA,
                    tracing.OPERATION_TYPE: tracing.SEND,
                    tracing.OPERATION_NAME: "publish",
                    tracing.DESTINATION: stream,
                    tracing.MESSAGE_KEY: row.project_id,
                    tracing.MESSAGE_ID: row.event_id,
                    tracing.EVENT_ID: row.event_id,
                    tracing.EVENT_TYPE: row.event_type,
                    tracing.PROJECT: row.project_id,
                    tracing.SLOT: row.slot,
                },
            )
            headers.extend(tracing.carrier(tracing.span_in(span)))
        elif row.trace_context:
            # Untraced here (or its writer's trace unsampled: a span would record nothing), the
            # writer's context still goes on as it came: its trace stays one.
            headers.extend((k, v.encode()) for k, v in row.trace_context.items())

        def report(delivery: DeliveryReport) -> None:
            if self._in_flight.pop(row.event_id, None) is None:
                return  # already settled (reported after being given up as lost)
            outcome: Outcome
            if delivery.error is None:
                outcome = Published()
                if span is not None:
                    span.set_attribute(tracing.PARTITION, str(delivery.partition))
                    span.set_attribute(tracing.OFFSET, delivery.offset)
            else:
                text = delivery.describe_error()
                outcome = RowFault(text) if delivery.fault is Fault.ROW else Deferred(text)
                if span is not None:
                    span.set_status(trace.StatusCode.ERROR, text)
                self._stopped.add(row.project_id)
            if span is not None:
                span.end()
            self.outcomes[row.event_id] = outcome
            if then is not None and isinstance(outcome, Published):
                then()

        self._in_flight[row.event_id] = self._clock.monotonic()
        self._sender.produce(
            stream, row.envelope, key=row.project_id, headers=headers, on_delivery=report
        )

    def _unsampled(self, row: OutboxRow) -> bool:
        parent = row.trace_context.get(tracing.TRACEPARENT)
        return self._parent_based and parent is not None and tracing.unsampled(parent)

    def _poll_once(self, timeout: float = POLL_SLICE_S) -> None:
        self._sender.poll(timeout)
        if not self._in_flight:
            return
        now = self._clock.monotonic()
        if self._abandoned_at is None:
            oldest = next(iter(self._in_flight.values()))
            if now - oldest > self._timeout:
                log.warning(
                    "%d record(s) unacknowledged after %gs (outbox_delivery_timeout_s): treating "
                    "Kafka as unavailable and abandoning everything outstanding",
                    len(self._in_flight),
                    self._timeout,
                )
                self._abandoned_at = now
                self._sender.abandon()
        elif now - self._abandoned_at > self._timeout:
            log.error(
                "%d record(s) got no delivery report even after being abandoned; replacing the "
                "producer",
                len(self._in_flight),
            )
            for event_id in self._in_flight:
                self.outcomes[event_id] = Deferred("no delivery report after abandoning")
            self._in_flight.clear()
            self.lost_reports = True

    def _wait_all(self) -> None:
        while self._in_flight:
            self._poll_once()

    # -- after the pass --------------------------------------------------------------------------
    def _settle(self, windows: list[Window]) -> None:
        """Rows after a project's first failed row were not at fault: leave them untouched. One of
        them acknowledged would mean Kafka holds a later slot before an earlier one."""
        for window in windows:
            failed: OutboxRow | None = None
            for row in window.rows:
                outcome = self.outcomes.get(row.event_id)
                if outcome is None:
                    continue
                if failed is None:
                    if not isinstance(outcome, Published):
                        failed = row
                elif isinstance(outcome, Published):
                    self.order_violations += 1
                    log.error(
                        "order violation: project %s slot %d was acknowledged after slot %d failed",
                        window.project_id,
                        row.slot,
                        failed.slot,
                    )
                else:
                    del self.outcomes[row.event_id]
