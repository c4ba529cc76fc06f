"""The integration queue's handlers: several command types on one queue."""

from __future__ import annotations

from acme_handlers.journal import record
from rhumbatron import Command, Context, Fail, Handlers, Retry

handlers = Handlers()


@handlers.command("change.dispatch")
def dispatch(command: Command, ctx: Context) -> None:
    record(
        queue=ctx.queue, command=command.command_id, type=command.command_type, attempt=ctx.attempt
    )


@handlers.command("candidate.create")
def create_candidate(command: Command, ctx: Context) -> None:
    if command.payload.get("impossible"):
        raise Fail(f"candidate of {command.change_id} cannot be composed")
    if command.payload.get("wait_first") and ctx.attempt == 1:
        # The change is not ready yet: try again after a second (the queue's lowest tier).
        raise Retry(delay_s=1, reason="change not ready")
    record(
        queue=ctx.queue, command=command.command_id, type=command.command_type, attempt=ctx.attempt
    )
