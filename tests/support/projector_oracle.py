"""The expected project view, computed from the events the plain way: a straightforward replay in
Python, with none of the projector's encodings (no ordered-state numbers, no SLOT op, no fold).
Tests compare what the projector wrote against this."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from consumers.runtime.types import TP
from consumers.subscriptions.projector.processor import view_key
from consumers.subscriptions.projector.view import VIEW_PARTS, view_from_parts
from streams.envelopes import Event, format_time

TASK = {
    "task.created": "created",
    "task.ready": "ready",
    "task.started": "started",
    "task.completed": "completed",
    "task.failed": "failed",
    "task.blocked": "blocked",
}
CHANGE = {
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


def expected_view(project_id: str, tp: TP, arrived: list[Event]) -> dict[str, Any]:
    """The view after ``arrived`` (in arrival order, duplicates included) was consumed."""
    seen: set[str] = set()
    events: list[Event] = []
    for e in arrived:
        if e.project_id == project_id and e.event_id not in seen:
            seen.add(e.event_id)
            events.append(e)
    # Gaps are a matter of arrival order.
    high, gaps = 0, 0
    for e in events:
        if e.slot is not None:
            gaps += e.slot > high + 1
            high = max(high, e.slot)
    slots = {e.slot for e in events if e.slot is not None}
    missing = sorted(set(range(1, high + 1)) - slots)
    # States are a matter of slot order: the latest fact wins. An unslotted event counts as the
    # latest fact when it arrives. So: all slotted, replay in slot order; mixed (the tests mix
    # only with slotted events arriving in slot order), replay in arrival order.
    if all(e.slot is not None for e in events):
        replay = sorted(events, key=lambda e: e.slot or 0)
    else:
        replay = list(events)
    changes: dict[str, str] = {}
    tasks: dict[str, dict[str, Any]] = {}
    generation: int | None = None
    for e in replay:
        if e.event_type in TASK:
            assert e.task_id is not None
            t = tasks.setdefault(
                e.task_id, {"state": None, "agent": None, "changeId": None, "blockedLimit": None}
            )
            # The dead-letter path's failure (it carries blockedLimit) follows its block: the
            # task stays blocked, with the limit of the latest blocking event.
            blocking = e.event_type == "task.blocked" or (
                e.event_type == "task.failed" and "blockedLimit" in e.payload
            )
            t["state"] = "blocked" if blocking else TASK[e.event_type]
            t["blockedLimit"] = e.payload.get("blockedLimit") if blocking else None
            if e.event_type == "task.created" and e.change_id is not None:
                t["changeId"] = e.change_id
            if e.event_type == "task.started":
                t["agent"] = e.payload["agentId"]
        if e.event_type in CHANGE and e.change_id is not None:
            changes[e.change_id] = CHANGE[e.event_type]
        g = e.canonical_generation
        if g is None and e.event_type == "canonical.advanced":
            g = e.payload["generation"]
        if g is not None:
            generation = g if generation is None else max(generation, g)
    # An agent is active with the tasks it started that are still started (latest fact).
    open_tasks = Counter(t["agent"] for t in tasks.values() if t["state"] == "started")
    counts = Counter(e.event_type for e in events)
    return {
        "projectId": project_id,
        "stream": tp.topic,
        "partition": tp.partition,
        "events": len(events),
        "counts": dict(sorted(counts.items())),
        "changes": dict(sorted(changes.items())),
        "tasks": dict(sorted(tasks.items())),
        "activeAgents": {a: n for a, n in sorted(open_tasks.items()) if n > 0},
        "generation": generation,
        "highSlot": high if slots else None,
        "missingSlots": missing,
        "missingOverflow": False,
        "gap": bool(missing),
        "gapsRecorded": gaps,
        "lastEventTime": format_time(max(e.timestamp for e in events)) if events else None,
    }


def expected_feed(project_id: str, arrived: list[Event], length: int) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for e in arrived:
        if e.project_id != project_id or e.event_id in seen:
            continue
        seen.add(e.event_id)
        entry: dict[str, Any] = {
            "eventId": e.event_id,
            "eventType": e.event_type,
            "time": format_time(e.timestamp),
            "actor": e.actor,
        }
        for key, value in (("slot", e.slot), ("changeId", e.change_id), ("taskId", e.task_id)):
            if value is not None:
                entry[key] = value
        out.append(entry)
    return list(reversed(out))[:length]


def memory_view(store: Any, tp: TP, project_id: str) -> dict[str, Any] | None:
    """The view as the reader renders it, from the in-memory store."""
    parts = {part: store.read(tp, view_key(project_id, part)) or {} for part in VIEW_PARTS}
    return view_from_parts(project_id, tp, parts)


def memory_feed(store: Any, tp: TP, project_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in store.read(tp, view_key(project_id, "feed")) or []]
