"""Event and command ids.

Two kinds of event id, both ``evt_`` + 32 lowercase hex characters:

- **stable** (:func:`stable_event_id`): the first 16 bytes of SHA-256 over the change id, the
  event type, the task id and an optional key, for facts a retried step may write again (the
  outbox ignores the repeat). Each field is length-prefixed, so fields cannot run together:
  ``("ab", "c")`` and ``("a", "bc")`` hash differently, and ``None`` differs from ``""``.
- **random** (:func:`new_event_id`): for project-wide facts with no natural key, generated once
  inside the writer's transaction (two ``canonical.advanced`` events must not collide).

Command ids are stable too, derived from what caused them, so a redelivered event
can only ever re-emit the same command id.
"""

from __future__ import annotations

import hashlib
import re
import secrets

EVENT_ID_PREFIX = "evt_"


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\xff"  # absent: a byte no length prefix can start with
    raw = value.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


def stable_event_id(
    change_id: str | None, event_type: str, task_id: str | None, key: str | None = None
) -> str:
    digest = hashlib.sha256()
    for part in (change_id, event_type, task_id, key):
        digest.update(_field(part))
    return EVENT_ID_PREFIX + digest.digest()[:16].hex()


def new_event_id() -> str:
    return EVENT_ID_PREFIX + secrets.token_bytes(16).hex()


def derived_command_id(cause: str, command_type: str, target: str | None = None) -> str:
    """A router decision's command id: the causing event id, the command type and the target,
    so the same cause can only produce the same command."""
    parts = [cause, command_type] + ([target] if target else [])
    return "cmd_" + "_".join(_id_safe(part) for part in parts)


def followup_command_id(parent: str, attempt: int, index: int) -> str:
    """The id of the ``index``-th follow-up command a handler sent (``ctx.send``) while running
    attempt ``attempt`` of ``parent``: the same run sends the same ids, so a re-send after a
    crash is a duplicate its worker skips."""
    base = parent.removeprefix("cmd_")
    readable = f"cmd_{base}.a{attempt}.f{index}"
    if len(readable) <= 204:  # the envelope's id grammar: cmd_ and at most 200 characters
        return readable
    digest = hashlib.sha256(f"{parent}\0{attempt}\0{index}".encode()).hexdigest()[:32]
    return f"cmd_h{digest}"


def _id_safe(part: str) -> str:
    if _SAFE.fullmatch(part) and len(part) <= 64:
        return part
    return "h" + hashlib.sha256(part.encode()).hexdigest()[:24]


_SAFE = re.compile(r"[A-Za-z0-9_.:\-]+")
