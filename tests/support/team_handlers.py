"""A team's handler as ``rhumbatron worker --handler tests.support.team_handlers:handlers``
loads it, for the real-broker tests: a done command, a Retry with a delay, and a Fail. Each run
is one line in ``$TEAM_JOURNAL``."""

from __future__ import annotations

import json
import os

from rhumbatron import Command, Context, Fail, Handlers, Retry

handlers = Handlers()


def _note(command: Command, ctx: Context) -> None:
    with open(os.environ["TEAM_JOURNAL"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"id": command.command_id, "attempt": ctx.attempt}) + "\n")


@handlers.command("agent.wake")
def wake(command: Command, ctx: Context) -> None:
    _note(command, ctx)
    mode = command.payload.get("mode")
    if mode == "fail":
        raise Fail(f"agent of {command.task_id} is gone")
    if mode == "later" and ctx.attempt == 1:
        raise Retry(delay_s=2, reason="agent busy")
