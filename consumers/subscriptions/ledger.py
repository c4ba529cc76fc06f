"""``ledger``: the runtime's drill and test subscription (not a product subscription). It records
each applied event in Redis, in applied order — the simplest possible witness that the runtime
applies every event exactly once.

For drills it fails, every time, on an event whose payload has ``"drill": "fail"``, so the
failure path (retries, then a dead letter after the fifth failure) can be exercised on a live
system.
"""

from __future__ import annotations

from typing import Any, ClassVar

import redis

from consumers.runtime.types import JSON, BaseProcessor, Delivery, EffectKind, Effects, RedisOp
from streams.envelopes import Event
from streams.errors import LedgerDrillFailure


class Ledger(BaseProcessor):
    slug: ClassVar[str] = "ledger"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if event.payload.get("drill") == "fail":
            raise LedgerDrillFailure(f"drill: event {event.event_id} is marked to fail")
        position = event.slot if event.slot is not None else 0
        ops = [
            RedisOp("RPUSH", f"ledger:project:{event.project_id}", (position,)),
            RedisOp("HINCRBY", "ledger:counts", (event.event_id, 1)),
            RedisOp("SADD", "ledger:projects", (event.project_id,)),
        ]
        if delivery.cursor_revision:
            # Applied again after a deliberate reprocess_from: at which revision, so a witness
            # tells one application per revision from a doubled one (revision 0, the usual one,
            # costs nothing more).
            revised = f"{event.event_id}@{delivery.cursor_revision}"
            ops.append(RedisOp("HINCRBY", "ledger:revisions", (revised, 1)))
        return Effects(redis=ops)


def read_ledger(client: redis.Redis[bytes], env: str) -> dict[str, Any]:
    """``{"projects": {project: [slot, ...]}, "counts": {event_id: n}, "revisions": {event_id:
    {revision: n}}}``, in applied order; ``counts`` holds every application, ``revisions`` those
    at a cursor revision above 0 (a reprocess_from's re-runs)."""
    projects: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    revisions: dict[str, dict[int, int]] = {}
    prefix = f"rh:{env}:{{ledger|"
    for key in client.scan_iter(match=prefix + "*:x:ledger:*", count=1000):
        name = key.decode()
        logical = name.split(":x:", 1)[1]
        if logical.startswith("ledger:project:"):
            projects[logical.removeprefix("ledger:project:")] = [
                int(v) for v in client.lrange(key, 0, -1)
            ]
        elif logical == "ledger:counts":
            for event_id, n in client.hgetall(key).items():
                counts[event_id.decode()] = counts.get(event_id.decode(), 0) + int(n)
        elif logical == "ledger:revisions":
            for revised, n in client.hgetall(key).items():
                which, revision = revised.decode().rsplit("@", 1)
                at = revisions.setdefault(which, {})
                at[int(revision)] = at.get(int(revision), 0) + int(n)
    return {"projects": dict(sorted(projects.items())), "counts": counts, "revisions": revisions}
