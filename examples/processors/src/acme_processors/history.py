"""``acme-task-history``: one row per task event in the ``task_history`` table of the team's
PostgreSQL (the subscription's ``database``), for the queries a Redis view does not answer: a
task's history, failures by actor, how long tasks take.

A SQL-effect processor returns its statements; the runtime runs them in the database, in the
transaction that also stores the subscription's claims and cursor, so each event's row is
written exactly once. The statement is still an upsert keyed by the event's id: an operator's
``reprocess-from`` runs the events after its offset again, and ``ON CONFLICT DO UPDATE`` makes
that rewrite the same rows rather than fail on them.

The table is the team's, not the runtime's: :data:`SCHEMA` creates it, run once per database by
``acme-processors init-db`` (:mod:`acme_processors.cli`) as a migration would, before the
subscription's first member starts.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rhumbatron import Delivery, EffectKind, Effects, Event, Processor, SqlStatement

STATUSES = {
    "task.created": "created",
    "task.started": "started",
    "task.completed": "completed",
    "task.failed": "failed",
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS task_history (
    event_id    text PRIMARY KEY,
    project_id  text NOT NULL,
    task_id     text NOT NULL,
    status      text NOT NULL,
    actor       text NOT NULL,
    slot        bigint,
    occurred_at timestamptz NOT NULL,
    payload     jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS task_history_by_task
    ON task_history (project_id, task_id, occurred_at);
"""

UPSERT = """
INSERT INTO task_history
    (event_id, project_id, task_id, status, actor, slot, occurred_at, payload)
VALUES
    (%(event_id)s, %(project_id)s, %(task_id)s, %(status)s, %(actor)s, %(slot)s,
     %(occurred_at)s, %(payload)s::jsonb)
ON CONFLICT (event_id) DO UPDATE SET
    project_id = EXCLUDED.project_id,
    task_id = EXCLUDED.task_id,
    status = EXCLUDED.status,
    actor = EXCLUDED.actor,
    slot = EXCLUDED.slot,
    occurred_at = EXCLUDED.occurred_at,
    payload = EXCLUDED.payload
"""


def row_of(event: Event) -> dict[str, Any]:
    """The event's row, as the upsert's parameters."""
    return {
        "event_id": event.event_id,
        "project_id": event.project_id,
        "task_id": event.task_id,
        "status": STATUSES[event.event_type],
        "actor": event.actor,
        "slot": event.slot,
        "occurred_at": event.timestamp,
        # Keys sorted: the same event makes the same statement, which is what the exactly-once
        # check (rhumbatron.testing.assert_exactly_once) compares.
        "payload": json.dumps(event.payload, sort_keys=True),
    }


class TaskHistory(Processor):
    slug: ClassVar[str] = "acme-task-history"
    consumes: ClassVar[frozenset[str] | None] = frozenset(STATUSES)
    effect_kind: ClassVar[EffectKind] = EffectKind.SQL

    def validate(self, event: Event) -> None:
        if event.task_id is None:
            # No retry can give it one: dead-lettered at once, its project goes on.
            raise ValueError(f"{event.event_type} {event.event_id} names no task")

    def process(self, event: Event, state: dict[str, Any] | None, delivery: Delivery) -> Effects:
        return Effects(sql=[SqlStatement(UPSERT, row_of(event))])
