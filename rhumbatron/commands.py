"""Sending a command from your own service."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.settings import Settings
from router.wiring.commands import CommandSender, new_command
from streams.envelopes import Command


def send_command(
    command_type: str,
    project_id: str,
    *,
    payload: Mapping[str, Any] | None = None,
    command_id: str | None = None,
    queue: str | None = None,
    change_id: str | None = None,
    task_id: str | None = None,
    deadline_s: float | None = None,
    settings: Settings | None = None,
) -> Command:
    """Sends one command and returns it once Kafka acknowledged it. ``queue``: by default the
    queue of its type in the catalog (docs/handlers.md). Idempotent on ``command_id``: send the
    same id again (a retry of your own after a timeout) and its worker runs it once; without
    one, a random id is given. For many commands, keep one ``CommandSender``."""
    command = new_command(
        command_type,
        project_id,
        payload=payload,
        command_id=command_id,
        change_id=change_id,
        task_id=task_id,
        deadline_s=deadline_s,
    )
    CommandSender(settings or Settings()).send(command, queue)
    return command
