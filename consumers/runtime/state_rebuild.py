"""The dead-letter index and the audit logs rebuilt from the audit topic, after Redis lost them.

The audit topic (consumers/runtime/audit_records.py) holds every letter as the index first stored
it, every status change of a letter and every audit-log entry. A rebuild reads it from its start
and writes into Redis only what Redis lacks, so it is idempotent: run twice, or over a Redis that
still holds everything, it changes nothing.

- A letter Redis lacks is written as the topic has it: its last copy there, then its status
  changes in the order they were made. A change applies only onto the state it was made from
  (its ``from`` status and ``seq``, the letter's audit length then); a later change made from
  the same ``seq`` replaces it, because it was made from a Redis that never got the earlier one
  (the earlier one's Redis write failed after the topic took it).
- A letter Redis holds is kept, unless the topic's audit extends Redis's (a change the topic
  took whose Redis write failed): then Redis gets the missing changes.
- An audit log gets the entries it lacks (by ``audit_id``); entries Redis holds that the topic
  does not (written before the topic existed) are kept, oldest.

The index's marker key says the index is complete. A process that owns the dead-letter store
(the operator service) calls :func:`ensure_state` at its start: no marker and a topic holding
records means Redis came back empty, and it rebuilds, under a lock with an expiry so two
processes starting at once rebuild once (the second finds the marker; were the lock to expire
meanwhile, a second rebuild changes nothing the first wrote).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import orjson
import redis

from consumers.runtime.audit_log import MemoryAuditLog, audit_log_key
from consumers.runtime.audit_records import (
    AUDIT_ID,
    ENTRY,
    LETTER,
    TRANSITION,
    DurableAudit,
    Progress,
    Raw,
)
from consumers.runtime.dead_letters import DeadLetter, LetterStatus, MemoryDeadLetters, _score

log = logging.getLogger("rhumbatron.state_rebuild")


@dataclass
class DurableState:
    """What the audit topic says: each log's entries (oldest first) and each letter."""

    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    letters: dict[str, DeadLetter] = field(default_factory=dict)
    records: int = 0


@dataclass
class RebuildReport:
    records: int = 0
    letters_restored: int = 0
    letters_updated: int = 0
    letters_kept: int = 0
    entries_restored: int = 0
    logs: list[str] = field(default_factory=list)

    def changed(self) -> bool:
        return bool(self.letters_restored or self.letters_updated or self.entries_restored)

    def summary(self) -> str:
        return (
            f"{self.records} records read; letters: {self.letters_restored} restored, "
            f"{self.letters_updated} given their missing status changes, {self.letters_kept} "
            f"already whole; audit entries: {self.entries_restored} restored over "
            f"{len(self.logs)} logs"
        )


def read_state(records: Iterable[Raw]) -> DurableState:
    entries: dict[str, tuple[str, dict[str, Any]]] = {}
    transitions: dict[str, dict[str, Any]] = {}
    # letter id -> its writes (write id -> parts) and which write completed last
    parts: dict[str, dict[str, dict[int, bytes]]] = {}
    last_whole: dict[str, str] = {}
    count = 0
    for key, raw in records:
        count += 1
        if raw is None:  # a tombstone: that record's change did not happen
            entries.pop(key, None)
            transitions.pop(key, None)
            continue
        value = orjson.loads(raw)
        kind = value.get("kind")
        if kind == ENTRY:
            entries[key] = (value["log"], value["entry"])
        elif kind == TRANSITION:
            transitions[key] = value
        elif kind == LETTER:
            writes = parts.setdefault(value["letter"], {})
            got = writes.setdefault(value["write"], {})
            got[value["part"]] = base64.b64decode(value["data"])
            if len(got) == value["parts"]:
                last_whole[value["letter"]] = value["write"]
    state = DurableState(records=count)
    for log_name, entry in entries.values():
        state.logs.setdefault(log_name, []).append(entry)
    for letter_id, write in last_whole.items():
        got = parts[letter_id][write]
        body = b"".join(got[n] for n in sorted(got))
        state.letters[letter_id] = DeadLetter.from_json(orjson.loads(body))
    changes: dict[str, list[dict[str, Any]]] = {}
    for change in transitions.values():
        changes.setdefault(change["letter"], []).append(change)
    for letter_id, letter in state.letters.items():
        _apply(letter, changes.get(letter_id, []))
    return state


def _apply(letter: DeadLetter, changes: list[dict[str, Any]]) -> None:
    base = len(letter.audit)
    chain: list[dict[str, Any]] = []
    for change in changes:
        keep = change["seq"] - base
        if keep < 0:
            continue
        del chain[keep:]
        status = chain[-1]["to"] if chain else letter.status
        if status == change["from"]:
            chain.append(change)
    if chain:
        letter.status = LetterStatus(chain[-1]["to"])
        letter.audit = [*letter.audit, *(c["entry"] for c in chain)]


def merged_letter(held: DeadLetter | None, derived: DeadLetter) -> DeadLetter | None:
    """What the index should hold for ``derived``'s id, or None to leave ``held`` as it is."""
    if held is None:
        return derived
    n = len(held.audit)
    if n < len(derived.audit) and derived.audit[:n] == held.audit:
        return replace(held, status=derived.status, audit=derived.audit)
    return None


def merged_log(
    held_newest_first: list[dict[str, Any]], derived: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The log, newest first, with the entries of ``derived`` (oldest first) it lacks; None when
    it lacks none."""
    held_ids = {e.get(AUDIT_ID) for e in held_newest_first}
    if all(e[AUDIT_ID] in held_ids for e in derived):
        return None
    derived_ids = {e[AUDIT_ID] for e in derived}
    oldest_first = list(reversed(held_newest_first))
    merged = [
        *(e for e in oldest_first if AUDIT_ID not in e),
        *derived,
        # Appended after the topic was read: newer than all it gave.
        *(e for e in oldest_first if AUDIT_ID in e and e[AUDIT_ID] not in derived_ids),
    ]
    return list(reversed(merged))


class StateTarget(Protocol):
    def merge_letter(self, derived: DeadLetter) -> str:
        """``restored``, ``updated`` or ``kept``."""

    def merge_log(self, slug: str, derived: list[dict[str, Any]]) -> int:
        """How many entries it restored."""


def rebuild(
    audit: DurableAudit, target: StateTarget, progress: Progress | None = None
) -> RebuildReport:
    state = read_state(audit.read(progress))
    report = RebuildReport(records=state.records, logs=sorted(state.logs))
    for letter in state.letters.values():
        outcome = target.merge_letter(letter)
        if outcome == "restored":
            report.letters_restored += 1
        elif outcome == "updated":
            report.letters_updated += 1
        else:
            report.letters_kept += 1
    for slug, entries in state.logs.items():
        report.entries_restored += target.merge_log(slug, entries)
    return report


class MemoryTarget:
    """The twins': one dead-letter twin and the audit-log twins of one environment."""

    def __init__(
        self, letters: MemoryDeadLetters, log_for: Callable[[str], MemoryAuditLog]
    ) -> None:
        self.letters = letters
        self.log_for = log_for

    def merge_letter(self, derived: DeadLetter) -> str:
        held = self.letters.get(derived.id)
        new = merged_letter(held, derived)
        if new is None:
            return "kept"
        self.letters.put(new)
        return "restored" if held is None else "updated"

    def merge_log(self, slug: str, derived: list[dict[str, Any]]) -> int:
        log_ = self.log_for(slug)
        held = log_.entries(limit=2**31)
        new = merged_log(held, derived)
        if new is None:
            return 0
        log_.replace(new)
        return len(new) - len(held)


class RedisTarget:
    """Each write a check-and-set on the key it replaces, so an operator's change made while the
    rebuild runs is never overwritten: the rebuild reads again and merges again."""

    def __init__(self, client: redis.Redis[bytes], env: str) -> None:
        self.client = client
        self.env = env
        self.prefix = f"rh:{env}:{{dead-letters}}:"

    def merge_letter(self, derived: DeadLetter) -> str:
        key = self.prefix + "record:" + derived.id
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = cast(bytes | None, pipe.get(key))
                    held = DeadLetter.from_json(orjson.loads(raw)) if raw else None
                    new = merged_letter(held, derived)
                    pipe.multi()
                    if new is not None:
                        pipe.set(key, orjson.dumps(new.to_json()))
                    pipe.zadd(
                        self.prefix + "index", {derived.id: _score(derived.created_at)}, nx=True
                    )
                    pipe.execute()
                except redis.WatchError:
                    continue
                if new is None:
                    return "kept"
                return "restored" if held is None else "updated"

    def merge_log(self, slug: str, derived: list[dict[str, Any]]) -> int:
        key = audit_log_key(self.env, slug)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    found = cast(list[bytes], pipe.lrange(key, 0, -1))
                    held = [orjson.loads(raw) for raw in found]
                    new = merged_log(held, derived)
                    if new is None:
                        return 0
                    pipe.multi()
                    pipe.delete(key)
                    pipe.rpush(key, *(orjson.dumps(e) for e in new))
                    pipe.execute()
                    return len(new) - len(held)
                except redis.WatchError:
                    continue


def marker_key(env: str) -> str:
    return f"rh:{env}:{{dead-letters}}:complete"


def lock_key(env: str) -> str:
    return f"rh:{env}:{{dead-letters}}:rebuild-lock"


def rebuild_redis(
    client: redis.Redis[bytes],
    env: str,
    audit: DurableAudit,
    *,
    lock_s: float,
    progress: Progress | None = None,
    only_if_lost: bool = False,
) -> RebuildReport | None:
    """Rebuild under the lock and mark the index complete. ``only_if_lost``: only when the
    marker is missing and the topic holds records (a Redis that came back empty); None when
    nothing needed doing."""
    marker = marker_key(env)
    if only_if_lost and client.exists(marker):
        return None
    lock = client.lock(lock_key(env), timeout=lock_s, blocking_timeout=lock_s)
    held = lock.acquire()
    if not held:
        log.warning("the rebuild lock %s was held %gs; rebuilding anyway", lock_key(env), lock_s)
    try:
        if only_if_lost and client.exists(marker):
            return None
        report = None
        if not (only_if_lost and audit.is_empty()):
            report = rebuild(audit, RedisTarget(client, env), progress)
            if report.changed():
                log.warning("Redis lacked operator state; rebuilt it: %s", report.summary())
        client.set(marker, b"1")
        return report
    finally:
        if held:
            # Expired meanwhile: another process may hold it now, and keeps it.
            with contextlib.suppress(redis.exceptions.LockError):
                lock.release()
