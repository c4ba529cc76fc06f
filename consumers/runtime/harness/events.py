"""Valid events for tests, built and checked as the wire checks them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from streams.envelopes import Event, build
from streams.ids import stable_event_id

# When a test's events happened, unless it says: a fixed time, so runs compare equal.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def event(
    event_type: str,
    project_id: str = "project-1",
    *,
    slot: int | None = None,
    payload: Mapping[str, Any] | None = None,
    event_id: str | None = None,
    change_id: str | None = None,
    task_id: str | None = None,
    tenant_id: str = "tenant-1",
    actor: str = "test",
    timestamp: datetime | None = None,
    **fields: Any,
) -> Event:
    """An event as the outbox would write it. Without ``event_id``, the id is derived from the
    fields, so the same fields make the same event (a copy, to the runtime) and any difference
    (a slot, a payload) another; without ``timestamp``, the fixed ``EPOCH`` plus ``slot``
    seconds. ``fields``: any other envelope field (``canonical_generation``, ``caused_by`` ...)."""
    when = timestamp or EPOCH + timedelta(seconds=slot or 0)
    body = dict(payload or {})
    if event_id is None:
        content = orjson.dumps(
            [
                project_id,
                slot,
                body,
                change_id,
                task_id,
                tenant_id,
                actor,
                when.isoformat(),
                fields,
            ],
            option=orjson.OPT_SORT_KEYS,
            default=str,
        ).decode()
        event_id = stable_event_id(change_id, event_type, task_id, content)
    return build(
        Event,
        event_id=event_id,
        event_type=event_type,
        tenant_id=tenant_id,
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        actor=actor,
        timestamp=when,
        payload=body,
        slot=slot,
        **fields,
    )
