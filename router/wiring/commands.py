"""Commands sent by services (``rhumbatron.send_command``, ``rhumbatron command send``): onto
the queue of their type in the catalog, or the one named; idempotent on ``command_id`` (a copy
sent again is a duplicate its worker skips, while the first is retrying or after it completed)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from router.settings import Settings
from router.wiring.provisioning import require_topics
from streams.envelopes import Command, build
from streams.errors import ConfigurationError
from streams.producer import Producer
from streams.topology import COMMAND_QUEUES, Topology, queue_name


def queue_of(command_type: str, queue: str | None, topology: Topology) -> str:
    """The queue a command goes to: the one named (one of ``topology``'s), else its type's in
    the catalog."""
    purpose = queue or COMMAND_QUEUES.get(command_type)
    if purpose is None:
        raise ConfigurationError(
            f"command type {command_type!r} has no queue in the catalog; name one "
            f"({', '.join(topology.queues)})"
        )
    return topology.known_queue(purpose)


def new_command(
    command_type: str,
    project_id: str,
    *,
    payload: Mapping[str, Any] | None = None,
    command_id: str | None = None,
    change_id: str | None = None,
    task_id: str | None = None,
    deadline_s: float | None = None,
    now: datetime | None = None,
) -> Command:
    """A command checked as the wire checks it (EnvelopeError names a wrong field). Without
    ``command_id``, a random one: give your own to make a re-send a duplicate."""
    now = now or datetime.now(UTC)
    return build(
        Command,
        command_id=command_id or f"cmd_{secrets.token_hex(16)}",
        command_type=command_type,
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        created_at=now,
        deadline=now + timedelta(seconds=deadline_s) if deadline_s is not None else None,
        payload=dict(payload or {}),
    )


class CommandSender:
    """One producer for many sends (idempotent, acks from every in-sync replica)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = Producer(settings.kafka_config())
        self._checked: set[str] = set()

    def send(self, command: Command, queue: str | None = None, *, flush: bool = True) -> str:
        """Sends ``command``; returns the queue's topic. With ``flush``, returns once Kafka
        acknowledged it (DeliveryFailed otherwise)."""
        topology = self.settings.topology
        topic = queue_name(queue_of(command.command_type, queue, topology), topology.env)
        if topic not in self._checked:
            require_topics(self.settings, [topic])  # NotProvisioned names what to run
            self._checked.add(topic)
        self.producer.produce_command(topic, command, max_bytes=self.settings.max_envelope_bytes)
        if flush:
            self.flush()
        return topic

    def flush(self) -> None:
        self.producer.flush(self.settings.connect_timeout_s * 3)
