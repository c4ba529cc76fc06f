"""Testing your handlers without a broker: build a command and the context a worker would hand
it, and run the handler as the worker runs it (a function, async or not, a ``Handlers``
registry or a ``QueueHandler``). Outcomes come out as they would reach the worker: a return
means done, ``Retry``, ``Fail`` and ``MoreWork`` are raised."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from consumers.runtime.types import Record
from router.wiring.commands import new_command
from router.workers.handlers import as_handler
from router.workers.model import Context
from streams.envelopes import Command, encode
from streams.topology import QUEUE_PURPOSES


def command(
    command_type: str,
    *,
    command_id: str = "cmd_test",
    project_id: str = "project-1",
    change_id: str = "change-1",
    task_id: str = "task-1",
    payload: dict[str, Any] | None = None,
    deadline_s: float | None = 3600.0,
    now: datetime | None = None,
) -> Command:
    """A valid command (checked as the wire checks it)."""
    return new_command(
        command_type,
        project_id,
        payload=payload,
        command_id=command_id,
        change_id=change_id,
        task_id=task_id,
        deadline_s=deadline_s,
        now=now,
    )


def context(
    cmd: Command,
    *,
    queue: str,
    attempt: int = 1,
    max_attempts: int = 4,
    max_deliveries: int = 4,
    now: datetime | None = None,
    queues: Sequence[str] | None = None,
) -> Context:
    """The context of one delivery of ``cmd`` on ``queue``; ``ctx.send`` takes ``queues`` (by
    default the built-in ones and ``queue``), as a worker's takes the settings' queues."""
    record = Record(
        topic=f"rhumbatron-{queue}-test",
        partition=0,
        offset=0,
        key=cmd.project_id.encode(),
        value=encode(cmd, max_bytes=1 << 20),
        headers=(),
    )
    return Context(
        queue=queue,
        attempt=attempt,
        attempts=max_attempts,
        max_deliveries=max_deliveries,
        record=record,
        now=now or datetime.now(UTC),
        command=cmd,
        queues=tuple(dict.fromkeys([*(QUEUE_PURPOSES if queues is None else queues), queue])),
    )


def run(handler: object, cmd: Command, ctx: Context) -> None:
    """Runs ``handler`` on one delivery, as the worker would."""
    as_handler(handler, getattr(handler, "__qualname__", repr(handler))).handle(cmd, ctx)
