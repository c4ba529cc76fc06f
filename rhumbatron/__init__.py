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

Processors — subscriptions of your own, their effects applied exactly once (docs/processors.md)::

    from rhumbatron import Delivery, EffectKind, Effects, Event, Processor, RedisOp

    class TaskCounts(Processor):
        slug = "task-counts"
        consumes = frozenset({"task.completed"})
        effect_kind = EffectKind.REDIS

        def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
            return Effects(redis=[RedisOp("HINCRBY", "done", (event.project_id, 1))])

and ``rhumbatron consume --subscription your_package.module:TaskCounts``.

Events from your own service, in its own PostgreSQL transaction, through the outbox
(docs/outbox.md): ``append(conn, Draft(...), tenant_id=...)``; a refused event raises
``EnvelopeError`` (naming the field) or ``OutboxError``, and nothing of it is written. The
catalog of event types and their payload models: ``rhumbatron.catalog`` (docs/catalog.md).
"""

from __future__ import annotations

from consumers.runtime.types import BaseProcessor as Processor
from consumers.runtime.types import (
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    Phase,
    RedisOp,
    SqlStatement,
)
from rhumbatron.commands import send_command
from rhumbatron.outbox import append
from rhumbatron.workers import run_worker
from router.wiring.commands import CommandSender
from router.wiring.processors import SubscriptionSettings
from router.workers.handlers import Handlers
from router.workers.model import Context, QueueHandler
from streams.envelopes import Command, Draft, Event
from streams.errors import EnvelopeError, Fail, MoreWork, OutboxError, Retry
from streams.outbox.store import AppendResult

__all__ = [
    "AppendResult",
    "Command",
    "CommandSender",
    "Context",
    "Delivery",
    "Draft",
    "EffectKind",
    "Effects",
    "EnvelopeError",
    "Event",
    "Fail",
    "Handlers",
    "MoreWork",
    "OutRecord",
    "OutboxError",
    "Phase",
    "Processor",
    "QueueHandler",
    "RedisOp",
    "Retry",
    "SqlStatement",
    "SubscriptionSettings",
    "append",
    "run_worker",
    "send_command",
]
