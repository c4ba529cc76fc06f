"""Every error Rhumbatron raises, in one flat module.

    RhumbatronError                 root: catch this to catch everything of ours
    ├── EnvelopeError               an Event or Command failed validation (names field and value)
    │   └── EnvelopeTooLarge        the encoded envelope exceeds the size limit
    ├── TopologyError               a bad stream/queue name or a plan the rules refuse
    ├── Unreachable                 Kafka or Redis did not answer at the address tried
    ├── DeliveryFailed              Kafka refused or timed out records; lists each one
    ├── TransactionFailed           a Kafka transaction could not commit (aborted or fenced)
    ├── ConfigurationError          settings that cannot work together
    └── OutboxError                 the outbox refused an operation (names the row or project)
        ├── SlotConflict            a strict append was refused: the project moved past the slot
        └── PublisherLocked         another publisher holds the outbox (names its pid)

Library errors (librdkafka, redis-py) are translated at the boundary into these, with the
context a reader needs, and chained with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # envelopes imports this module; the annotation needs no runtime import
    from streams.envelopes import Event


class RhumbatronError(Exception):
    """Root of every error this project raises on purpose."""


class EnvelopeError(RhumbatronError, ValueError):
    """An envelope is invalid. ``field`` is the wire (camelCase) name, ``value`` what was there."""

    def __init__(self, kind: str, field: str, value: object, reason: str) -> None:
        self.kind = kind
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"invalid {kind}: field '{field}' = {shown}: {reason}")


class EnvelopeTooLarge(EnvelopeError):
    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            kind,
            "<envelope>",
            f"{size} bytes",
            f"envelope is {size} bytes, over the {limit}-byte limit (max_envelope_bytes)",
        )


class TopologyError(RhumbatronError, ValueError):
    pass


class ConfigurationError(RhumbatronError, ValueError):
    pass


class Unreachable(RhumbatronError, ConnectionError):
    """A server did not answer. ``service`` is 'Kafka' or 'Redis', ``address`` what we tried."""

    def __init__(self, service: str, address: str, detail: str) -> None:
        self.service = service
        self.address = address
        super().__init__(f"{service} at {address} is unreachable: {detail}")


@dataclass(frozen=True, slots=True)
class FailedRecord:
    topic: str
    key: str | None
    error: str
    retriable: bool
    fatal: bool


class DeliveryFailed(RhumbatronError):
    """Kafka did not accept some records. Nothing is dropped silently: each one is listed."""

    def __init__(self, failures: Sequence[FailedRecord]) -> None:
        self.failures = list(failures)
        first = self.failures[0] if self.failures else None
        detail = f"; first: {first.topic} key={first.key!r}: {first.error}" if first else ""
        super().__init__(f"{len(self.failures)} record(s) were not delivered{detail}")


class TransactionFailed(RhumbatronError):
    """A Kafka transaction did not commit. ``fenced`` means another instance took over the
    transactional id: this process must stop producing, not retry."""

    def __init__(
        self, transactional_id: str, detail: str, *, fenced: bool = False, abortable: bool = False
    ) -> None:
        self.transactional_id = transactional_id
        self.fenced = fenced
        self.abortable = abortable
        state = "fenced by a newer instance" if fenced else "aborted"
        super().__init__(f"transaction of '{transactional_id}' {state}: {detail}")


class OutboxError(RhumbatronError):
    """The outbox refused an operation; the message names the row, project or file concerned and
    what to do about it. Nothing was written."""


class SlotConflict(OutboxError):
    """A strict append named ``seen_slot`` but the project has moved on to ``head``. Nothing was
    written (the writer's own state change in that transaction rolled back too). ``missed`` holds
    the events on the slots after ``seen_slot`` (``missed_complete`` is False when that list was
    cut short), so the writer can merge them and decide again."""

    def __init__(
        self,
        project_id: str,
        seen_slot: int,
        head: int,
        missed: Sequence[Event] = (),
        *,
        missed_complete: bool = True,
    ) -> None:
        self.project_id = project_id
        self.seen_slot = seen_slot
        self.head = head
        self.missed = list(missed)
        self.missed_complete = missed_complete
        super().__init__(
            f"strict append to project '{project_id}' refused: the writer saw up to slot "
            f"{seen_slot} but the project is at slot {head} ({head - seen_slot} event(s) unseen); "
            "nothing was written. Merge the missed events, decide again, and append with "
            f"seen_slot={head}"
        )


class PublisherLocked(OutboxError):
    """A second publisher tried to start on an outbox that already has one."""

    def __init__(self, outbox: str, holder_pid: int | None, lock_path: str) -> None:
        self.outbox = outbox
        self.holder_pid = holder_pid
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"outbox {outbox} already has a publisher ({holder} holds {lock_path}); only one "
            "publisher may run per outbox: stop that one first, or publish a different outbox"
        )
