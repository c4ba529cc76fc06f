"""The command worker's vocabulary: a queue's policy, the handler contract and the reasons a
command is dead-lettered for (the headers it carries are in streams.headers).

Attempts: a queue with ``retries = 3`` runs a command at most **1 + 3 = 4 times** ("3 retries,
then dead-letter", DESIGN.md §9). The attempt number travels in the ``rh.retry.attempt`` header
of the record (absent on a fresh command: attempt 1), so it survives restarts and rebalances.
A handler asking for more work (:class:`MoreWork`) spends a delivery from the same count, bounded
by ``max_command_deliveries``; its last delivery acknowledges instead of dead-lettering.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

from consumers.runtime.types import Record
from streams.envelopes import Command
from streams.topology import check_env, queue_name, retry_topic

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
    concurrency: int
    dead_letter: str | None  # purpose of the dead-letter queue, or None
    max_deliveries: int
    max_envelope_bytes: int
    poll_interval_s: float
    error_max_bytes: int
    # One transaction holds chunks of ``batch`` up to this many commands, open at most this long.
    transaction_max_commands: int
    transaction_max_ms: int

    def __post_init__(self) -> None:
        queue_name(self.purpose, check_env(self.env))  # refuses an unknown purpose, naming it
        if self.dead_letter is not None:
            queue_name(self.dead_letter, self.env)
        for name in ("batch", "concurrency", "max_deliveries", "transaction_max_commands"):
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
    def dead_letter_topic(self) -> str | None:
        return queue_name(self.dead_letter, self.env) if self.dead_letter else None


@dataclass(frozen=True)
class CommandContext:
    """What a handler learns about this delivery of its command."""

    queue: str  # the queue purpose
    attempt: int  # 1-based: the first delivery is 1
    attempts: int  # most runs on failure (1 + retries)
    max_deliveries: int
    record: Record
    now: datetime
    # First value of each name; None for a header sent without a value (Kafka allows it).
    headers: Mapping[str, bytes | None] = field(default_factory=dict)


class CommandHandler(Protocol):
    """What a team writes. ``handle`` returns an optional outcome label (counted in the worker's
    stats, e.g. ``already_running``), raises :class:`MoreWork` for another delivery, or raises
    anything else to fail this attempt."""

    name: ClassVar[str]
    check_deadline: ClassVar[bool]  # dead-letter commands past their deadline as ``expired``
    dedupe: ClassVar[bool]  # skip a command id that already completed

    def handle(self, command: Command, ctx: CommandContext) -> str | None: ...

    def on_exhausted(self, command: Command, ctx: CommandContext, error: BaseException) -> bool:
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

    def handle(self, command: Command, ctx: CommandContext) -> str | None:
        raise NotImplementedError

    def on_exhausted(self, command: Command, ctx: CommandContext, error: BaseException) -> bool:
        return False

    def on_undecodable(self, record: Record, error: Exception) -> bool:
        return False
