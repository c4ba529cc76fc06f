"""``acme-notify``: the handler of ``alert.notify`` commands (``acme-failure-alerts``' queue),
the one place the alerting service is called.

A worker runs a handler at least once: a crash between the call and the worker's commit runs it
again, with the same command. So the call passes ``ctx.command_id`` as the service's idempotency
key, and the service answers a key it has seen without sending the alert a second time.
"""

from __future__ import annotations

from acme_processors.service import AlertService, ServiceUnavailable
from rhumbatron import Command, Context, Fail, Retry


def notify(command: Command, ctx: Context) -> None:
    text = command.payload.get("text")
    if not isinstance(text, str) or not text:
        raise Fail(f"{command.command_type} {command.command_id} has no text to send")
    try:
        AlertService.from_environment().send(
            idempotency_key=ctx.command_id,
            project=command.project_id,
            task=command.task_id,
            text=text,
        )
    except ServiceUnavailable as exc:
        # Tried again after the queue's retry delay; dead-lettered when its retries run out.
        raise Retry(reason=str(exc)) from exc
