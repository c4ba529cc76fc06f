"""The router's daily maintenance tick (04:17 UTC by default): re-queue bounded integration work.

What "the state calls for" means, per project, from the router's fold:

- ``forks.sweep`` (integration): changes **finished** (a candidate of theirs was promoted) that no
  tick has swept yet — their agents' forks can go. Payload ``{"changeIds": [...], "complete"}``.
- ``project.cleanup`` (integration): candidates **retired** (stale or rejected) that no tick has
  cleaned up yet — their composed workspaces can go. Payload ``{"candidateIds": [...],
  "complete"}``.
- ``index.purge`` (indexing): the canonical generation moved past 1 and past the generation the
  last purge kept — indexes of older generations can go. Payload ``{"keepGeneration": G}``.

The fold numbers finished changes and retired candidates (``finishedSeq``, ``retiredSeq``); the
tick remembers, per project and command type, the last number it handled (its *marks*, in Redis).
So a fact is handled by the first tick after it entered the fold, however late its event was
processed, and never twice. ``complete`` is false when the fold's bounded history already dropped
some unhandled facts: then the worker should sweep the whole project.

Bounded: at most ``cap`` commands per tick, the work whose oldest unhandled fact is oldest first
(ties by project, then type); the rest keeps its marks and goes with the next tick.

Ids: one per (day, type, project, last fact handled) — a tick repeated the same day (a crash after
sending, before the marks were saved) sends the same ids, which the workers drop as duplicates;
if it found more work meanwhile, the id differs, and both commands are harmless work.

:func:`maintenance_commands` is the pure decision; :class:`MaintenanceTick` runs it when due, in
one router process a day (a Redis lock), sends the commands through a plain idempotent producer and
then saves the marks. A plain producer, not the runner's transaction: the tick consumes no offsets
to commit with the commands, and it runs on its own thread, apart from the consume loop's
transactional producer. The guarantee is at least once, deduplicated by command id.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time
from typing import Any

import orjson
import redis

from consumers.redis_conn import is_cluster
from consumers.runtime.types import JSON
from consumers.subscriptions.causal_router.commands import (
    FORKS_SWEEP,
    INDEX_PURGE,
    PROJECT_CLEANUP,
    maintenance_command_id,
    make_command,
)
from streams.clock import Clock
from streams.envelopes import Command

log = logging.getLogger("rhumbatron.causal_router.maintenance")


def mark_key(project_id: str, command_type: str) -> str:
    return f"{project_id}\x1f{command_type}"


@dataclass(frozen=True, slots=True)
class MaintenancePlan:
    commands: list[Command]
    marks: dict[str, int]  # mark_key -> last fact handled, with these commands sent
    deferred: int  # work found but left for the next tick (the cap)


@dataclass(frozen=True, slots=True)
class _Work:
    oldest_ms: int
    project_id: str
    command_type: str
    last_seq: int
    payload: dict[str, object]


def _facts_work(
    project_id: str, command_type: str, facts: list[list[Any]], mark: int, name: str
) -> _Work | None:
    """Work over the [seq, ms, id] facts numbered above ``mark``."""
    pending = [f for f in facts if int(f[0]) > mark]
    if not pending:
        return None
    seqs = [int(f[0]) for f in pending]
    return _Work(
        oldest_ms=min(int(f[1]) for f in pending),
        project_id=project_id,
        command_type=command_type,
        last_seq=max(seqs),
        payload={name: sorted(str(f[2]) for f in pending), "complete": min(seqs) == mark + 1},
    )


def _project_work(project_id: str, state: JSON, marks: Mapping[str, int]) -> list[_Work]:
    work: list[_Work] = []
    for command_type, facts, name in (
        (FORKS_SWEEP, state.get("finished", []), "changeIds"),
        (PROJECT_CLEANUP, state.get("retired", []), "candidateIds"),
    ):
        found = _facts_work(
            project_id, command_type, facts, marks.get(mark_key(project_id, command_type), 0), name
        )
        if found is not None:
            work.append(found)
    generation = int(state.get("generation", 0))
    purged = marks.get(mark_key(project_id, INDEX_PURGE), 0)
    if generation > max(purged, 1):
        work.append(
            _Work(
                oldest_ms=int(state.get("generationAt") or 0),
                project_id=project_id,
                command_type=INDEX_PURGE,
                last_seq=generation,
                payload={"keepGeneration": generation},
            )
        )
    return work


def maintenance_commands(
    states: Mapping[str, JSON],
    now: datetime,
    last_tick: Mapping[str, int],
    *,
    cap: int,
    ttl_s: float,
) -> MaintenancePlan:
    """The commands a tick at ``now`` sends, given every project's fold (``states``) and the marks
    the previous ticks left (``last_tick``); pure and deterministic."""
    work = sorted(
        (w for project, state in states.items() for w in _project_work(project, state, last_tick)),
        key=lambda w: (w.oldest_ms, w.project_id, w.command_type),
    )
    chosen, deferred = work[:cap], len(work) - min(len(work), cap)
    day = now.astimezone(UTC).strftime("%Y-%m-%d")
    commands = [
        make_command(
            command_id=maintenance_command_id(day, w.command_type, w.project_id, w.last_seq),
            command_type=w.command_type,
            project_id=w.project_id,
            change_id=None,
            task_id=None,
            payload=dict(w.payload),
            now=now,
            ttl_s=ttl_s,
        )
        for w in chosen
    ]
    marks = dict(last_tick)
    for w in chosen:
        marks[mark_key(w.project_id, w.command_type)] = w.last_seq
    return MaintenancePlan(commands, marks, deferred)


def parse_time_of_day(text: str) -> time:
    hours, _, minutes = text.partition(":")
    if not (hours.isdigit() and minutes.isdigit()) or int(hours) > 23 or int(minutes) > 59:
        raise ValueError(f"maintenance_at_utc must be HH:MM (00:00-23:59), got {text!r}")
    return time(int(hours), int(minutes), tzinfo=UTC)


class MaintenanceTick:
    """Runs :func:`maintenance_commands` once a day, at ``at_utc`` or at the first check after it,
    in one process of all the router's processes."""

    def __init__(
        self,
        client: redis.Redis[bytes],
        *,
        env: str,
        at_utc: str,
        cap: int,
        ttl_s: float,
        lock_ttl_s: int,
        read_states: Callable[[], Mapping[str, JSON]],
        send: Callable[[list[Command]], None],
        clock: Clock,
    ) -> None:
        self.client = client
        self.at = parse_time_of_day(at_utc)
        self.cap = cap
        self.ttl_s = ttl_s
        self.lock_ttl_s = lock_ttl_s
        self.read_states = read_states
        self.send = send
        self.clock = clock
        prefix = f"rh:{env}:causal-router:maintenance:"
        self.day_key = prefix + "day"
        self.marks_key = prefix + "marks"
        self.lock_prefix = prefix + "lock:"

    def due_at(self, now: datetime) -> datetime:
        return datetime.combine(now.astimezone(UTC).date(), self.at)

    def due(self, now: datetime | None = None) -> bool:
        now = now or self.clock.now()
        day = now.astimezone(UTC).strftime("%Y-%m-%d")
        done = self.client.get(self.day_key)
        return now >= self.due_at(now) and (done is None or done.decode() < day)

    def marks(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.marks_key).items()}

    def run_if_due(self) -> MaintenancePlan | None:
        """Tick if due and no other process is ticking today; returns what was sent."""
        now = self.clock.now()
        if not self.due(now):
            return None
        day = now.astimezone(UTC).strftime("%Y-%m-%d")
        lock = self.lock_prefix + day
        if not self.client.set(lock, secrets.token_hex(8), nx=True, ex=self.lock_ttl_s):
            return None  # another process is ticking (or its tick died: retried after the TTL)
        try:
            plan = maintenance_commands(
                self.read_states(), now, self.marks(), cap=self.cap, ttl_s=self.ttl_s
            )
            self.send(plan.commands)
        except Exception:
            self.client.delete(lock)  # let the next check try again
            raise
        marks = {k: str(v) for k, v in plan.marks.items()}
        if is_cluster(self.client):
            # The two keys hash to two slots on a Redis Cluster (no hash tag: renaming them would
            # orphan a running environment's marks), so no MULTI: the marks go first, and a
            # crash between the two leaves today's tick to run again with them, as a crash
            # before this write leaves it to run again without them.
            if marks:
                self.client.hset(self.marks_key, mapping=marks)  # type: ignore[arg-type]
            self.client.set(self.day_key, day)
        else:
            pipe = self.client.pipeline()
            if marks:
                pipe.hset(self.marks_key, mapping=marks)  # type: ignore[arg-type]
            pipe.set(self.day_key, day)
            pipe.execute()
        log.info(
            "maintenance %s: %d commands sent, %d left for the next tick: %s",
            day,
            len(plan.commands),
            plan.deferred,
            orjson.dumps(_by_type(plan.commands)).decode(),
        )
        return plan


def _by_type(commands: list[Command]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in commands:
        out[c.command_type] = out.get(c.command_type, 0) + 1
    return out
