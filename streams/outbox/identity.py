"""An outbox's identity: which outbox's slot numbering an event's slot belongs to.

Slots are numbered per outbox: two outboxes may publish the same project with overlapping slots.
Each outbox therefore holds an id of its own, ``obx_`` + 16 lowercase hex characters, made once
when the outbox is made and stored in its database (table ``outbox_identity``: SQLite's schema,
PostgreSQL's schema version 3), so it travels with the data: the same database reached under
another address, or restored from a backup, has the same identity. The publisher reads it when it
starts and sets it on every event it sends (header :data:`streams.headers.OUTBOX`); a consumer
reads ``(outbox_id, slot)`` back with :func:`outbox_position`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from streams.envelopes import Event
from streams.headers import OUTBOX

PREFIX = "obx_"
# Short on purpose: consumers put it in key names (Redis). 64 random bits: two outboxes sharing
# an id is as likely as two of 2^32 outboxes colliding.
_ID = re.compile(r"obx_[0-9a-f]{16}")
# The same grammar, as the PostgreSQL schema's CHECK spells it.
ID_PATTERN = "^obx_[0-9a-f]{16}$"


def new_outbox_id() -> str:
    return PREFIX + secrets.token_hex(8)


def is_outbox_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


class OutboxPosition(NamedTuple):
    """Where an event stands in its outbox: the outbox's identity and the event's slot there."""

    outbox_id: str
    slot: int


def outbox_position(
    headers: Iterable[tuple[str, object]] | Mapping[str, object] | None, event: Event
) -> OutboxPosition | None:
    """``(outbox_id, slot)`` of a record published from an outbox: its ``outbox`` header and the
    decoded event's slot. Never raises: None whenever either is missing or malformed, which a
    caller reads as "no outbox identity" (an event produced by other means than an outbox
    publisher, one published by a PostgreSQL outbox below schema version 3, or a header someone
    else wrote). Malformed means: ``headers`` not an iterable of ``(name, value)`` pairs (the
    Kafka client gives None for a record without headers; a mapping of name to value, as
    :func:`streams.headers.header_dict` makes, is read too), an ``outbox`` value that is not
    ``obx_`` + 16 lowercase hex characters in ASCII, two ``outbox`` headers that disagree, or a
    slot that is not a whole number of at least 1."""
    slot = getattr(event, "slot", None)
    if type(slot) is not int or slot < 1 or headers is None:
        return None
    try:
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    except Exception:  # whatever a caller passed that does not iterate: no identity
        return None
    found: str | None = None
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or pair[0] != OUTBOX:
            continue
        value = _text(pair[1])
        if value is None or not is_outbox_id(value) or found not in (None, value):
            return None
        found = value
    return None if found is None else OutboxPosition(found, slot)


def _text(raw: object) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            return bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            return None
    return None
