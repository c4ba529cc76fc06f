"""Every field a writer's SQL can set, a ``Draft`` sets too, through both writers: the event's
version, what caused it, its correlation id and the time it happened (default: the append's)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest

from streams.clock import ManualClock
from streams.envelopes import decode_event
from streams.errors import EnvelopeError
from tests.support.outbox import OutboxBackend, drafts

LIMIT = 256 * 1024
THEN = datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=2)))


def test_every_field_reaches_the_envelope(outbox_backend: OutboxBackend) -> None:
    clock = ManualClock(datetime(2027, 3, 4, 5, 6, 7, tzinfo=UTC))
    store = outbox_backend.store(clock=clock)
    base = drafts("proj-a", 2)
    full = dataclasses.replace(
        base[0],
        event_version=2,
        caused_by="evt_cause",
        correlation_id="corr-7",
        occurred_at=THEN,
        resource="src/a.py",
        canonical_generation=3,
    )
    with store.transaction() as unit:
        result = unit.append("proj-a", [full, base[1]], tenant_id="tenant-t")
    sent = {
        row.event_id: decode_event(row.envelope, max_bytes=LIMIT)
        for row in store.sendable(10, 10, None)
    }
    for event in (result.events[0], sent[full.event_id]):
        assert (event.event_version, event.caused_by, event.correlation_id) == (
            2,
            "evt_cause",
            "corr-7",
        )
        assert (event.resource, event.canonical_generation) == ("src/a.py", 3)
        # In UTC, to the millisecond.
        assert event.timestamp == datetime(1999, 12, 31, 21, 59, 59, 999000, tzinfo=UTC)
    plain = sent[base[1].event_id]
    assert (plain.event_version, plain.caused_by, plain.correlation_id) == (1, None, None)
    assert plain.timestamp == result.events[1].timestamp == clock.now()  # the append's time
    if outbox_backend.schema is not None:  # the columns a SQL writer would have set
        assert outbox_backend.query(
            "SELECT event_version, caused_by, correlation_id, "
            "to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') FROM outbox "
            f"WHERE event_id = '{full.event_id}'"
        ) == [(2, "evt_cause", "corr-7", "1999-12-31 21:59:59.999")]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"occurred_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))}, "timestamp"),
        ({"occurred_at": datetime(2026, 1, 1)}, "timestamp"),
        ({"event_version": 0}, "eventVersion"),
        ({"caused_by": "x" * 201}, "causedBy"),
        ({"correlation_id": "a\nb"}, "correlationId"),
    ],
)
def test_a_bad_field_is_refused_naming_it(
    outbox_backend: OutboxBackend, change: dict[str, object], field: str
) -> None:
    store = outbox_backend.store()
    bad = dataclasses.replace(drafts("proj-a", 1)[0], **change)  # type: ignore[arg-type]
    with pytest.raises(EnvelopeError) as refused, store.transaction() as unit:
        unit.append("proj-a", [bad], tenant_id="tenant-t")
    assert refused.value.field == field
    assert store.last_slot("proj-a") == 0
