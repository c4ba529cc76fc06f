"""``acme-failure-alerts``: an alert for each failed task, sent by a service outside every
transaction the runtime can make (a chat, a pager). The processor does not call it: it emits a
command ``alert.notify`` onto the team's own queue (``[queues.notifications]``), as a Kafka
effect, and the handler ``acme-notify`` (:mod:`acme_processors.notify`) makes the call, with the
worker's retries and dead letters.

The command's id is ``"cmd_" + delivery.idempotency_key("alert")``: a crash retry of the event
makes the same command (the worker skips the copy as a duplicate, the service sees the same
idempotency key), and an operator's ``reprocess-from`` makes a new one, which is sent again.
Its time is the event's, so every try of an event builds the very same record.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rhumbatron import Delivery, EffectKind, Effects, Event, Processor, SubscriptionSettings

COMMAND_TYPE = "alert.notify"


class AlertOptions(BaseModel):
    """``[subscriptions.acme-failure-alerts]``'s own keys."""

    model_config = ConfigDict(extra="forbid")

    queue: str = Field("notifications", description="the queue acme-notify's workers read")


class FailureAlerts(Processor):
    slug: ClassVar[str] = "acme-failure-alerts"
    consumes: ClassVar[frozenset[str] | None] = frozenset({"task.failed"})
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

    # A constructor taking the settings makes the class its own factory.
    def __init__(self, settings: SubscriptionSettings) -> None:
        self.settings = settings
        self.queue = settings.options(AlertOptions).queue
        # One command built now: a queue the settings do not have is refused when the member
        # starts, naming the queues they have, instead of failing every task.failed.
        settings.command_record(
            COMMAND_TYPE, "acme", command_id="cmd_check", now=datetime.now(UTC), queue=self.queue
        )

    def validate(self, event: Event) -> None:
        if event.task_id is None:
            raise ValueError(f"task.failed {event.event_id} names no task")

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        reason = str(event.payload.get("reason", "no reason given"))
        command = self.settings.command_record(
            COMMAND_TYPE,
            event.project_id,
            command_id="cmd_" + delivery.idempotency_key("alert"),
            task_id=event.task_id,
            change_id=event.change_id,
            payload={
                "text": f"task {event.task_id} of {event.project_id} failed: {reason}",
                "eventId": event.event_id,
            },
            queue=self.queue,
            now=event.timestamp,
        )
        return Effects(records=[command])
