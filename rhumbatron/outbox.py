"""Writing events from your own service, in its own PostgreSQL transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from router.settings import Settings
from streams.envelopes import Draft
from streams.outbox.postgres_writer import append as append_rows
from streams.outbox.store import AppendResult


def append(
    conn: psycopg.Connection[Any],
    drafts: Draft | Sequence[Draft],
    *,
    tenant_id: str,
    seen_slot: int | None = None,
    strict: bool = False,
    settings: Settings | None = None,
) -> AppendResult:
    """Append one project's events in ``conn``'s open transaction; the caller commits, so the
    events are written with the service's own change or not at all (docs/outbox.md).

    Each draft is checked as the publisher and the outbox's INSERT check it (the envelope's
    fields, and the payload of a cataloged type: docs/catalog.md); a refused one raises
    ``EnvelopeError`` naming the field, and nothing is written. ``seen_slot``: the highest
    slot the writer has seen; the events others appended since come back in
    ``result.missed``, or, with ``strict``, the append is refused (``SlotConflict``). The size
    limit and the missed-report limit are the settings' (``max_envelope_bytes``,
    ``outbox_missed_report_limit``)."""
    settings = settings or Settings()
    return append_rows(
        conn,
        drafts,
        tenant_id=tenant_id,
        seen_slot=seen_slot,
        strict=strict,
        max_envelope_bytes=settings.max_envelope_bytes,
        missed_report_limit=settings.outbox_missed_report_limit,
    )
