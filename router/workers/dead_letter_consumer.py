"""The dead-letter consumer: reads ``rhumbatron-dead-letter-<env>`` (batch 5, 5 retries, 60 s
delay from ``settings.queues["dead-letter"]``) on the worker runtime and, for each dead-lettered
command:

1. writes a record in the runtime's one dead-letter store (kind ``command``, origin queue, the
   original command bytes and headers, error, attempts), idempotent on ``command_id``;
2. when the command is a task's own work — a ``change.dispatch`` (its target task) or a
   task-ready ``agent.wake`` (``cmd_<task>_ready``; see ``causal_router.commands.own_task``) — records
   that task as blocked and failed —
   ``task.blocked`` (``blockedLimit: "dead_letter"``, ``commandId``) and ``task.failed`` (the
   same ``blockedLimit`` and ``commandId``, so readers keep showing the task blocked) — as
   events appended to the **router's outbox**, with stable event ids, so a redelivered dead
   letter appends nothing new (the outbox ignores a repeated id); the router's publisher (in the
   router's consume process, and in this process too — the outbox lease lets one publish) sends
   them to the streams. Any other command — notably the router's resource-overlap and
   canonical wakes, which name the woken agent's smallest in-flight task only to place the
   command — changes no task: its letter is recorded and shown to operators, nothing more (an
   agent that missed a notification still holds its task and ends it itself).

It never re-sends a command: only the operator's retry or dismiss acts on a letter. A command the
operator retried that fails again arrives carrying ``rh.dead_letter`` = its letter's id: the
letter (then *retried*) is re-opened, audited, and the task events are written again under keys
of that retry round. A record that is not a command is recorded as a *poison* letter (dismiss
only). A record this consumer cannot process after its retries is dropped and logged loudly with
its coordinates (the worker's rule for a queue without a dead-letter queue).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from consumers.runtime.dead_letters import (
    DeadLetter,
    DeadLetterStore,
    Entry,
    LetterKind,
    LetterStatus,
    batch_letter_id,
    command_letter_id,
)
from consumers.runtime.types import Record
from consumers.subscriptions.causal_router.commands import own_task
from router.workers.model import Context, QueueHandler
from streams.clock import Clock
from streams.envelopes import Command, Draft, format_time
from streams.errors import LetterBeingRetried
from streams.headers import (
    ATTEMPTS,
    DEAD_LETTER_REASON,
    ERROR,
    ERROR_TYPE,
    OPERATOR_RETRY,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    header_int,
    header_text,
)
from streams.ids import stable_event_id
from streams.outbox.store import OutboxStore

log = logging.getLogger("rhumbatron.dead_letter_consumer")

ACTOR = "service:dead-letter-consumer"
BLOCKED_LIMIT = "dead_letter"


class DeadLetterRecorder(QueueHandler):
    name: ClassVar[str] = "dead-letter-consumer"
    check_deadline: ClassVar[bool] = False  # an expired command is exactly what arrives here
    dedupe: ClassVar[bool] = False  # idempotent through the store and the outbox instead

    def __init__(
        self, store: DeadLetterStore, outbox: OutboxStore, clock: Clock, *, default_tenant: str
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.clock = clock
        self.default_tenant = default_tenant

    def handle(self, command: Command, ctx: Context) -> str | None:
        record = ctx.record
        letter_id = command_letter_id(command.command_id)
        # Back from this letter's retry by an operator (and failed again).
        operator_retried = header_text(record.headers, OPERATOR_RETRY) == letter_id
        existing = self.store.get(letter_id)
        outcome = "recorded"
        if existing is None:
            self.store.write([self._letter(letter_id, command, record)])
        elif existing.status == LetterStatus.RETRYING:
            raise LetterBeingRetried(
                f"dead letter {letter_id} of {command.command_id} is being retried by an "
                "operator right now; this record is read again after the queue's delay"
            )
        elif existing.status == LetterStatus.RETRIED and operator_retried:
            error = header_text(record.headers, ERROR) or "?"
            self.store.transition(
                letter_id,
                to=LetterStatus.OPEN,
                frm=LetterStatus.RETRIED,
                who=ACTOR,
                why=f"failed again after the operator's retry: {error}",
                now=self.clock.now(),
            )
            outcome = "reopened"
        else:
            outcome = "duplicate"
        # Round 0 is the first dead letter; a command back from the operator's n-th retry writes
        # its task events under round n, so each round blocks the task once.
        round_no = 0
        if operator_retried:
            current = self.store.get(letter_id)
            audit = current.audit if current else []
            round_no = sum(1 for a in audit if a["action"] == LetterStatus.RETRIED)
        self._task_events(command, record, round_no)
        return outcome

    def on_undecodable(self, record: Record, error: Exception) -> bool:
        origin_topic = header_text(record.headers, ORIGIN_TOPIC) or record.topic
        origin_partition = header_int(record.headers, ORIGIN_PARTITION, record.partition)
        origin_offset = header_int(record.headers, ORIGIN_OFFSET, record.offset)
        letter = DeadLetter(
            id=batch_letter_id("commands", origin_topic, origin_partition, origin_offset, "poison"),
            kind=LetterKind.POISON,
            source_topic=origin_topic,
            source_partition=origin_partition,
            error=f"not a command: {error}",
            error_type=type(error).__name__,
            attempts=header_int(record.headers, ATTEMPTS, 1),
            created_at=format_time(self.clock.now()),
            entries=[Entry(origin_offset, record.value, record.key, list(record.headers))],
            origin_queue=header_text(record.headers, ORIGIN_QUEUE),
        )
        self.store.write([letter])
        log.warning("dead-letter queue: %s recorded as poison letter %s", error, letter.id)
        return True

    # -- the record ----------------------------------------------------------------------------
    def _letter(self, letter_id: str, command: Command, record: Record) -> DeadLetter:
        origin_queue = header_text(record.headers, ORIGIN_QUEUE)
        if origin_queue is None:
            raise ValueError(
                f"dead-letter record {record.topic}[{record.partition}]@{record.offset} of "
                f"{command.command_id} has no {ORIGIN_QUEUE} header: its origin queue is unknown"
            )
        reason = header_text(record.headers, DEAD_LETTER_REASON) or "failed"
        error = header_text(record.headers, ERROR) or "(no error recorded)"
        return DeadLetter(
            id=letter_id,
            kind=LetterKind.COMMAND,
            source_topic=header_text(record.headers, ORIGIN_TOPIC) or record.topic,
            source_partition=header_int(record.headers, ORIGIN_PARTITION, record.partition),
            error=f"{reason}: {error}",
            error_type=header_text(record.headers, ERROR_TYPE) or reason,
            attempts=header_int(record.headers, ATTEMPTS, 1),
            created_at=format_time(self.clock.now()),
            entries=[
                Entry(
                    offset=header_int(record.headers, ORIGIN_OFFSET, record.offset),
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    project_id=command.project_id,
                )
            ],
            origin_queue=origin_queue,
            command_id=command.command_id,
        )

    def _task_events(self, command: Command, record: Record, round_no: int) -> None:
        # Only a task's own work may block or fail it; a notification failing says nothing about
        # the task it names (docs/queues.md).
        if own_task(command) is None:
            return
        key = f"{command.command_id}#{round_no}"
        error = header_text(record.headers, ERROR) or "(no error recorded)"
        reason = header_text(record.headers, DEAD_LETTER_REASON) or "failed"
        # The failure carries the block's limit too: it is the same stop, and a reader that sees
        # it without (or before) the task.blocked still shows the task blocked (docs/events.md).
        failed: dict[str, Any] = {
            "reason": f"dead_letter: {reason}: {error}",
            "commandId": command.command_id,
            "blockedLimit": BLOCKED_LIMIT,
        }
        agent = command.payload.get("agentId")
        if isinstance(agent, str) and agent:
            failed["agentId"] = agent
        drafts = [
            self._draft(
                command,
                "task.blocked",
                key,
                {
                    "blockedLimit": BLOCKED_LIMIT,
                    "commandId": command.command_id,
                },
            ),
            self._draft(command, "task.failed", key, failed),
        ]
        tenant = command.payload.get("tenantId")
        with self.outbox.transaction() as unit:
            unit.append(
                command.project_id,
                drafts,
                tenant_id=tenant if isinstance(tenant, str) and tenant else self.default_tenant,
            )

    @staticmethod
    def _draft(command: Command, event_type: str, key: str, payload: dict[str, Any]) -> Draft:
        return Draft(
            event_id=stable_event_id(command.change_id, event_type, command.task_id, key),
            event_type=event_type,
            project_id=command.project_id,
            change_id=command.change_id,
            task_id=command.task_id,
            actor=ACTOR,
            payload=payload,
        )
