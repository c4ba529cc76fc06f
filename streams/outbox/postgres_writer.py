"""A writer's append on the PostgreSQL outbox, inside the writer's own psycopg transaction.

:func:`append` is what a Python service calls on its open connection: it validates the events in
Python (an invalid or oversized envelope raises before anything is sent), then calls the
schema's ``rhumbatron_append`` function, which takes the project's counter row lock, allocates
the slots, reports the events the writer had not seen (bump-and-report) or refuses (strict:
:class:`~streams.errors.SlotConflict`). It never commits: the writer's own statements and its
events commit (or roll back) together when the writer ends its transaction. After a refusal or
any other error, the transaction is aborted and must be rolled back, as after any failed
statement in PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
import psycopg
from opentelemetry import propagate
from psycopg.types.json import Jsonb

from streams.clock import Clock, SystemClock
from streams.envelopes import Draft, Event, decode_event, encode
from streams.errors import OutboxError, SlotConflict
from streams.outbox import stored
from streams.outbox.slots import check_drafts
from streams.outbox.store import AppendResult

# What a strict refusal raises in rhumbatron_append (a class of its own, so it is never confused
# with a PostgreSQL error).
SLOT_CONFLICT_SQLSTATE = "RH409"
# The envelope fields rhumbatron_append takes from each event (the rest it sets itself).
_OWN_FIELDS = ("tenantId", "projectId", "slot")


def _decode_many(items: Sequence[Any], max_bytes: int) -> list[Event]:
    # PostgreSQL's JSON spacing makes the text longer than the canonical form: the size limit is
    # the canonical one, checked by encode.
    events = [decode_event(orjson.dumps(item), max_bytes=max_bytes * 4) for item in items]
    for event in events:
        encode(event, max_bytes=max_bytes)
    return events


def append(
    conn: psycopg.Connection[Any],
    drafts: Draft | Sequence[Draft],
    *,
    tenant_id: str,
    project_id: str | None = None,
    seen_slot: int | None = None,
    strict: bool = False,
    max_envelope_bytes: int,
    missed_report_limit: int,
    clock: Clock | None = None,
    now: datetime | None = None,
) -> AppendResult:
    """Append events of one project in ``conn``'s open transaction (see the module doc). The
    caller commits. ``project_id`` defaults to the first draft's; ``now`` (default: the clock)
    is the events' timestamp and the rows' ``created_at``."""
    items = [drafts] if isinstance(drafts, Draft) else list(drafts)
    if project_id is None:
        if not items:
            raise OutboxError("append needs a project_id or at least one event")
        project_id = items[0].project_id
    check_drafts(project_id, items)
    if strict and seen_slot is None:
        raise OutboxError(
            f"strict append to project '{project_id}' needs seen_slot (the highest slot the "
            "writer has seen; 0 if it has seen none)"
        )
    timestamp = now or (clock or SystemClock()).now()
    wire: list[dict[str, Any]] = []
    for draft in items:
        event = draft.to_event(tenant_id=tenant_id, timestamp=timestamp, slot=None)
        # Refuses an invalid or oversized event, or a cataloged payload not its model's.
        stored.event_bytes(event, max_bytes=max_envelope_bytes)
        fields = event.model_dump(mode="json", by_alias=True, exclude_none=True)
        wire.append({k: v for k, v in fields.items() if k not in _OWN_FIELDS})
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    try:
        found = conn.execute(
            "SELECT rhumbatron_append(%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                project_id,
                tenant_id,
                Jsonb(wire),
                seen_slot,
                strict,
                Jsonb(carrier) if carrier else None,
                missed_report_limit,
                timestamp,
            ),
        ).fetchone()
    except psycopg.Error as exc:
        raise _refusal(exc, project_id, max_envelope_bytes) from exc
    assert found is not None
    result: Mapping[str, Any] = found[0]
    first: dict[str, Draft] = {}
    for draft in items:
        first.setdefault(draft.event_id, draft)
    events = tuple(
        first[event_id].to_event(tenant_id=tenant_id, timestamp=timestamp, slot=slot)
        for event_id, slot in zip(result["eventIds"], result["slots"], strict=True)
    )
    return AppendResult(
        project_id=project_id,
        events=events,
        duplicates=tuple(result["duplicates"]),
        head=int(result["head"]),
        missed=tuple(_decode_many(result["missed"], max_envelope_bytes)),
        missed_complete=bool(result["missedComplete"]),
    )


def _refusal(exc: psycopg.Error, project_id: str, max_bytes: int) -> Exception:
    diag = exc.diag
    if exc.sqlstate == SLOT_CONFLICT_SQLSTATE and diag.message_detail:
        detail = orjson.loads(diag.message_detail)
        return SlotConflict(
            project_id,
            int(detail["seenSlot"]),
            int(detail["head"]),
            _decode_many(detail["missed"], max_bytes),
            missed_complete=bool(detail["missedComplete"]),
        )
    if exc.sqlstate in ("22023", "23514", "23502"):  # our refusals, CHECK, NOT NULL
        return OutboxError(
            f"outbox append to project '{project_id}' refused: {diag.message_primary}"
        )
    if exc.sqlstate == "42883":  # undefined function: no outbox schema here
        return OutboxError(
            "the database holds no outbox (no rhumbatron_append function in the search_path): "
            "run `rhumbatron outbox init --outbox URL` first"
        )
    return exc


class PostgresUnitOfWork:
    """A writer's transaction on a pooled connection (what ``PostgresOutbox.transaction``
    yields): its own SQL (psycopg placeholders, ``%s``) and its appends commit together."""

    placeholder = "%s"

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        max_envelope_bytes: int,
        missed_report_limit: int,
        clock: Clock,
    ) -> None:
        self._conn = conn
        self._max_bytes = max_envelope_bytes
        self._missed_limit = missed_report_limit
        self._clock = clock
        self.appended = 0

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The transaction's connection, for code that wants psycopg itself."""
        return self._conn

    def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> psycopg.Cursor[Any]:
        return self._conn.execute(sql, params or None)

    def append(
        self,
        project_id: str,
        drafts: Sequence[Draft],
        *,
        tenant_id: str,
        seen_slot: int | None = None,
        strict: bool = False,
    ) -> AppendResult:
        result = append(
            self._conn,
            drafts,
            tenant_id=tenant_id,
            project_id=project_id,
            seen_slot=seen_slot,
            strict=strict,
            max_envelope_bytes=self._max_bytes,
            missed_report_limit=self._missed_limit,
            clock=self._clock,
        )
        self.appended += len(result.events)
        return result
