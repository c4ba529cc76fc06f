"""Rhumbatron's public surface: what your own code imports. Everything under ``router``,
``consumers`` and ``streams`` is internal and may move between releases; these names will not.

Handlers — your services doing the work commands ask for (docs/handlers.md)::

    from rhumbatron import Command, Context, Fail, Handlers, Retry

    handlers = Handlers()

    @handlers.command("index.build")
    def build(command: Command, ctx: Context) -> None:
        if ctx.attempt == 1 and not ready(command.project_id):
            raise Retry(delay_s=60, reason="index not ready")
        ...

and ``rhumbatron worker --queue indexing --handler your_package.module:handlers``.

Commands from your own service: ``send_command("index.build", "acme-web", command_id=...)``.
"""

from __future__ import annotations

from rhumbatron.commands import send_command
from rhumbatron.workers import run_worker
from router.wiring.commands import CommandSender
from router.workers.handlers import Handlers
from router.workers.model import Context, QueueHandler
from streams.envelopes import Command
from streams.errors import Fail, MoreWork, Retry

__all__ = [
    "Command",
    "CommandSender",
    "Context",
    "Fail",
    "Handlers",
    "MoreWork",
    "QueueHandler",
    "Retry",
    "run_worker",
    "send_command",
]
