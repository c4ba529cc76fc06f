"""What the causal router put on its command queues: for the demo and for operators.

Reads the queues the router writes to (agent-wakeups, integration, indexing) from the beginning
to their current end as a ``read_committed`` reader (consumers.topic_reader) — so a command of an
aborted transaction is never counted, and a transaction still open when the read starts (a router
killed mid-transaction) is waited out — and returns the commands, or their count by type.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Message

from consumers.subscriptions.causal_router.commands import queues
from consumers.topic_reader import read_committed
from router.settings import Settings
from streams.envelopes import Command, decode_command
from streams.errors import EnvelopeError


@dataclass
class QueueContents:
    commands: list[Command] = field(default_factory=list)
    undecodable: int = 0  # records on the queues that are not Command envelopes

    def by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(c.command_type for c in self.commands).items()))

    def repeated_ids(self) -> dict[str, int]:
        """Command ids seen more than once (each id should appear once)."""
        counts = Counter(c.command_id for c in self.commands)
        return {i: n for i, n in sorted(counts.items()) if n > 1}


def read_commands(settings: Settings, *, timeout_s: float | None = None) -> QueueContents:
    """Every committed command on the router's queues of ``settings.env``, up to the queues' end
    when called. Raises TransactionsOpen or Unreachable if that end cannot be read in time
    (default: the transaction timeout plus ``flush_timeout_s``: a transaction still open when
    this starts is committed or aborted by then, and its last records flushed)."""
    if timeout_s is None:
        timeout_s = settings.transaction_timeout_ms / 1000 + settings.flush_timeout_s
    contents = QueueContents()

    def visit(message: Message) -> None:
        try:
            contents.commands.append(
                decode_command(message.value(), max_bytes=settings.max_envelope_bytes)
            )
        except EnvelopeError:
            contents.undecodable += 1

    read_committed(settings.kafka_config(), queues(settings.env), visit, timeout_s=timeout_s)
    return contents


def commands_by_type(settings: Settings, *, timeout_s: float | None = None) -> dict[str, int]:
    """``{command_type: n}`` of the committed commands on the router's queues."""
    return read_commands(settings, timeout_s=timeout_s).by_type()
