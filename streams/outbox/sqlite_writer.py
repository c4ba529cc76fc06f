"""A writer's transaction on the SQLite outbox: its own SQL, and appends that allocate slots."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry import propagate

from streams.clock import Clock
from streams.envelopes import Draft, Event, decode_event
from streams.errors import SlotConflict
from streams.outbox import stored
from streams.outbox.slots import plan_append
from streams.outbox.sqlite_schema import IN_CHUNK, SqliteOptions
from streams.outbox.store import AppendResult


class SqliteUnitOfWork:
    placeholder = "?"  # the writer's own SQL: sqlite3's qmark style

    def __init__(
        self, conn: sqlite3.Connection, *, options: SqliteOptions, clock: Clock, now: float
    ) -> None:
        self._options = options
        self._clock = clock
        self._conn = conn
        self._now = now
        self.appended = 0

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def append(
        self,
        project_id: str,
        drafts: Sequence[Draft],
        *,
        tenant_id: str,
        seen_slot: int | None = None,
        strict: bool = False,
    ) -> AppendResult:
        conn = self._conn
        found = conn.execute(
            "SELECT last_slot FROM outbox_slots WHERE project_id = ?", (project_id,)
        ).fetchone()
        head = int(found[0]) if found else 0
        ids = [d.event_id for d in drafts]
        existing: set[str] = set()
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            existing.update(
                r[0]
                for r in conn.execute(
                    f"SELECT event_id FROM outbox WHERE event_id IN ({marks})", chunk
                )
            )
        plan = plan_append(
            project_id, drafts, head=head, existing=existing, seen_slot=seen_slot, strict=strict
        )
        missed, complete = self._missed(project_id, plan.missed_from, plan.missed_to)
        if plan.conflict:
            assert seen_slot is not None  # plan_append refuses strict without it
            raise SlotConflict(project_id, seen_slot, head, missed, missed_complete=complete)
        timestamp = self._clock.now()
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        trace_context = orjson.dumps(carrier).decode() if carrier else None
        events: list[Event] = []
        rows: list[tuple[Any, ...]] = []
        for draft, slot in plan.new:
            event = draft.to_event(tenant_id=tenant_id, timestamp=timestamp, slot=slot)
            envelope = stored.event_bytes(event, max_bytes=self._options.max_envelope_bytes)
            events.append(event)
            rows.append(
                (
                    event.event_id,
                    project_id,
                    slot,
                    event.event_type,
                    envelope,
                    trace_context,
                    self._now,
                )
            )
        if rows:
            conn.executemany(
                "INSERT INTO outbox (event_id, project_id, slot, event_type, envelope, "
                "trace_context, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute(
                "INSERT INTO outbox_slots (project_id, last_slot) VALUES (?, ?) "
                "ON CONFLICT (project_id) DO UPDATE SET last_slot = excluded.last_slot",
                (project_id, plan.head_after),
            )
            self.appended += len(rows)
        return AppendResult(
            project_id=project_id,
            events=tuple(events),
            duplicates=plan.duplicates,
            head=plan.head_after,
            missed=tuple(missed),
            missed_complete=complete,
        )

    def _missed(self, project_id: str, first: int, last: int) -> tuple[list[Event], bool]:
        if first > last:
            return [], True
        limit = self._options.missed_report_limit
        found = self._conn.execute(
            "SELECT envelope FROM outbox WHERE project_id = ? AND slot BETWEEN ? AND ? "
            "ORDER BY slot LIMIT ?",
            (project_id, first, last, limit),
        ).fetchall()
        max_bytes = self._options.max_envelope_bytes
        events = [decode_event(bytes(r[0]), max_bytes=max_bytes) for r in found]
        return events, len(events) == last - first + 1
