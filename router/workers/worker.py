"""The command worker loop: one queue, its retry topic, a handler, and exact attempts.

A worker is a member of the queue's consumer group reading two topics: the queue
(``rhumbatron-<purpose>-<env>``) and its retry topic (``rhumbatron-<purpose>-retry-<env>``).

- A command that fails is **not** retried in place: its record goes to the retry topic with the
  next attempt number and a due time (now + the queue's retry delay), and the queue moves on, so
  one failing command never holds back the others.
- A handler's ``Retry(delay_s=...)`` goes to the retry tier at or above the wait it asks for
  (``rhumbatron-<purpose>-retry-<N>s-<env>``, WorkerPolicy.retry_wait): the worker reads every
  tier in the same group, and what follows holds for each, one delay per topic.
- The retry delay is constant per queue, so each retry partition is (nearly) in due order: the
  worker keeps the records it fetched from a retry partition in a small local buffer, pauses that
  partition while its head is not due, and runs the head when it is; the poll wait is bounded by
  the earliest due time. A record never runs before its due time; each gap between two attempts
  is at least the delay.
- After the last attempt the command goes to the dead-letter queue with ``rh.error``,
  ``rh.retry.attempts``, ``rh.origin_queue`` (and the record's coordinates) in its headers, or,
  on a queue without one, to the handler's ``on_exhausted`` (the indexer records it with the
  project's index state) or — last resort — a loud log line naming the record.

**Exact across crashes.** The records a transaction's commands send (retries, dead letters,
further deliveries) and the offsets they consumed commit in **one Kafka transaction**
(transactional id per producer lease). A crash before the commit leaves neither: its commands
are read again from the committed offsets, with the same attempt numbers, so an attempt is never
counted twice nor skipped.

**What a transaction holds.** A step polls and hands the handler chunks of ``batch`` commands (its
unit); several chunks share one transaction, which commits when it holds
``transaction_max_commands`` (at least one whole chunk), when ``transaction_max_ms`` have passed
since its first chunk, or when a poll brings nothing more: a step ends with nothing open. Its
records are produced, and its offsets sent, when it commits. When one aborts, the step ends there
and every partition of what it held and of the chunks after it is rewound, so nothing behind an
aborted record is committed before it and no due retry taken from its buffer is lost. A second
copy of a command (its id and attempt) in one step is a duplicate of the first whatever the first's
fate, so one command never starts two retry chains (after an abort, nothing counts as a copy of
what is read again); a retry or a further delivery that a transaction of the step committed
carries the next attempt, and is run when it comes back in the same step.

A handler's own side effects are at least once: the completed command ids of a transaction are
recorded in Redis (one round trip) before it commits, so a redelivery skips what completed; a
crash between the handler and that record re-runs the handler at the same attempt number. The
ledger is asked once per poll which of its commands completed already.

**Lag.** The offsets committed are past everything a partition was read through: when every
record the consumer was handed of it is settled and nothing of it waits in a buffer, the
consumer's position, which is past the transaction markers that end the producers'
transactions (they take offsets but are never delivered); otherwise the next offset after the
last record settled. A partition read on to its end after its last commit (the markers behind
a transaction that filled up) gets an offsets-only transaction, so a caught-up group reads lag 0.

**Ordered queues** (``ordered``). Each project's commands (the record key) run in arrival
order: a command waits for its project's earlier one in the step, and one that fails, or asks
for more work, is kept in the worker (``_Held``) at its next attempt and due time instead of
going to a retry topic, with its project's later commands kept behind it. The partition's offset
commits past what is kept, and the same transaction's offset metadata names each held project's
first kept record and its state (``HELD_MARK``); a worker assigned the partition reads back from
there (``_restore``): a named record and its project's later ones are kept again, anything else
below the committed offset ended already. Kept records run first in a step once due; at
``max_project_backlog`` or ``max_held_projects`` the partition pauses.

**Rebalances.** A revoke comes inside a poll, between chunks: the open transaction, whose chunks
are all settled, commits first, while this member still owns the partitions. If that fails, the
revoked partitions' records come again from the committed offsets to their next owner, and those
of the partitions it keeps are rewound here. A revoked partition's buffer is dropped (its records
come again, from the committed offset, to the next owner, which pauses on its own), and every
newly assigned partition is resumed explicitly, so nothing is left paused by an earlier owner.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Concatenate, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span

from consumers.runtime.transport import Output, Transport
from consumers.runtime.types import TP, OutRecord, Record
from router.workers import tracing
from router.workers.model import (
    REASON_EXPIRED,
    REASON_FAILED,
    REASON_UNDECODABLE,
    CommandHandler,
    Context,
    WorkerPolicy,
)
from router.workers.outgoing import (
    dead_letter_record,
    error_text,
    follow_up_records,
    next_delivery,
    pack_records,
    retry_record,
    unpack_records,
)
from router.workers.stores import ENDED, CommandLedger, WorkerMetrics
from streams import failpoints
from streams.clock import Clock
from streams.envelopes import Command, decode_command
from streams.errors import (
    CommandExpired,
    EnvelopeError,
    Fail,
    HandlersAbandoned,
    HandlerTimeout,
    MoreWork,
    Retry,
)
from streams.headers import ATTEMPT, DUE_MS, OPERATOR_RETRY, header_dict, header_int
from streams.log_context import log_fields

log = logging.getLogger("rhumbatron.worker")

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _logged_with_command(
    handle: Callable[Concatenate[Worker, Record, Command | EnvelopeError, _P], _R],
) -> Callable[Concatenate[Worker, Record, Command | EnvelopeError, _P], _R]:
    """Every record logged while one command is handled (by the worker or by its handler) names
    the queue, the record's topic, partition and offset, and the command; in a pool thread too,
    which starts with no fields of its own."""

    def handling(
        self: Worker,
        record: Record,
        command: Command | EnvelopeError,
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _R:
        with log_fields(
            queue=self.policy.purpose,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            command_id=command.command_id if isinstance(command, Command) else None,
        ):
            return handle(self, record, command, *args, **kwargs)

    return handling


@dataclass
class WorkerStats:
    records: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    transaction_failures: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "records": self.records,
            "transactions": self.transactions,
            "transaction_failures": self.transaction_failures,
            **dict(sorted(self.outcomes.items())),
        }


@dataclass
class _Settled:
    record: Record
    outcome: str
    send: list[OutRecord] = field(default_factory=list)
    done: str | None = None  # a command id that completed
    follow_ups: bytes = b""  # the follow-ups of a completed command, packed for its done mark
    chain: tuple[str, str] | None = None  # a retry chain it starts: id, first copy's place
    chain_ended: tuple[str, str] | None = None  # a retry chain ends here: id, this place

    failed: bool = False  # the handler raised (an attempt failed)
    error: BaseException | None = None  # why this attempt failed, or the record was given up
    error_text: str | None = None  # the reason its retry or dead letter carries
    spans: list[Span] = field(default_factory=list)  # its handling's, then its sends'; traced only
    held: _Held | None = None  # ordered queues: kept in the worker, not settled


@dataclass(frozen=True, slots=True)
class _Held:
    """A record of an ordered queue kept in the worker, unsettled: its project's earliest (the
    attempt it runs next and when; 0: as soon as it comes up), or one behind that."""

    record: Record
    attempt: int = 1
    due_ms: int = 0
    redelivered: bool = False  # its next run is a further delivery (MoreWork), not a retry


# The group's offset metadata of an ordered queue's partition: each held project's earliest
# record, as ``<committed offset - its offset>.<attempt>.<due ms>[m]`` (hexadecimal numbers;
# "m": a further delivery), comma-separated. What lies between it and the committed offset is
# its project's backlog if of its project, settled if not.
HELD_MARK = "held.v1:"


def _heads(held: Mapping[int, _Held]) -> dict[bytes | None, _Held]:
    """Each held project's earliest record (the project is the record's key)."""
    heads: dict[bytes | None, _Held] = {}
    for offset in sorted(held):
        heads.setdefault(held[offset].record.key, held[offset])
    return heads


def _encode_held(held: Mapping[int, _Held], committed: int) -> str:
    if not held:
        return ""
    return HELD_MARK + ",".join(
        f"{committed - h.record.offset:x}.{h.attempt}.{h.due_ms:x}{'m' if h.redelivered else ''}"
        for h in _heads(held).values()
    )


def _decode_held(metadata: str, committed: int) -> dict[int, tuple[int, int, bool]]:
    """offset -> (attempt, due ms, further delivery) of each held project's earliest record;
    ValueError for metadata that is not ours."""
    if not metadata.startswith(HELD_MARK):
        if metadata:
            raise ValueError(f"not a held-records mark: {metadata[:60]!r}")
        return {}
    out: dict[int, tuple[int, int, bool]] = {}
    for entry in metadata.removeprefix(HELD_MARK).split(","):
        delta, attempt, due = entry.split(".")
        out[committed - int(delta, 16)] = (int(attempt), int(due.rstrip("m"), 16), due[-1:] == "m")
    return out


class _Once:
    """A run in this thread, remembered: an ordered queue's later command asks for it."""

    def __init__(self, run: Callable[[], _Settled]) -> None:
        self._run: Callable[[], _Settled] | None = run
        self._result: _Settled | None = None

    def __call__(self) -> _Settled:
        if self._run is not None:
            run, self._run = self._run, None
            self._result = run()
        assert self._result is not None, "a run that raised is not asked for again"
        return self._result


@dataclass
class _Known:
    """What the ledger says of one poll's commands."""

    done: dict[str, bytes] = field(default_factory=dict)  # completed id -> packed follow-ups
    in_flight: dict[str, str] = field(default_factory=dict)  # id -> its first copy's place


# One record's handling in a step: settled already (a duplicate), running in the pool, or to run
# in this thread when its chunk is settled.
_Job = _Settled | Future[_Settled] | Callable[[], _Settled]


def _result(job: _Job) -> _Settled:
    if isinstance(job, _Settled):
        return job
    if isinstance(job, Future):
        return job.result()
    return job()


@dataclass
class _Open:
    """The transaction being filled: the chunks settled since the last commit, not yet sent."""

    records: list[Record] = field(default_factory=list)
    settled: list[_Settled] = field(default_factory=list)
    ends: dict[TP, int] = field(default_factory=dict)  # positions read through (max per chunk)
    since: float = 0.0  # monotonic time its first chunk was settled

    def spans(self) -> Iterable[Span]:
        return (span for s in self.settled for span in s.spans)


class Worker:
    def __init__(
        self,
        policy: WorkerPolicy,
        handler: CommandHandler,
        transport: Transport,
        output: Output,
        ledger: CommandLedger,
        clock: Clock,
        *,
        metrics: WorkerMetrics | None = None,
        failpoint: Callable[[str], None] = failpoints.hit,
        group: str | None = None,
    ) -> None:
        self.policy = policy
        self.handler = handler
        self.transport = transport
        self.output = output
        self.ledger = ledger
        self.clock = clock
        self.metrics = metrics
        self.failpoint = failpoint
        self.group = group  # the consumer group's id, named on the spans
        self.stats = WorkerStats()
        self._waiting: dict[TP, deque[Record]] = {}
        self._paused: set[TP] = set()
        self._fresh: set[TP] = set()
        self._committed: dict[TP, int] = {}  # the offset this member last committed, per partition
        self._ever_assigned = False
        self._open = _Open()
        # Every (command id, attempt) this step took a copy of, in the open transaction or one it
        # committed. The attempt is part of it: a retry and a further delivery carry the next
        # attempt, and one made by a transaction this step committed may come back in the step.
        self._seen: set[tuple[str, int]] = set()
        self._pool = (
            ThreadPoolExecutor(policy.max_in_flight, thread_name_prefix=f"worker-{policy.purpose}")
            if policy.max_in_flight > 1
            else None
        )
        self._abandoned: set[Future[str | None]] = set()
        self._abandoned_lock = threading.Lock()
        # Ordered queues: the records kept unsettled, per partition by offset; partitions whose
        # kept records are not read back yet (from the group's offset metadata), and those being
        # read back (committed offset, offset -> attempt, due, further delivery); partitions
        # paused at a bound; the kept records this step runs.
        self._held: dict[TP, dict[int, _Held]] = {}
        self._unrestored: set[TP] = set()
        self._restoring: dict[TP, tuple[int, dict[int, tuple[int, int, bool]]]] = {}
        self._held_paused: set[TP] = set()
        self._step_held: dict[tuple[TP, int], _Held] = {}
        self._step_last: dict[tuple[TP, bytes | None], _Job] = {}

    # -- group membership ------------------------------------------------------------------------
    def start(self) -> None:
        self.transport.subscribe(
            [self.policy.queue_topic, *self.policy.retry_topics], self._on_assign, self._on_revoke
        )

    def _on_assign(self, tps: list[TP]) -> dict[TP, int | None]:
        self._fresh.update(tps)
        for tp in tps:
            self._committed.pop(tp, None)
        if self.policy.ordered:
            self._unrestored.update(tp for tp in tps if tp.topic == self.policy.queue_topic)
        self._ever_assigned = True
        return {}  # resume from the group's committed offsets

    def _on_revoke(self, tps: list[TP]) -> None:
        # The open transaction's chunks are settled (a revoke comes inside a poll, between
        # chunks): they commit now, while this member still owns the partitions; if that fails,
        # the revoked ones come again from the committed offsets to their next owner and those
        # it keeps are read again here.
        if self._open.records and not self._commit():
            gone = set(tps)
            self._rewind(r for r in self._open_records_dropped() if r.tp not in gone)
        for tp in tps:
            self._waiting.pop(tp, None)
            self._paused.discard(tp)
            self._fresh.discard(tp)
            self._committed.pop(tp, None)
            self._held.pop(tp, None)
            self._unrestored.discard(tp)
            self._restoring.pop(tp, None)
            self._held_paused.discard(tp)

    def waiting(self) -> int:
        """Retry records fetched and held until their due time, and an ordered queue's records
        kept behind a failed attempt."""
        return sum(len(q) for q in self._waiting.values()) + sum(map(len, self._held.values()))

    def paused(self) -> set[TP]:
        return self._paused | self._held_paused

    # -- the loop --------------------------------------------------------------------------------
    def run(
        self,
        *,
        until_idle_s: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
    ) -> WorkerStats:
        """Work until ``should_stop()``, or until nothing arrived and nothing waited for
        ``until_idle_s`` (counted from the first assignment), every partition read to its end."""
        idle_since = self.clock.monotonic()
        with log_fields(queue=self.policy.purpose):  # on every record the loop logs
            while not should_stop():
                tick()
                handled = self.step()
                now = self.clock.monotonic()
                if (
                    handled
                    or self._waiting
                    or self._held
                    or not self._ever_assigned
                    or not self.transport.caught_up(self.transport.assignment())
                ):
                    idle_since = now
                elif until_idle_s is not None and now - idle_since >= until_idle_s:
                    break
        return self.stats

    def step(self) -> int:
        """Polls and settles what arrived and what came due, in chunks of ``batch``, in one
        transaction or more: the transaction is committed when it holds
        ``transaction_max_commands`` commands, when ``transaction_max_ms`` have passed since its
        first chunk, or when a poll brings nothing more. Returns the records committed."""
        committed = 0
        self._seen = set()
        timeout = self._poll_timeout()
        first = True
        try:
            while True:
                room = max(self.policy.batch, self.policy.transaction_max_commands)
                records = self.transport.poll(self._room(room - len(self._open.records)), timeout)
                timeout = 0.0  # the polls after the first take only what has arrived
                ready = self._arrived(records)
                if first:
                    # An ordered queue's kept records that are due, once the first poll has
                    # taken what a rebalance took away: before what came in.
                    ready = self._due_held() + ready
                    first = False
                done = self._settle_all(ready)
                if done < 0:
                    return committed
                committed += done
                if not records or self._full():
                    break
            held = len(self._open.records)
            if held and not self._commit():
                self._rewind(self._open_records_dropped())
                return committed
            committed += held
        except BaseException:
            self._give_up_open()
            raise
        self._commit_read_through()
        return committed

    def _arrived(self, records: list[Record]) -> list[Record]:
        if self._fresh:
            self.transport.resume(sorted(self._fresh))
            self._fresh.clear()
        if self.policy.ordered:
            records = self._restore(records)
        ready: list[Record] = []
        retry_topics = self.policy.retry_topics
        for record in records:
            if record.topic in retry_topics:
                self._waiting.setdefault(record.tp, deque()).append(record)
            else:
                ready.append(record)
        ready.extend(self._due())
        return ready

    def _full(self, coming: int = 0) -> bool:
        """Whether the open transaction must commit before ``coming`` more commands join it:
        it would pass ``transaction_max_commands``, or it is ``transaction_max_ms`` old."""
        held = len(self._open.records)
        if not held:
            return False
        if held + max(coming, 1) > self.policy.transaction_max_commands:
            return True
        return (self.clock.monotonic() - self._open.since) * 1000 >= self.policy.transaction_max_ms

    def _settle_all(self, ready: list[Record]) -> int:
        """Settles ``ready`` chunk by chunk into the open transaction, committing it first when
        it is full (``_full``) for the next chunk. Returns the records
        committed, or -1 when a commit failed: then every partition of what that transaction
        held and of the rest of ``ready`` is rewound, and the step ends."""
        # Where each partition's last record of this poll is: the chunk holding it settles
        # everything the consumer was handed of that partition.
        last = {r.tp: i for i, r in enumerate(ready)}
        decoded = [self._decode(r) for r in ready]
        jobs = self._start(ready, decoded, self._known(ready, decoded))
        committed = 0
        batch = self.policy.batch
        try:
            for start in range(0, len(ready), batch):
                chunk = ready[start : start + batch]
                held = len(self._open.records)
                if self._full(len(chunk)):
                    if not self._commit():
                        # Nothing after an aborted transaction may commit in this step: a later
                        # chunk's offsets would pass the rewound records of a partition it
                        # shares with it (read again, they would start a second retry chain),
                        # and the due retries it holds were already taken from their buffer.
                        # All of it is read again.
                        self._mark_done(self._drain(jobs[start:]))
                        self._rewind([*self._open_records_dropped(), *ready[start:]])
                        return -1
                    committed += held
                ends = self._read_through(
                    tp for tp, i in last.items() if start <= i < start + len(chunk)
                )
                self._settle(chunk, jobs[start : start + batch], ends)
        except BaseException:
            with suppress(Exception):  # the error that ended the step is the one to raise
                self._mark_done(self._drain(jobs))
            raise
        return committed

    def _start(
        self, ready: list[Record], decoded: list[Command | EnvelopeError], known: _Known
    ) -> list[_Job]:
        """One job per record of the poll, in order: a duplicate settled at once, or its run.
        With ``max_in_flight`` above 1 every run is started now, so that up to that many run at
        once across the whole poll — a slow command holds back the commit of what follows it,
        never the running of it; offsets still commit in order, only past settled records."""
        tracer = tracing.tracer()
        seen = self._seen
        jobs: list[_Job] = []
        # Ordered queues: the projects whose kept records do not run in this step, and the last
        # job of each project (per partition) in this step, which its next one waits for.
        blocked = {
            (tp, h.record.key)
            for tp, held in self._held.items()
            for h in held.values()
            if (tp, h.record.offset) not in self._step_held
        }
        last = self._step_last
        for record, command in zip(ready, decoded, strict=True):
            state = self._step_held.get((record.tp, record.offset))
            attempt = state.attempt if state is not None else _attempt(record)
            copy = (command.command_id, attempt) if isinstance(command, Command) else None
            if copy is not None and copy in seen:
                # A second copy in one step: the first copy's fate (done, retry or dead letter)
                # stands for both, so one command never starts two retry chains (nor runs twice
                # when the first completed in a transaction the step already committed).
                jobs.append(_Settled(record, "duplicate"))
                continue
            if copy is not None:
                seen.add(copy)
            if self.policy.ordered and record.topic == self.policy.queue_topic:
                project = (record.tp, record.key)
                before = last.get(project)
                if before is None and project in blocked:
                    job: _Job = _Settled(record, "held", held=_Held(record))
                else:
                    run = partial(self._after, before, record, command, known, tracer, state)
                    job = self._pool.submit(run) if self._pool is not None else _Once(run)
                last[project] = job
                jobs.append(job)
                continue
            if self._pool is not None:
                jobs.append(self._pool.submit(self._one, record, command, known, tracer))
            else:
                jobs.append(partial(self._one, record, command, known, tracer))
        return jobs

    def _after(
        self,
        before: _Job | None,
        record: Record,
        command: Command | EnvelopeError,
        known: _Known,
        tracer: trace.Tracer | None,
        state: _Held | None,
    ) -> _Settled:
        """An ordered queue's command: run once its project's command before it in this step
        settled; kept behind it (unrun) if that one is kept."""
        if before is not None and _result(before).held is not None:
            return _Settled(record, "held", held=state or _Held(record))
        return self._one(record, command, known, tracer, state)

    @staticmethod
    def _drain(jobs: list[_Job]) -> list[_Settled]:
        """Runs of a step that ends early: those not started are called off, those running are
        waited for (their records are read again, and must not run twice at once). Returns
        what they settled: the completed ones are recorded done, so that, read again, they are
        duplicates as any completion in a lost transaction is."""
        out: list[_Settled] = []
        for job in jobs:
            if isinstance(job, Future) and not job.cancel():
                with suppress(BaseException):
                    out.append(job.result())
        return out

    def _known(self, ready: list[Record], decoded: list[Command | EnvelopeError]) -> _Known:
        """What the ledger knows of these commands: which completed (with the follow-ups they
        sent), and which fresh copies belong to a retry chain already under way."""
        known = _Known()
        if not self.handler.dedupe:
            return known
        found = self.ledger.done_among(
            c.command_id
            for r, c in zip(ready, decoded, strict=True)
            if isinstance(c, Command) and (c.command_id, _attempt(r)) not in self._seen
        )
        # The record that completed, read again, sends its follow-ups again: its transaction
        # may have died after the done mark (their ids are derived: a landed one is a duplicate).
        sent = self.ledger.follow_ups_of(found) if found else {}
        known.done = {i: sent.get(i, b"") for i in found}
        queue = self.policy.queue_topic
        fresh = [
            c.command_id
            for r, c in zip(ready, decoded, strict=True)
            if isinstance(c, Command)
            and r.topic == queue
            and _attempt(r) == 1
            and c.command_id not in found
        ]
        known.in_flight = self.ledger.in_flight_among(fresh) if fresh else {}
        return known

    def _open_records_dropped(self) -> list[Record]:
        """The records of a transaction that failed (already aborted), forgotten. Read again,
        none of them may count as a second copy of itself."""
        records = self._open.records
        self._open = _Open()
        self._seen = set()
        return records

    def _give_up_open(self) -> None:
        """A step dies with its transaction open (the process is going down): nothing of it is
        committed, what completed in it is recorded, so that its redelivery finds it done, and
        its partitions are rewound."""
        held, self._open = self._open, _Open()
        tracing.end(held.spans(), committed=False)
        try:
            self._mark_done(held.settled)
        finally:
            self._rewind(held.records)

    def close(self) -> None:
        try:
            self.transport.close()
        finally:
            self.output.close()
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    # -- due times -------------------------------------------------------------------------------
    def _now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def _due(self) -> list[Record]:
        now_ms = self._now_ms()
        out: list[Record] = []
        for tp in sorted(self._waiting):
            queue = self._waiting[tp]
            while queue and header_int(queue[0].headers, DUE_MS, 0) <= now_ms:
                out.append(queue.popleft())
            if queue:
                if tp not in self._paused:
                    self.transport.pause([tp])
                    self._paused.add(tp)
            else:
                del self._waiting[tp]
                if tp in self._paused:
                    self.transport.resume([tp])
                    self._paused.discard(tp)
        return out

    # -- ordered queues: records kept in the worker ------------------------------------------------
    def _due_held(self) -> list[Record]:
        """The kept records of every project whose earliest is due, in offset order: they run
        first in this step, each project's in order, and a project's new records after them."""
        self._step_held = {}
        self._step_last = {}
        if not self._held:
            return []
        now_ms = self._now_ms()
        out: list[Record] = []
        for tp in sorted(self._held):
            if tp in self._restoring:
                continue  # its projects' kept records are not all read back yet
            held = self._held[tp]
            due = {key for key, head in _heads(held).items() if head.due_ms <= now_ms}
            for offset in sorted(held):
                if held[offset].record.key in due:
                    out.append(held[offset].record)
                    self._step_held[(tp, offset)] = held[offset]
        return out

    def _held_after(self, settled: list[_Settled]) -> dict[TP, dict[int, _Held]]:
        """What is kept once these settle: the records they kept, less those they settled."""
        after = {tp: dict(held) for tp, held in self._held.items()}
        for s in settled:
            if s.record.topic != self.policy.queue_topic:
                continue
            if s.held is not None:
                after.setdefault(s.record.tp, {})[s.record.offset] = s.held
            elif s.record.tp in after:
                after[s.record.tp].pop(s.record.offset, None)
        return {tp: held for tp, held in after.items() if held}

    def _room_in(self, tp: TP) -> int:
        """How many more records a poll may bring of ``tp`` (0: the partition is at a bound):
        neither a project's backlog past ``max_project_backlog`` nor the projects held past
        ``max_held_projects`` (their state must fit in the offset metadata)."""
        held = self._held.get(tp)
        if not held:
            return self.policy.max_held_projects
        counts = Counter(h.record.key for h in held.values())
        return max(
            0,
            min(
                self.policy.max_held_projects - len(counts),
                self.policy.max_project_backlog + 1 - max(counts.values()),
            ),
        )

    def _pause_held(self) -> None:
        """Pauses the partitions at a bound, resumes those back under it."""
        # (One being read back holds no more than was kept before: it reads on to its commit.)
        for tp in sorted((set(self._held) | self._held_paused) - self._unrestored):
            full = tp in self._held and tp not in self._restoring and self._room_in(tp) == 0
            if full and tp not in self._held_paused:
                self.transport.pause([tp])
                self._held_paused.add(tp)
                log.info(
                    "%s: %s[%d] paused: its kept records are at max_project_backlog=%d or "
                    "max_held_projects=%d",
                    self.policy.purpose,
                    tp.topic,
                    tp.partition,
                    self.policy.max_project_backlog,
                    self.policy.max_held_projects,
                )
            elif not full and tp in self._held_paused:
                self.transport.resume([tp])
                self._held_paused.discard(tp)

    def _room(self, room: int) -> int:
        """A poll's size, within what every partition not paused may still take."""
        if not self.policy.ordered:
            return room
        self._pause_held()
        free = [
            self._room_in(tp)
            for tp in self.transport.assignment()
            if tp.topic == self.policy.queue_topic
            and tp not in self._held_paused
            and tp not in self._restoring
        ]
        return max(1, min([room, *free]))

    def _restore(self, records: list[Record]) -> list[Record]:
        """Reads back the kept records of partitions newly assigned, from the group's offset
        metadata: a partition that lists some is read again from the earliest; below its
        committed offset, a listed record is kept with its state, one of a listed project after
        it is kept behind it, and any other is settled already. Returns the records to handle."""
        for tp in sorted(self._unrestored):
            try:
                mark = self.transport.committed([tp]).get(tp)
                listed = _decode_held(mark.metadata, mark.offset) if mark is not None else {}
            except ValueError as exc:
                log.warning(
                    "%s: %s[%d]: offset metadata ignored: %s",
                    self.policy.purpose,
                    tp.topic,
                    tp.partition,
                    exc,
                )
                mark, listed = None, {}
            except Exception as exc:  # the group's offsets unknown yet (an open transaction)
                log.info(
                    "%s: %s[%d]: kept records not read back yet: %s",
                    self.policy.purpose,
                    tp.topic,
                    tp.partition,
                    exc,
                )
                self._hold_back(tp, records)
                continue
            self._unrestored.discard(tp)
            if mark is not None:
                self._committed[tp] = mark.offset
            if listed and mark is not None:
                self._restoring[tp] = (mark.offset, listed)
                self._seek_back(tp, min(listed), records)
            if tp in self._held_paused:
                self.transport.resume([tp])
                self._held_paused.discard(tp)
        if not self._restoring:
            return [r for r in records if r.tp not in self._unrestored]
        out: list[Record] = []
        for record in records:
            if record.tp in self._unrestored:
                continue
            restoring = self._restoring.get(record.tp)
            if restoring is None:
                out.append(record)
                continue
            committed, listed = restoring
            if record.offset >= committed:
                del self._restoring[record.tp]
                out.append(record)
                continue
            held = self._held.setdefault(record.tp, {})
            if record.offset in listed:
                attempt, due_ms, redelivered = listed[record.offset]
                held[record.offset] = _Held(record, attempt, due_ms, redelivered)
            elif any(h.record.key == record.key for h in held.values()):
                held[record.offset] = _Held(record)
            if not held:
                del self._held[record.tp]
        for tp, (committed, _) in list(self._restoring.items()):
            position = self.transport.position(tp)
            if position is not None and position >= committed:
                del self._restoring[tp]  # read back to its commit (past markers, no record)
        return out

    def _seek_back(self, tp: TP, offset: int, records: list[Record]) -> None:
        """Reads ``tp`` again from ``offset``, dropping what this poll brought of it."""
        records[:] = [r for r in records if r.tp != tp]
        self.transport.seek(tp, offset)

    def _hold_back(self, tp: TP, records: list[Record]) -> None:
        """``tp`` waits until its kept records can be read back: paused, and what this poll
        brought of it read again."""
        mine = [r.offset for r in records if r.tp == tp]
        if mine:
            self._seek_back(tp, min(mine), records)
        if tp not in self._held_paused:
            self.transport.pause([tp])
            self._held_paused.add(tp)

    # -- offsets past the markers --------------------------------------------------------------
    def _read_through(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The consumer's position of each of these partitions none of whose records waits in a
        buffer: every record handed over of it is then in this step's chunks, and the offsets
        between the last of them and the position hold only what no reader is handed
        (transaction markers, aborted records)."""
        out: dict[TP, int] = {}
        for tp in tps:
            if tp in self._waiting or tp in self._paused:
                continue
            position = self.transport.position(tp)
            if position is not None:
                out[tp] = position
        return out

    def _commit_read_through(self) -> None:
        """After a step that settled everything it took: partitions read on since their last
        commit (to the markers behind it, or to the end) commit their position, in a
        transaction of offsets only (the offsets of this group are only ever committed in
        transactions, so they cannot overtake one another)."""
        ends = {
            tp: offset
            for tp, offset in self._read_through(sorted(self.transport.assignment())).items()
            # (a partition whose kept records are being read back is behind its commit)
            if offset > self._committed.get(tp, -1)
            and tp not in self._restoring
            and tp not in self._unrestored
        }
        if not ends:
            return
        metadata = (
            {tp: _encode_held(self._held.get(tp, {}), end) for tp, end in ends.items()}
            if self.policy.ordered
            else None
        )
        try:
            self.output.begin()
            self.output.send_offsets(ends, self.transport.group_metadata(), metadata)
            self.output.commit()
        except Exception as exc:
            self.output.abort()
            # Only lag figures wait for it: the next step tries again.
            log.info("%s: offsets past the markers not committed: %s", self.policy.purpose, exc)
            return
        self._committed.update(ends)

    def _poll_timeout(self) -> float:
        interval = self.policy.poll_interval_s
        heads = [header_int(q[0].headers, DUE_MS, 0) for q in self._waiting.values() if q]
        heads += [h.due_ms for held in self._held.values() for h in _heads(held).values()]
        if not heads:
            return interval
        return max(0.0, min(interval, (min(heads) - self._now_ms()) / 1000))

    # -- one batch -------------------------------------------------------------------------------
    def _decode(self, record: Record) -> Command | EnvelopeError:
        try:
            return decode_command(record.value, max_bytes=self.policy.max_envelope_bytes)
        except EnvelopeError as exc:
            return exc

    def _settle(self, chunk: list[Record], jobs: list[_Job], ends: dict[TP, int]) -> None:
        """Waits for the chunk's runs and adds what they settled to the open transaction.
        ``ends``: the positions of the partitions the chunk settles everything of
        (``_read_through``)."""
        held = self._open
        if not held.records:
            held.since = self.clock.monotonic()
        settled: list[_Settled] = []
        error: BaseException | None = None
        try:
            for job in jobs:
                if isinstance(job, _Settled):
                    settled.append(job)
                elif isinstance(job, Future):
                    # Every run is waited for before the first error is raised: a command that
                    # completed beside a failing one is recorded done like the others.
                    try:
                        settled.append(job.result())
                    except BaseException as exc:
                        error = error or exc
                else:
                    settled.append(job())
            if error is not None:
                raise error
        finally:
            # Held even if a later record's hook raised: what completed is recorded done
            # (``_give_up_open``) so that its redelivery finds it.
            held.records.extend(chunk)
            held.settled.extend(settled)
            for tp, end in ends.items():
                held.ends[tp] = max(held.ends.get(tp, end), end)

    def _commit(self) -> bool:
        """Commits the open transaction: the completed ids are recorded first, then its records
        and offsets go in one Kafka transaction. False when that failed (it is aborted and
        nothing of it is committed; the caller rewinds its partitions)."""
        held = self._open
        self._mark_done(held.settled)
        self._track_chains(held.settled)
        offsets: dict[TP, int] = {}
        for record in held.records:
            offsets[record.tp] = max(offsets.get(record.tp, 0), record.offset + 1)
        for tp, end in held.ends.items():
            if tp in offsets:
                offsets[tp] = max(offsets[tp], end)
        kept: dict[TP, dict[int, _Held]] = {}
        metadata: dict[TP, str] | None = None
        if self.policy.ordered:
            # Kept records settled now are behind the committed offset: it never moves back,
            # and what is kept rides in the offset metadata, in the same transaction.
            kept = self._held_after(held.settled)
            offsets = {tp: max(o, self._committed.get(tp, 0)) for tp, o in offsets.items()}
            metadata = {tp: _encode_held(kept.get(tp, {}), o) for tp, o in offsets.items()}
        try:
            self.output.begin()
            for s in held.settled:
                for out in s.send:
                    self.output.produce(out)
            self.output.send_offsets(offsets, self.transport.group_metadata(), metadata)
            self.failpoint("worker.before_transaction_commit")
            self.output.commit()
        except Exception as exc:
            self.output.abort()
            self.stats.transaction_failures += 1
            log.warning(
                "%s: the transaction of %d record(s) failed (%s); they will be read again",
                self.policy.purpose,
                len(held.records),
                exc,
            )
            tracing.end(held.spans(), committed=False)
            return False
        self._open = _Open()
        if self.policy.ordered:
            self._held = kept
            self._pause_held()
        tracing.end(held.spans(), committed=True)
        self.failpoint("worker.after_transaction_commit")
        self._committed.update(offsets)
        self.stats.transactions += 1
        self.stats.records += len(held.records)
        counts: Counter[str] = Counter(s.outcome for s in held.settled)
        counts["failed"] = sum(1 for s in held.settled if s.failed)
        self.stats.outcomes.update(counts)
        if self.metrics is not None:
            try:
                self.metrics.add(self.policy.purpose, counts)
            except Exception as exc:  # counters only; the work itself is committed
                log.warning("%s: worker counters not recorded: %s", self.policy.purpose, exc)
        return True

    def _mark_done(self, settled: list[_Settled]) -> None:
        done = [s for s in settled if s.done]
        self.ledger.mark_done(
            (s.done for s in done if s.done),
            {s.done: s.follow_ups for s in done if s.done and s.follow_ups},
        )

    def _track_chains(self, settled: list[_Settled]) -> None:
        started: dict[str, str] = {}
        ended: dict[str, str] = {}
        for s in settled:
            if s.chain is not None:
                started[s.chain[0]] = s.chain[1]
            elif s.chain_ended is not None:
                ended[s.chain_ended[0]] = s.chain_ended[1]
        if started or ended:
            self.ledger.track(started, ended)

    def _rewind(self, chunk: Iterable[Record]) -> None:
        first: dict[TP, int] = {}
        for record in chunk:
            if record.offset in self._held.get(record.tp, ()):
                continue  # kept in the worker (not read again): runs again from there
            first[record.tp] = min(first.get(record.tp, record.offset), record.offset)
        for tp, offset in first.items():
            # A retry partition's buffer holds only records after those taken from it (it is
            # taken from its head); they are fetched again after the seek.
            self._waiting.pop(tp, None)
            if tp in self._paused:
                self.transport.resume([tp])
                self._paused.discard(tp)
            self.transport.seek(tp, offset)

    # -- one record ------------------------------------------------------------------------------
    @_logged_with_command
    def _one(
        self,
        record: Record,
        command: Command | EnvelopeError,
        known: _Known,
        tracer: trace.Tracer | None,
        state: _Held | None = None,
    ) -> _Settled:
        attempt = state.attempt if state is not None else _attempt(record)
        redelivered = state.redelivered if state is not None else None
        if tracer is None:
            return self._handle(record, command, known, attempt, redelivered)
        span = tracing.process_span(tracer, record, self.policy, self.group, attempt)
        if isinstance(command, Command):
            tracing.describe(span, command)
        try:
            # Current while the handler runs: what it writes (the dead-letter consumer's task
            # events, through the outbox) goes on in this trace.
            with trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                settled = self._handle(record, command, known, attempt, redelivered)
        except BaseException as exc:
            tracing.failed(span, exc, f"{type(exc).__name__}: {exc}")
            span.end()
            raise
        settled.send, sends = tracing.settle(
            tracer, span, settled.outcome, settled.send, settled.error, settled.error_text
        )
        settled.spans = [span, *sends]
        return settled

    def _handle(
        self,
        record: Record,
        command: Command | EnvelopeError,
        known: _Known,
        attempt: int,
        redelivered: bool | None = None,
    ) -> _Settled:
        if isinstance(command, EnvelopeError):
            return self._undecodable(record, command, attempt)
        if self.handler.dedupe and command.command_id in known.done:
            packed = known.done[command.command_id]
            if packed:
                place, follow_ups = unpack_records(packed)
                if place == _place(record):  # read again: its transaction may not have landed
                    return _Settled(record, "duplicate", follow_ups)
            return _Settled(record, "duplicate")
        fresh = attempt == 1 and record.topic == self.policy.queue_topic
        # (A retry or a further delivery belongs to the chain it continues.)
        chain = known.in_flight.get(command.command_id) if fresh else None
        # A second copy while the first one's retries are under way, or after they ended: one
        # chain per command (the first copy read again after an aborted transaction is no second
        # copy); only an operator's retry of its dead letter starts another.
        if (
            chain is not None
            and chain.removeprefix(ENDED) != _place(record)
            and not (chain.startswith(ENDED) and OPERATOR_RETRY in header_dict(record.headers))
        ):
            return _Settled(record, "duplicate")
        settled = self._run(record, command, attempt, redelivered)
        if settled.outcome in ("retried", "more_work"):
            if fresh:
                settled.chain = (command.command_id, _place(record))
        elif settled.done is None or attempt > 1 or chain is not None:
            settled.chain_ended = (command.command_id, _place(record))  # done later, or given up
        return settled

    def _run(
        self, record: Record, command: Command, attempt: int, redelivered: bool | None = None
    ) -> _Settled:
        """``redelivered``: whether this is a further delivery (MoreWork), where the record
        cannot say (an ordered queue's kept record); by default, a later attempt on the queue."""
        now = self.clock.now()
        # An ordered queue's command waits for its next attempt in the worker, not on a topic.
        kept = self.policy.ordered and record.topic == self.policy.queue_topic
        ctx = Context(
            queue=self.policy.purpose,
            queues=self.policy.queues,
            attempt=attempt,
            attempts=self.policy.attempts,
            max_deliveries=self.policy.max_deliveries,
            record=record,
            now=now,
            headers=header_dict(record.headers),
            command=command,
            redelivered=(
                redelivered
                if redelivered is not None
                else attempt > 1 and record.topic == self.policy.queue_topic
            ),
        )
        if self.handler.check_deadline and command.deadline is not None and now > command.deadline:
            return self._exhausted(record, command, ctx, CommandExpired(command, now), expired=True)
        try:
            label = self._run_handler(command, ctx)
        except MoreWork:
            follow_ups = follow_up_records(self.policy, ctx.sent)
            if attempt < self.policy.max_deliveries and kept:
                more = _Held(record, attempt + 1, self._now_ms(), redelivered=True)
                return _Settled(record, "more_work", follow_ups, held=more)
            if attempt < self.policy.max_deliveries:
                again = next_delivery(self.policy, record, command, attempt + 1)
                return _Settled(record, "more_work", [again, *follow_ups])
            log.info(
                "%s: %s asked for more work on its last delivery (%d); acknowledged",
                self.policy.purpose,
                command.command_id,
                attempt,
            )
            return self._done(record, command, "more_work_last_delivery", follow_ups)
        except HandlersAbandoned:
            raise  # the worker stops: not this command's failure
        except Fail as exc:
            # Permanent: no attempt is left to spend, whatever the count says.
            settled = self._exhausted(record, command, ctx, exc, expired=False)
            settled.failed = True
            return settled
        except Exception as exc:
            if attempt < self.policy.attempts and kept:
                asked = exc.delay_s if isinstance(exc, Retry) else None
                wait_ms = int(self.policy.hold_wait(asked, ctx.remaining_s) * 1000)
                return _Settled(
                    record,
                    "retried",
                    failed=True,
                    error=exc,
                    error_text=error_text(self.policy, exc),
                    held=_Held(record, attempt + 1, self._now_ms() + wait_ms),
                )
            if attempt < self.policy.attempts:
                asked = exc.delay_s if isinstance(exc, Retry) else None
                topic, wait_s = self.policy.retry_wait(asked, ctx.remaining_s)
                retry = retry_record(
                    self.policy,
                    record,
                    command,
                    attempt + 1,
                    exc,
                    self._now_ms(),
                    topic=topic,
                    delay_s=wait_s,
                )
                text = error_text(self.policy, exc)
                return _Settled(record, "retried", [retry], failed=True, error=exc, error_text=text)
            settled = self._exhausted(record, command, ctx, exc, expired=False)
            settled.failed = True
            return settled
        return self._done(record, command, label or "ok", follow_up_records(self.policy, ctx.sent))

    def _run_handler(self, command: Command, ctx: Context) -> str | None:
        """The handler's run, bounded by ``handler_timeout_s`` where the queue sets one: past it,
        the attempt fails (HandlerTimeout) and the run is abandoned — it goes on in its thread,
        but what it sends is refused — and with ``max_abandoned_handlers`` abandoned runs still
        going, the worker stops (HandlersAbandoned) for its supervisor to start a fresh one."""
        timeout = self.policy.handler_timeout_s
        if timeout is None:
            return self.handler.handle(command, ctx)
        future: Future[str | None] = Future()
        context = contextvars.copy_context()  # the command's span and log fields, in its thread

        def run() -> None:
            try:
                future.set_result(context.run(self.handler.handle, command, ctx))
            except BaseException as exc:
                future.set_exception(exc)

        # A daemon thread of its own, not a pool's: a run that never ends must not keep the
        # process from exiting (an executor's threads are joined at exit).
        threading.Thread(target=run, name=f"handler-{command.command_id}", daemon=True).start()
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            pass
        ctx.abandoned.set()
        with self._abandoned_lock:
            self._abandoned.add(future)
            running = len(self._abandoned)
        future.add_done_callback(lambda f: self._forget_abandoned(f, command.command_id))
        log.warning(
            "%s: the handler of %s ran past handler_timeout_s=%g at attempt %d; abandoned (%d "
            "abandoned still running, at most %d)",
            self.policy.purpose,
            command.command_id,
            timeout,
            ctx.attempt,
            running,
            self.policy.max_abandoned_handlers,
        )
        if running >= self.policy.max_abandoned_handlers:
            raise HandlersAbandoned(
                f"{self.policy.purpose}: {running} handlers ran past handler_timeout_s="
                f"{timeout:g} and are still running (max_abandoned_handlers="
                f"{self.policy.max_abandoned_handlers}); the worker exits so that a fresh "
                "process takes over"
            )
        raise HandlerTimeout(f"handler ran past handler_timeout_s={timeout:g}")

    def _forget_abandoned(self, future: Future[str | None], command_id: str) -> None:
        with self._abandoned_lock:
            self._abandoned.discard(future)
        error = future.exception()
        if error is not None:
            log.warning(
                "%s: the abandoned handler of %s ended with %s: %s",
                self.policy.purpose,
                command_id,
                type(error).__name__,
                error,
            )

    def abandoned(self) -> int:
        """Timed-out handler runs still going."""
        with self._abandoned_lock:
            return len(self._abandoned)

    @staticmethod
    def _done(
        record: Record, command: Command, outcome: str, follow_ups: list[OutRecord]
    ) -> _Settled:
        """A completed command: its follow-ups go out in its transaction, and are kept with its
        done mark, written before that transaction commits."""
        return _Settled(
            record,
            outcome,
            follow_ups,
            done=command.command_id,
            follow_ups=pack_records(_place(record), follow_ups) if follow_ups else b"",
        )

    def _exhausted(
        self,
        record: Record,
        command: Command,
        ctx: Context,
        error: BaseException,
        *,
        expired: bool,
    ) -> _Settled:
        reason = REASON_EXPIRED if expired else REASON_FAILED
        # The letter's own wording (the dead-letter consumer records "<reason>: <rh.error>").
        text = f"{reason}: {error_text(self.policy, error)}"
        if self.handler.on_exhausted(command, ctx, error):
            outcome = "expired_recorded" if expired else "exhausted_recorded"
            return _Settled(record, outcome, error=error, error_text=text)
        if self.policy.dead_letter_topic is not None:
            letter = dead_letter_record(
                self.policy, record, command.project_id, ctx.attempt, error, reason
            )
            outcome = "expired" if expired else "dead_lettered"
            return _Settled(record, outcome, [letter], error=error, error_text=text)
        self._drop(record, f"command {command.command_id} ({command.command_type})", error, ctx)
        return _Settled(record, "dropped", error=error, error_text=text)

    def _undecodable(self, record: Record, error: EnvelopeError, attempt: int) -> _Settled:
        text = f"{REASON_UNDECODABLE}: {error_text(self.policy, error)}"
        if self.handler.on_undecodable(record, error):
            return _Settled(record, "undecodable_recorded", error=error, error_text=text)
        if self.policy.dead_letter_topic is not None:
            key = record.key.decode("utf-8", "replace") if record.key else ""
            letter = dead_letter_record(
                self.policy, record, key, attempt, error, REASON_UNDECODABLE
            )
            return _Settled(record, "undecodable", [letter], error=error, error_text=text)
        self._drop(record, "a record that is not a command", error, None)
        return _Settled(record, "dropped", error=error, error_text=text)

    def _drop(self, record: Record, what: str, error: BaseException, ctx: Context | None) -> None:
        attempts = f" after {ctx.attempt} attempt(s)" if ctx is not None else ""
        log.error(
            "%s: DROPPED %s at %s[%d]@%d%s (this queue has no dead-letter queue): %s: %s",
            self.policy.purpose,
            what,
            record.topic,
            record.partition,
            record.offset,
            attempts,
            type(error).__name__,
            error,
        )


def _place(record: Record) -> str:
    return f"{record.topic}:{record.partition}:{record.offset}"


def _attempt(record: Record) -> int:
    """The attempt a queue record carries (a retry's and a further delivery's count up)."""
    return header_int(record.headers, ATTEMPT, 1)
