"""The command worker's vocabulary: a queue's policy, the handler contract and the reasons a
command is dead-lettered for (the headers it carries are in streams.headers).

Attempts: a queue with ``retries = 3`` runs a command at most **1 + 3 = 4 times** ("3 retries,
then dead-letter", docs/queues.md). The attempt number travels in the ``rh.retry.attempt`` header
of the record (absent on a fresh command: attempt 1), so it survives restarts and rebalances.
A handler asking for more work (:class:`MoreWork`) spends a delivery from the same count, bounded
by ``max_command_deliveries``; its last delivery acknowledges instead of dead-lettering.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

import redis

from consumers.runtime.types import Record
from streams.envelopes import Command
from streams.errors import TopologyError
from streams.ids import followup_command_id
from streams.topology import (
    COMMAND_QUEUES,
    QUEUE_PURPOSES,
    check_env,
    queue_name,
    retry_topic,
    unknown_queue,
)

# The rh.dead_letter_reason of a command's dead letter.
REASON_FAILED = "failed"
REASON_EXPIRED = "expired"
REASON_UNDECODABLE = "undecodable"


@dataclass(frozen=True, slots=True)
class WorkerPolicy:
    """One queue's delivery policy (settings.queues[purpose] plus the worker-wide limits)."""

    purpose: str
    env: str
    batch: int
    retries: int
    retry_delay_s: float
    max_in_flight: int
    dead_letter: str | None  # purpose of the dead-letter queue, or None
    max_deliveries: int
    max_envelope_bytes: int
    poll_interval_s: float
    error_max_bytes: int
    # One transaction holds chunks of ``batch`` up to this many commands, open at most this long.
    transaction_max_commands: int
    transaction_max_ms: int
    # Each a retry topic of its own beside the queue's (its own delay): Retry(delay_s=...).
    retry_tiers_s: tuple[int, ...] = ()
    max_retry_delay_s: float = 3600.0
    handler_timeout_s: float | None = None  # a run past it is a failed attempt
    max_abandoned_handlers: int = 4  # timed-out runs still going before the process exits
    ordered: bool = False  # each project's commands in arrival order, retries held in process
    max_project_backlog: int = 100  # per partition: a held project's later commands kept
    max_held_projects: int = 64  # per partition: projects held at once
    # The environment's queues (settings.queues): where a follow-up or a dead letter may go.
    queues: tuple[str, ...] = QUEUE_PURPOSES

    def __post_init__(self) -> None:
        queue_name(self.purpose, check_env(self.env))  # refuses a name no queue can have
        for purpose in (self.purpose, self.dead_letter):
            if purpose is not None and purpose not in self.queues:
                raise TopologyError(
                    f"unknown queue purpose {purpose!r}; known: {', '.join(self.queues)}"
                )
        for name in (
            "batch",
            "max_in_flight",
            "max_deliveries",
            "transaction_max_commands",
            "max_project_backlog",
            "max_held_projects",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"queue {self.purpose}: {name} must be at least 1")
        if self.retries < 0 or self.retry_delay_s < 0:
            raise ValueError(f"queue {self.purpose}: retries and retry delay must not be negative")

    @property
    def attempts(self) -> int:
        """Runs of one command at most: the first and its retries."""
        return 1 + self.retries

    @property
    def queue_topic(self) -> str:
        return queue_name(self.purpose, self.env)

    @property
    def retry_topic(self) -> str:
        return retry_topic(self.purpose, self.env)

    @property
    def retry_topics(self) -> tuple[str, ...]:
        """The queue's own retry topic, then one per tier."""
        return (
            self.retry_topic,
            *(retry_topic(self.purpose, self.env, t) for t in self.retry_tiers_s),
        )

    def retry_wait(self, asked_s: float | None, remaining_s: float | None) -> tuple[str, float]:
        """Where a retry goes and how long it waits there. None asked: the queue's own delay.
        Else the first tier at or above the wait asked for (a topic holds one delay, so its
        records stay in due order and a long wait never holds back a short one), among the tiers
        within ``max_retry_delay_s`` and the time left before the deadline; the longest of those
        when none is long enough; the queue's own when none fits at all."""
        own = (self.retry_topic, self.retry_delay_s)
        if asked_s is None:
            return own
        cap = (
            self.max_retry_delay_s
            if remaining_s is None
            else min(self.max_retry_delay_s, max(remaining_s, 0.0))
        )
        tiers = [
            own,
            *((retry_topic(self.purpose, self.env, t), float(t)) for t in self.retry_tiers_s),
        ]
        fitting = sorted((t for t in tiers if t[1] <= cap), key=lambda t: t[1])
        if not fitting:
            return own
        return next((t for t in fitting if t[1] >= asked_s), fitting[-1])

    def hold_wait(self, asked_s: float | None, remaining_s: float | None) -> float:
        """On an ordered queue, how long a failed attempt waits in the worker before the next:
        the queue's own delay, or the wait asked for, within ``max_retry_delay_s`` and the time
        left before the deadline (no topic holds it, so no tier rounds it up)."""
        if asked_s is None:
            return self.retry_delay_s
        cap = (
            self.max_retry_delay_s
            if remaining_s is None
            else min(self.max_retry_delay_s, max(remaining_s, 0.0))
        )
        return min(max(asked_s, 0.0), cap)

    @property
    def dead_letter_topic(self) -> str | None:
        return queue_name(self.dead_letter, self.env) if self.dead_letter else None


@dataclass(frozen=True)
class Context:
    """What a handler learns about this delivery of its command (``handler(command, ctx)``)."""

    queue: str  # the queue purpose
    attempt: int  # 1-based: the first delivery is 1
    attempts: int  # most runs on failure (1 + retries)
    max_deliveries: int
    record: Record
    now: datetime
    # First value of each name; None for a header sent without a value (Kafka allows it).
    headers: Mapping[str, bytes | None] = field(default_factory=dict)
    command: Command | None = None  # the command delivered (None for a record that is none)
    redelivered: bool = False  # a further delivery, asked for with MoreWork (not a retry)
    # The follow-up commands this run sent (ctx.send), as (queue purpose, command).
    sent: list[tuple[str, Command]] = field(default_factory=list)
    # Set when the worker stopped waiting for this run (its handler timed out): a send then is
    # refused, since the outcome it would have ridden with was settled without it.
    abandoned: threading.Event = field(default_factory=threading.Event)
    # The environment's queues (WorkerPolicy.queues): those ctx.send may send to.
    queues: tuple[str, ...] = QUEUE_PURPOSES

    def send(self, command: Command, queue: str | None = None) -> Command:
        """Sends a follow-up command with this run's outcome: it goes out in the same Kafka
        transaction as the outcome, only if this run is done (or asks for more work), and is
        neither lost nor doubled by a crash. Its id is replaced by one derived from this
        command, this attempt and the follow-up's position (so a re-run sends the same ids);
        ``queue``: by default the queue of its type in the catalog. Returns the command as
        sent."""
        if self.command is None:
            raise RuntimeError("ctx.send: no command is being handled")
        if self.abandoned.is_set():
            raise RuntimeError(
                f"ctx.send refused: the handler of {self.command_id} ran past the queue's "
                "handler_timeout_s and its attempt was settled without it"
            )
        purpose = queue or COMMAND_QUEUES.get(command.command_type)
        if purpose is None:
            raise ValueError(
                f"ctx.send: {command.command_type!r} has no queue in the catalog; name one "
                "with queue=..."
            )
        if purpose not in self.queues:
            raise ValueError(f"ctx.send: {unknown_queue(purpose, self.queues)}")
        follow_up = command.model_copy(
            update={
                "command_id": followup_command_id(self.command_id, self.attempt, len(self.sent)),
                "attempt": 1,
            }
        )
        self.sent.append((purpose, follow_up))
        return follow_up

    @property
    def max_attempts(self) -> int:
        """The most times this command runs when it keeps failing (1 + the queue's retries)."""
        return self.attempts

    @property
    def command_id(self) -> str:
        return self.command.command_id if self.command is not None else ""

    @property
    def deadline(self) -> datetime | None:
        return self.command.deadline if self.command is not None else None

    @property
    def remaining_s(self) -> float | None:
        """Seconds left before the command's deadline (None: it has none)."""
        deadline = self.deadline
        return None if deadline is None else (deadline - self.now).total_seconds()

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context the command was sent with, to carry on in your own spans."""
        value = self.headers.get("traceparent")
        return value.decode("ascii", "replace") if value else None


class CommandHandler(Protocol):
    """A handler as the worker runs it (a team's function is wrapped into one:
    router.workers.handlers). ``handle`` returns an optional outcome label (counted in the
    worker's stats, e.g. ``already_running``), raises :class:`MoreWork` for another delivery,
    :class:`Retry` for a failed attempt retried after a wait, :class:`Fail` for a permanent
    failure, or anything else to fail this attempt."""

    name: ClassVar[str]
    check_deadline: ClassVar[bool]  # dead-letter commands past their deadline as ``expired``
    dedupe: ClassVar[bool]  # skip a command id that already completed

    def setup(self, queue: str, env: str, client: redis.Redis[bytes]) -> None:
        """Called once before the worker joins its queue's group."""

    def handle(self, command: Command, ctx: Context) -> str | None: ...

    def on_exhausted(self, command: Command, ctx: Context, error: BaseException) -> bool:
        """The last attempt failed (or the command expired). True: the handler recorded it (no
        dead letter); False: the worker dead-letters it, or on a queue without one, logs and
        drops it."""

    def on_undecodable(self, record: Record, error: Exception) -> bool:
        """A record that is not a Command. True: the handler recorded it; False as above."""


class QueueHandler:
    """Defaults for :class:`CommandHandler`: deadline checked, dedupe on, nothing recorded."""

    name: ClassVar[str] = "handler"
    check_deadline: ClassVar[bool] = True
    dedupe: ClassVar[bool] = True

    def setup(self, queue: str, env: str, client: redis.Redis[bytes]) -> None:
        """Called once before the worker joins its queue's group: the queue it serves, the
        environment, and the worker's Redis connection (the drills count their runs there)."""

    def handle(self, command: Command, ctx: Context) -> str | None:
        raise NotImplementedError

    def on_exhausted(self, command: Command, ctx: Context, error: BaseException) -> bool:
        return False

    def on_undecodable(self, record: Record, error: Exception) -> bool:
        return False
