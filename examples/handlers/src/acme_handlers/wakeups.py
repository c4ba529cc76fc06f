"""The agent-wakeups queue's handler: one async function."""

from __future__ import annotations

import asyncio

from acme_handlers.journal import record
from rhumbatron import Command, Context


async def wake(command: Command, ctx: Context) -> None:
    await asyncio.sleep(0)  # the team's own async client would be called here
    record(
        queue=ctx.queue, command=command.command_id, type=command.command_type, attempt=ctx.attempt
    )
