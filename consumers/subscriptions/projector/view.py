"""Reading what ``project-view-projector`` wrote: a project's view as JSON, its feed, and the
figures across an environment. The caller names the project's partition (the router layer knows
the topology: ``settings.topology.partition_of(project_id)``); key names come from the runtime's
own store, so they cannot drift from where the effects were written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import redis

from consumers.redis_conn import redis_errors
from consumers.runtime.redis_store import DAY_MS, RedisStore
from consumers.runtime.types import TP
from consumers.subscriptions.projector.processor import (
    BLOCKED,
    CHANGE_CODES,
    SLUG,
    TASK_CODES,
    agent_field,
    decode_state,
    metrics_key,
    view_key,
)
from streams.clock import SystemClock
from streams.envelopes import format_time
from streams.errors import ViewNotFound

VIEW_PARTS = (
    "meta",
    "missing",
    "counts",
    "changes",
    "tasks",
    "task_change",
    "task_agent_at",
    "task_agent",
    "task_blocked_at",
    "task_blocked",
)


def _store(client: redis.Redis[bytes], env: str) -> RedisStore:
    # Only for key naming: the same naming the runtime wrote the effects with.
    return RedisStore(client, env=env, slug=SLUG, clock=SystemClock(), claim_ttl_ms=DAY_MS)


def _text(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def read_view(client: redis.Redis[bytes], env: str, tp: TP, project_id: str) -> dict[str, Any]:
    """The project's view as JSON-ready data; :class:`ViewNotFound` if it has none."""
    store = _store(client, env)
    pipe = client.pipeline(transaction=False)
    for part in VIEW_PARTS:
        key = store.key(tp, view_key(project_id, part))
        if part == "missing":
            pipe.smembers(key)
        else:
            pipe.hgetall(key)
    parts: dict[str, Any] = {}
    with redis_errors(client, f"reading the view of project {project_id!r} ({tp})"):
        found = pipe.execute()
    for part, raw in zip(VIEW_PARTS, found, strict=True):
        parts[part] = {m.decode() for m in raw} if part == "missing" else _text(raw)
    view = view_from_parts(project_id, tp, parts)
    if view is None:
        raise ViewNotFound(project_id, env, tp, SLUG)
    return view


def view_from_parts(project_id: str, tp: TP, parts: Mapping[str, Any]) -> dict[str, Any] | None:
    """Build the view from its stored parts (``VIEW_PARTS``: hashes as ``{field: value}``, the
    missing slots as a set of strings); None when the project has no view. Pure, so it reads the
    in-memory store as well as Redis."""
    counts = {k: int(v) for k, v in sorted(parts.get("counts", {}).items())}
    if not counts:
        return None
    meta: Mapping[str, str] = parts.get("meta", {})
    missing = sorted(int(m) for m in parts.get("missing", set()))
    overflow = meta.get("missing_overflow") == "1"
    task_change: Mapping[str, str] = parts.get("task_change", {})
    agent_at: Mapping[str, str] = parts.get("task_agent_at", {})
    task_agent: Mapping[str, str] = parts.get("task_agent", {})
    blocked_at: Mapping[str, str] = parts.get("task_blocked_at", {})
    task_blocked: Mapping[str, str] = parts.get("task_blocked", {})
    tasks: dict[str, dict[str, Any]] = {}
    for task, value in sorted(parts.get("tasks", {}).items()):
        _, state = decode_state(int(value), TASK_CODES)
        at = agent_at.get(task)
        block = blocked_at.get(task)
        tasks[task] = {
            "state": state,
            "agent": task_agent.get(agent_field(int(at), task)) if at is not None else None,
            "changeId": task_change.get(task),
            # Only while blocked: a task that moved on (a retry) is no longer held by a limit.
            "blockedLimit": (
                task_blocked.get(agent_field(int(block), task)) or None
                if state == BLOCKED and block is not None
                else None
            ),
        }
    changes = {
        change: decode_state(int(value), CHANGE_CODES)[1]
        for change, value in sorted(parts.get("changes", {}).items())
    }
    # Active agents follow the task states (docs/events.md): an agent's started tasks.
    running = Counter(t["agent"] for t in tasks.values() if t["state"] == "started" and t["agent"])
    agents = dict(sorted(running.items()))
    last_ms = int(meta["last_ms"]) if "last_ms" in meta else None
    return {
        "projectId": project_id,
        "stream": tp.topic,
        "partition": tp.partition,
        "events": sum(counts.values()),
        "counts": counts,
        "changes": changes,
        "tasks": tasks,
        "activeAgents": agents,
        "generation": int(meta["generation"]) if "generation" in meta else None,
        "highSlot": int(meta["high"]) if "high" in meta else None,
        "missingSlots": missing,
        "missingOverflow": overflow,
        "gap": bool(missing) or overflow,
        "gapsRecorded": int(meta.get("gaps_recorded", "0")),
        "lastEventTime": format_time(_from_ms(last_ms)) if last_ms is not None else None,
    }


def read_feed(
    client: redis.Redis[bytes], env: str, tp: TP, project_id: str
) -> list[dict[str, Any]]:
    """The project's recent events, newest applied first; :class:`ViewNotFound` if it has none."""
    store = _store(client, env)
    with redis_errors(client, f"reading the feed of project {project_id!r} ({tp})"):
        entries = client.lrange(store.key(tp, view_key(project_id, "feed")), 0, -1)
    if not entries:
        raise ViewNotFound(project_id, env, tp, SLUG)
    return feed_from_entries(entries)


def feed_from_entries(entries: list[bytes] | list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in entries]


def _keys_of(client: redis.Redis[bytes], env: str, logical: str) -> list[bytes]:
    # Every partition's copy of one logical key: rh:<env>:{<slug>|<topic>|<p>}:x:<logical>.
    probe = _store(client, env).key(TP("TOPIC", 0), logical)
    if "|TOPIC|0}" not in probe:
        raise RuntimeError(f"the runtime's key naming changed ({probe!r}); update _keys_of")
    pattern = probe.replace("|TOPIC|0}", "|*}")
    with redis_errors(client, f"listing the keys {pattern}"):
        return sorted(client.scan_iter(match=pattern, count=1000))


def count_views(client: redis.Redis[bytes], env: str) -> int:
    """Number of projects with a view in the environment: one ``counts`` hash each (every
    applied event increments one; no other part's name ends in ``:counts``)."""
    return len(_keys_of(client, env, view_key("*", "counts")))


def list_views(client: redis.Redis[bytes], env: str) -> list[dict[str, Any]]:
    """Every project with a view in the environment, by project id: what ``read_view`` says of
    it in brief (stream, partition, events, high slot, gap, last event time)."""
    keys = _keys_of(client, env, view_key("*", "counts"))
    store = _store(client, env)
    found: list[tuple[str, TP]] = []
    for raw in keys:
        name = raw.decode()
        logical = name.split(":x:", 1)[1]  # view:<project>:counts
        project_id = logical.removeprefix("view:").removesuffix(":counts")
        _, topic, partition = name[name.index("{") + 1 : name.index("}")].split("|")
        found.append((project_id, TP(topic, int(partition))))
    pipe = client.pipeline(transaction=False)
    for project_id, tp in found:
        pipe.hgetall(store.key(tp, view_key(project_id, "counts")))
        pipe.hgetall(store.key(tp, view_key(project_id, "meta")))
        pipe.smembers(store.key(tp, view_key(project_id, "missing")))
    with redis_errors(client, f"reading the project views of environment {env!r}"):
        replies = pipe.execute() if found else []
    views = []
    for n, (project_id, tp) in enumerate(found):
        counts, meta, missing = replies[3 * n : 3 * n + 3]
        view = view_from_parts(
            project_id,
            tp,
            {
                "counts": _text(counts),
                "meta": _text(meta),
                "missing": {m.decode() for m in missing},
            },
        )
        if view is not None:  # its counts went between the scan and the read
            views.append(view)
    return sorted(views, key=lambda v: str(v["projectId"]))


def count_gaps_recorded(client: redis.Redis[bytes], env: str) -> int:
    """The ``gaps_recorded`` metric summed over every partition of the environment."""
    keys = _keys_of(client, env, metrics_key())
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, "gaps_recorded")
    if not keys:
        return 0
    with redis_errors(client, "reading the projector's gaps_recorded metric"):
        return sum(int(n or 0) for n in pipe.execute())


def _from_ms(ms: int) -> datetime:
    # Whole seconds plus milliseconds: no float rounding on the way back.
    return datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)
