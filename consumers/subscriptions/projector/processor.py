"""``project-view-projector``: one view per project in Redis, and a bounded feed of its recent
events, written only as Redis effects so the runtime makes them exact under duplicates, crashes
and redelivery (claim + effects + cursor in one script). Dedupe is the runtime's claim, never the
slot.

What a view holds, and the op that keeps each part right whatever the order events arrive in:

- counts by event type (HINCRBY), the last event time (HMAX of epoch ms), the latest canonical
  generation (HMAX);
- the highest slot applied and the slots *missing* below it (SLOT): a slot beyond a gap is
  applied and the gap recorded; a late slot inside a recorded gap is applied and closes it; past
  ``missing_cap`` recorded slots the view says ``missingOverflow`` instead of growing. Events
  without a slot (the feed pump's) are applied with no slot check;
- each change's and each task's state, as the state machines below. A state is stored as one
  number, ``order * STATE_SPAN + code`` with ``order`` the event's slot, written with HMAX: the
  state of the highest slot wins, so a late slot closing a gap cannot roll a task back. An event
  without a slot has order 0 and overwrites (HSET): it counts as the latest thing known;
- each task's agent: the agent of its latest ``task.started`` (same ordering, kept as the start's
  order in one hash and the agent under ``<order>:<task>`` in another);
- each blocked task's limit (``blockedLimit``, e.g. ``dead_letter``): the limit of its latest
  blocking event, kept the same way as the agent;
- active agents: derived when the view is read, per agent the tasks whose state is ``started``
  with it as their agent. Nothing is counted up and down: a ``task.failed`` naming an agent that
  never started the task (the dead-letter path's failure of a wake the agent never took) cannot
  push a count below zero and hide the agent's real work, and the answer follows the slot-ordered
  states, so arrival order does not matter;
- the feed: a summary of each applied event, newest applied first (LPUSHTRIM, ``feed_length``).

Task states (the ``task.*`` event that moved it there)::

    created ─► ready ─► started ─► completed
                  ▲         │
                  │         ├────► failed ──► (ready again, on a retry)
                  └─────────┴────► blocked  (written by the dead-letter path)

*Blocking* events are ``task.blocked`` and a ``task.failed`` that carries ``blockedLimit``: the
dead-letter path writes the pair (block, then failure) and marks both, so the failure that follows
a block leaves the task ``blocked`` with its limit, in whatever order the two slots arrive. A
plain ``task.failed`` (an agent's) is ``failed``; a later start (an operator's retry) moves a
blocked task on like any other.

Change states::

    open ─► in_progress ─► verifying ─► verified ─► promoted ─► released
   (change   (a task of      (verification.   │
    .created) it started)     started,         ├─► rejected ─► (in_progress again)
                              candidate.       └─► stale    ─► (verifying again)
                              created)

``change.created`` must name its change; the other events move a change's state when they carry
``changeId`` (a project-wide fact without one is still counted and in the feed). The states are
what the catalog's events say happened; they do not police transitions (the
writers do), so an unexpected order still shows the latest fact.

The fold (``reduce``) is tiny: per project, the highest slot folded and the id of the event that
recorded the last gap. It exists for one reason: ``process`` must know whether *this* event
opened a gap to count it exactly (the view's ``gapsRecorded`` and the partition's
``gaps_recorded`` metric) — the SLOT op records the gap but returns nothing to the processor. The
price: like any fold, a ``re_reduce`` or ``reprocess_from`` replays the partition from its start
(the stream, then the archive past its retention).

Bad input (a task event without ``taskId``, a start or completion without ``agentId`` — a
``task.failed`` may name no agent — a ``canonical.advanced`` without a generation) raises
:class:`ProjectorInputError` naming the event, the field and the value: the runtime retries and
then dead-letters it, never dropping it silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import ClassVar, TypeVar

import orjson

from consumers.runtime.types import JSON, BaseProcessor, Delivery, EffectKind, Effects, RedisOp
from streams.catalog import CATALOG, payloads
from streams.envelopes import Event, format_time
from streams.errors import EnvelopeError, ProjectorInputError

P = TypeVar("P", bound=payloads.Payload)

SLUG = "project-view-projector"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# A stored state is order * STATE_SPAN + code; codes stay below STATE_SPAN. Codes are part of the
# stored data: never renumber one (add new states at the end).
STATE_SPAN = 16

TASK_STATES: Mapping[str, str] = {
    "task.created": "created",
    "task.ready": "ready",
    "task.started": "started",
    "task.completed": "completed",
    "task.failed": "failed",
    "task.blocked": "blocked",
}
TASK_CODES: Mapping[str, int] = {
    "created": 1,
    "ready": 2,
    "started": 3,
    "completed": 4,
    "failed": 5,
    "blocked": 6,
}

CHANGE_STATES: Mapping[str, str] = {
    "change.created": "open",
    "task.started": "in_progress",
    "verification.started": "verifying",
    "candidate.created": "verifying",
    "candidate.verified": "verified",
    "candidate.rejected": "rejected",
    "candidate.stale": "stale",
    "artifact.promoted": "promoted",
    "release.completed": "released",
}
CHANGE_CODES: Mapping[str, int] = {
    "open": 1,
    "in_progress": 2,
    "verifying": 3,
    "verified": 4,
    "rejected": 5,
    "stale": 6,
    "promoted": 7,
    "released": 8,
}

BLOCKED = "blocked"

# Events that name the task's agent (checked; a start also records it as the task's agent).
AGENT_EVENTS = frozenset({"task.started", "task.completed", "task.failed"})


# -- logical keys (the runtime puts them under the partition's namespace and hash tag) ----------


def metrics_key() -> str:
    """The partition's counters (``gaps_recorded``)."""
    return "view:metrics"


def view_key(project_id: str, part: str) -> str:
    """One part of a project's view: meta, missing, counts, changes, tasks, task_change,
    task_agent_at, task_agent, task_blocked_at, task_blocked, feed."""
    return f"view:{project_id}:{part}"


def agent_field(order: int, task_id: str) -> str:
    """Field of ``task_agent`` holding the agent of the start at ``order`` (and of
    ``task_blocked`` holding the limit of the block at ``order``); ``order`` is digits, so the
    first ``:`` ends it whatever the task id holds."""
    return f"{order}:{task_id}"


def encode_state(order: int, code: int) -> int:
    return order * STATE_SPAN + code


def decode_state(value: int, names: Mapping[str, int]) -> tuple[int, str]:
    """(order, state name) of a stored state."""
    order, code = divmod(value, STATE_SPAN)
    for name, c in names.items():
        if c == code:
            return order, name
    raise ValueError(f"stored state {value} has unknown code {code}")


_MILLISECOND = timedelta(milliseconds=1)


def event_ms(event: Event) -> int:
    # Integer arithmetic on the timedelta: float seconds * 1000 can land a millisecond short.
    return (event.timestamp - EPOCH) // _MILLISECOND


def feed_entry(event: Event) -> bytes:
    """What the feed keeps of an event: enough to list it, not the payload."""
    entry: dict[str, object] = {
        "eventId": event.event_id,
        "eventType": event.event_type,
        "time": format_time(event.timestamp),
        "actor": event.actor,
    }
    if event.slot is not None:
        entry["slot"] = event.slot
    if event.change_id is not None:
        entry["changeId"] = event.change_id
    if event.task_id is not None:
        entry["taskId"] = event.task_id
    return orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)


def _payload(event: Event, model: type[P]) -> P:
    """``event``'s payload as its type's catalog model (docs/catalog.md)."""
    try:
        return CATALOG.read(event, model)
    except EnvelopeError as exc:
        raise ProjectorInputError(event, exc.field, exc.value, exc.reason) from exc


def _agent_id(event: Event) -> str | None:
    """The agent a task event names. ``task.failed`` may name none: the dead-letter path writes
    it for a task whose command never reached an agent (a dispatch), so no agent is freed."""
    if event.event_type == "task.failed":
        return _payload(event, payloads.TaskFailed).agent_id
    if event.event_type == "task.started":
        return _payload(event, payloads.TaskStarted).agent_id
    return _payload(event, payloads.TaskCompleted).agent_id


def blocked_limit(event: Event) -> str | None:
    """The limit a blocking event (``task.blocked``, or ``task.failed``) names; None when it
    names none."""
    if event.event_type == "task.failed":
        return _payload(event, payloads.TaskFailed).blocked_limit
    return _payload(event, payloads.TaskBlocked).blocked_limit


def task_state(event: Event) -> str:
    """The state a ``task.*`` event puts its task in: a failure that carries ``blockedLimit`` is
    the dead-letter path's, following its block, and keeps the task blocked."""
    if event.event_type == "task.failed" and blocked_limit(event) is not None:
        return BLOCKED
    return TASK_STATES[event.event_type]


def _task_id(event: Event) -> str:
    if event.task_id is None:
        raise ProjectorInputError(
            event, "taskId", None, "a task event must name its task (the view keeps task states)"
        )
    return event.task_id


def canonical_generation(event: Event) -> int | None:
    """The canonical generation an event establishes or observed, if any."""
    generation = event.canonical_generation
    if event.event_type != "canonical.advanced":
        return generation
    payload_gen = _payload(event, payloads.CanonicalAdvanced).generation
    if generation is not None and payload_gen is not None and generation != payload_gen:
        raise ProjectorInputError(
            event,
            "payload.generation",
            payload_gen,
            f"disagrees with canonicalGeneration {generation}",
        )
    generation = generation if generation is not None else payload_gen
    if generation is None:
        raise ProjectorInputError(
            event,
            "canonicalGeneration",
            None,
            "canonical.advanced must carry the new generation (canonicalGeneration or "
            "payload.generation)",
        )
    return generation


class ProjectViewProjector(BaseProcessor):
    slug: ClassVar[str] = SLUG
    consumes: ClassVar[frozenset[str] | None] = None  # every type is counted and in the feed
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def __init__(self, *, feed_length: int, missing_cap: int) -> None:
        if feed_length < 1:
            raise ValueError(f"feed_length must be at least 1, got {feed_length}")
        if missing_cap < 1:
            raise ValueError(f"missing_cap must be at least 1, got {missing_cap}")
        self.feed_length = feed_length
        self.missing_cap = missing_cap

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        """Per project: ``high`` (the highest slot folded) and ``gapBy`` (the event that recorded
        the last gap). Unslotted events leave it as it is."""
        if event.slot is None:
            return state
        high = int(state["high"]) if state else 0
        gap_by = str(state["gapBy"]) if state else ""
        if event.slot > high + 1:
            gap_by = event.event_id
        return {"high": max(high, event.slot), "gapBy": gap_by}

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        # Per event, so each key is the project's prefix plus its part (view_key(p, part)
        # spelled once), and each state op is built inline rather than through a helper.
        view = view_key(event.project_id, "")
        etype = event.event_type
        slot = event.slot
        meta = view + "meta"
        ops = [
            RedisOp("HINCRBY", view + "counts", (etype, 1)),
            RedisOp("HMAX", meta, ("last_ms", (event.timestamp - EPOCH) // _MILLISECOND)),
        ]
        order = 0
        if slot is not None:
            order = slot
            ops.append(RedisOp("SLOT", meta, (view + "missing", slot, self.missing_cap)))
            if state is not None and state["gapBy"] == event.event_id:
                ops.append(RedisOp("HINCRBY", meta, ("gaps_recorded", 1)))
                ops.append(RedisOp("HINCRBY", metrics_key(), ("gaps_recorded", 1)))
        generation = canonical_generation(event)
        if generation is not None:
            ops.append(RedisOp("HMAX", meta, ("generation", generation)))
        # The state of the highest order wins (HMAX); order 0 (no slot) overwrites (HSET).
        ordered = "HMAX" if order else "HSET"

        if etype in TASK_STATES:
            task = _task_id(event)
            state_name = task_state(event)
            code = TASK_CODES[state_name]
            ops.append(RedisOp(ordered, view + "tasks", (task, encode_state(order, code))))
            if state_name == BLOCKED:
                # "" for a block that names no limit, so an older block's limit cannot show.
                limit = blocked_limit(event) or ""
                field = agent_field(order, task)
                ops.append(RedisOp("HSET", view + "task_blocked", (field, limit)))
                ops.append(RedisOp(ordered, view + "task_blocked_at", (task, order)))
            if etype == "task.created" and event.change_id is not None:
                ops.append(RedisOp("HSET", view + "task_change", (task, event.change_id)))
            if etype in AGENT_EVENTS:
                agent = _agent_id(event)
                if agent is not None and etype == "task.started":
                    field = agent_field(order, task)
                    ops.append(RedisOp("HSET", view + "task_agent", (field, agent)))
                    ops.append(RedisOp(ordered, view + "task_agent_at", (task, order)))
        if etype in CHANGE_STATES:
            if event.change_id is None:
                if etype == "change.created":
                    raise ProjectorInputError(
                        event, "changeId", None, "change.created must name the change it creates"
                    )
            else:
                code = CHANGE_CODES[CHANGE_STATES[etype]]
                state_value = encode_state(order, code)
                ops.append(RedisOp(ordered, view + "changes", (event.change_id, state_value)))

        entry = feed_entry(event).decode()
        ops.append(RedisOp("LPUSHTRIM", view + "feed", (entry, self.feed_length)))
        return Effects(redis=ops)
