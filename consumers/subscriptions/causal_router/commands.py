"""The causal router's commands: which queue each goes to, how its id is made, its record.

Ids are stable, derived from what caused the command, so a redelivered or retried
event can only re-emit the same id:

- a rule's command: ``derived_command_id(cause event id, command type, target)`` — the target is
  the task (``change.dispatch``), the agent (``agent.wake``), the candidate
  (``candidate.create``) or the generation (``index.build``) — with ``_r<revision>`` appended when
  the delivery's cursor revision is above 0 (a ``reprocess_from`` re-run: new ids, so the work
  really runs again; a crash retry at the same revision still gets the same ids). Payloads, and
  so workflow instance ids (the candidate id), do not change with the revision;
- a task-ready wake (sent by the integration worker when it starts a task, not by the router):
  ``cmd_<task>_ready`` (:func:`task_ready_command_id`);
- a maintenance command: ``derived_command_id("maintenance-<day>", type, "<project>:<last fact
  seq>")`` — one per project, type and day, and a different id only if the tick found more work.

A command is valid for ``command_ttl_s`` from its creation (its ``deadline``); a worker dead-letters
one that arrives later as ``expired``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from consumers.runtime.types import OutRecord
from streams.envelopes import Command, build, encode
from streams.ids import derived_command_id
from streams.producer import command_headers
from streams.topology import COMMAND_QUEUES, queue_name

AGENT_WAKE = "agent.wake"
CHANGE_DISPATCH = "change.dispatch"
CANDIDATE_CREATE = "candidate.create"
INDEX_BUILD = "index.build"
FORKS_SWEEP = "forks.sweep"
PROJECT_CLEANUP = "project.cleanup"
INDEX_PURGE = "index.purge"

# The queue purpose of every command the router sends (the catalog's, streams.topology).
QUEUES: dict[str, str] = {
    t: COMMAND_QUEUES[t]
    for t in (
        AGENT_WAKE,
        CHANGE_DISPATCH,
        CANDIDATE_CREATE,
        FORKS_SWEEP,
        PROJECT_CLEANUP,
        INDEX_BUILD,
        INDEX_PURGE,
    )
}


def queues(env: str) -> list[str]:
    """The queues the router writes to, in an environment."""
    return sorted({queue_name(purpose, env) for purpose in QUEUES.values()})


@dataclass(frozen=True, slots=True)
class Planned:
    """A command a rule decided, before it is admitted by the budget and built."""

    command_type: str
    target: str
    change_id: str | None
    task_id: str | None
    payload: dict[str, Any]


def rule_command_id(
    cause_event_id: str, command_type: str, target: str, cursor_revision: int = 0
) -> str:
    """At cursor revision 0, exactly the derived id; at a higher revision (after an operator's
    ``reprocess_from``) the id ends in ``_r<revision>``: a re-run that kept the ids would be
    dropped by the workers' dedupe on ``command_id`` and re-run nothing."""
    if cursor_revision < 0:
        raise ValueError(f"cursor revision must be >= 0, got {cursor_revision}")
    base = derived_command_id(cause_event_id, command_type, target)
    return f"{base}_r{cursor_revision}" if cursor_revision else base


def task_ready_command_id(task_id: str) -> str:
    return f"cmd_{task_id}_ready"


def own_task(command: Command) -> str | None:
    """The task whose own work ``command`` is, or None. Only such a command may block or fail a
    task when it is dead-lettered: a ``change.dispatch`` (its target task) and a task-ready
    ``agent.wake`` (``cmd_<task>_ready``). The router's resource-overlap and canonical wakes name
    the woken agent's smallest in-flight task only to place the command; their ids are derived
    from the causing event (``cmd_evt_…_agent.wake_<agent>``), never ``cmd_<task>_ready``."""
    if command.change_id is None or command.task_id is None:
        return None
    if command.command_type == CHANGE_DISPATCH:
        return command.task_id
    if command.command_type == AGENT_WAKE and command.command_id == task_ready_command_id(
        command.task_id
    ):
        return command.task_id
    return None


def maintenance_command_id(day: str, command_type: str, project_id: str, last_seq: int) -> str:
    return derived_command_id(f"maintenance-{day}", command_type, f"{project_id}:{last_seq}")


def make_command(
    *,
    command_id: str,
    command_type: str,
    project_id: str,
    change_id: str | None,
    task_id: str | None,
    payload: dict[str, Any],
    now: datetime,
    ttl_s: float,
) -> Command:
    if command_type not in QUEUES:
        raise ValueError(f"the router sends no {command_type!r} command; known: {sorted(QUEUES)}")
    return build(
        Command,
        command_id=command_id,
        command_type=command_type,
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        created_at=now,
        deadline=now + timedelta(seconds=ttl_s),
        payload=payload,
    )


def queue_of(command: Command, env: str) -> str:
    return queue_name(QUEUES[command.command_type], env)


def command_record(command: Command, *, env: str, max_bytes: int) -> OutRecord:
    """The record on the command's queue: key = project id (a project's commands stay in order on
    one partition), record id = command id."""
    return OutRecord(
        topic=queue_of(command, env),
        key=command.project_id,
        value=encode(command, max_bytes=max_bytes),
        record_id=command.command_id,
        headers=tuple(command_headers(command)),
    )
