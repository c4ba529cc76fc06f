"""What the publisher checks in a row it read, whoever wrote it.

Our writers store a valid envelope whose fields are the row's columns. A row written by hand —
SQL into PostgreSQL past the schema's checks, or into a SQLite file, whose columns take any type
— may hold anything: a column of the wrong type stopped every pass of the publisher, every
project with it; an envelope that is not one went to every subscription. So each row is checked
as it is read for sending: one that fails becomes ``failed`` with the reason and holds its
project (as a row the broker refuses does), the others flow. PostgreSQL's rows are decoded whole
(the publisher builds their canonical bytes anyway); SQLite's, written by our writer from a
validated event, are checked for shape (:func:`check_envelope`).

The rule a row must meet to be sent is one, :func:`event_bytes`, whoever checks it: the writers
before they store an event, the publisher as it reads a PostgreSQL row, and (generated from the
same catalog) the PostgreSQL schema's INSERT trigger. A cataloged type's payload must be its
model's (:meth:`streams.catalog.Catalog.check_payload`); an uncataloged type, or a version newer
than the catalog knows, passes as the publisher of an older release passes it.

A trace context that is not a JSON object of strings is not the event's fault: the event goes out
without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from streams.catalog import CATALOG
from streams.envelopes import Event, decode_event, encode
from streams.errors import EnvelopeError, StoredRowInvalid


def event_bytes(event: Event, *, max_bytes: int) -> bytes:
    """The event's canonical bytes if it may be sent: its payload is its cataloged model's and
    its encoding within ``max_bytes``; else EnvelopeError (EnvelopeTooLarge) naming the field."""
    CATALOG.check_payload("Event", event.event_type, event.event_version, event.payload)
    return encode(event, max_bytes=max_bytes)


def stored_event_bytes(text: str | bytes, *, max_bytes: int) -> bytes:
    """:func:`event_bytes` of an envelope as a PostgreSQL row reads (the server's JSON text,
    wider than the canonical encoding: the size limit is checked on the canonical bytes)."""
    return event_bytes(decode_event(text, max_bytes=max_bytes * 4), max_bytes=max_bytes)


def trace_context(raw: Any) -> dict[str, str]:
    """The writer's trace context from its column (JSON text, or already parsed); empty when the
    column holds nothing usable."""
    if not raw:
        return {}
    if isinstance(raw, str | bytes):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def envelope_bytes(raw: Any) -> bytes:
    """The envelope column as bytes: a BLOB, or text a hand-written row stored."""
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    if isinstance(raw, str):
        return raw.encode()
    raise StoredRowInvalid(f"envelope is a {type(raw).__name__}, not the event's JSON")


def whole(raw: Any, column: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise StoredRowInvalid(f"{column} {raw!r} is not a whole number")


def number(raw: Any, column: str) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    raise StoredRowInvalid(f"{column} {raw!r} is not a number")


def check_envelope(
    envelope: bytes, *, event_id: str, project_id: str, slot: int, event_type: str, max_bytes: int
) -> None:
    """The envelope is a JSON object within the size limit whose id, project, slot and type are
    the row's columns (the columns route the record and key it: an envelope of another project
    would land on that project's partition, out of its order).

    Parsed, not validated field by field (but a cataloged payload is checked against its model):
    that is the writer's work, and a full decode here cost
    the publisher an eighth of its time per row. An object that agrees with its row and is still
    no valid event (a bad timestamp, say) reaches the subscriptions, which dead-letter it as
    poison naming the field."""
    if len(envelope) > max_bytes:
        raise StoredRowInvalid(
            f"the stored event is {len(envelope)} bytes, over the {max_bytes}-byte limit "
            "(max_envelope_bytes)"
        )
    try:
        parsed = orjson.loads(envelope)
    except orjson.JSONDecodeError as exc:
        raise StoredRowInvalid(f"the stored event is not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise StoredRowInvalid(f"the stored event is a JSON {type(parsed).__name__}, not an object")
    for name, column, stored in (
        ("eventId", "event_id", event_id),
        ("projectId", "project_id", project_id),
        ("slot", "slot", slot),
        ("eventType", "event_type", event_type),
    ):
        value = parsed.get(name)
        if value != stored or type(value) is not type(stored):
            raise StoredRowInvalid(
                f"the stored event's {name} {value!r} is not the row's {column} {stored!r}"
            )
    version, payload = parsed.get("eventVersion", 1), parsed.get("payload", {})
    if type(version) is int and isinstance(payload, dict):
        # The one field-level check made here: a cataloged payload must be its model's, as the
        # writers and the PostgreSQL schema require (about a microsecond for a small payload).
        try:
            CATALOG.check_payload("Event", event_type, version, payload)
        except EnvelopeError as exc:
            raise StoredRowInvalid(f"the stored event's {exc.field} is invalid: {exc}") from exc
