"""The two envelopes on the wire: ``Event`` (an immutable fact) and ``Command`` (a request).

Pydantic v2 models, strict and frozen; Python names are snake_case, the wire form is camelCase
JSON written and read by orjson. The canonical encoding leaves out absent optional fields and
writes times as ``YYYY-MM-DDTHH:MM:SS.mmmZ``, so ``encode(decode(b)) == b`` for every canonical
``b``. Anything invalid raises :class:`~streams.errors.EnvelopeError` naming the wire field and
the value found there; an oversized envelope raises :class:`~streams.errors.EnvelopeTooLarge`.

Forward compatible (docs/contract.md, "Versions and forward compatibility"): a top-level field
this code does not know — one a newer writer added — is kept, not refused: it is read into the
envelope's extras (``model_extra``), ignored by consumers, and written back by ``encode`` after
the known fields in the order it came, so an envelope passes through (the archive, a
redelivery) as it was written. Its name must be a camelCase identifier
(:data:`EXTRA_FIELD_NAME`) and its value JSON; the nesting and size limits hold for it as for
the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from streams.errors import EnvelopeError, EnvelopeTooLarge

_TIME_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def _parse_time(value: object) -> object:
    """Accept an aware datetime (truncated to milliseconds) or the canonical string form."""
    # The wire's string first: it is what every decoded envelope carries.
    if isinstance(value, str):
        if not _TIME_FORMAT.match(value):
            raise ValueError("must be UTC in the form YYYY-MM-DDTHH:MM:SS.mmmZ")
        return datetime.fromisoformat(value)  # 3.11 reads the Z; the regex fixed the form
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("must carry a timezone (UTC)")
        value = value.astimezone(UTC)
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    raise ValueError("must be a UTC timestamp string YYYY-MM-DDTHH:MM:SS.mmmZ")


def format_time(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC, the milliseconds truncated."""
    if value.tzinfo is UTC and value.year >= 1000:
        # Every envelope's time is already UTC: isoformat is one C call where strftime plus
        # the milliseconds were three steps.
        return value.isoformat(timespec="milliseconds")[:-6] + "Z"
    utc = value.astimezone(UTC)
    # The year in four digits, as the form and the decoder require: strftime writes 999 for
    # 0999, and an event so stamped went out as a record no reader decodes.
    return (
        f"{utc.year:04d}" + utc.strftime("-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    )


Timestamp = Annotated[
    datetime,
    BeforeValidator(_parse_time),
    PlainSerializer(format_time, return_type=str, when_used="json"),
]
# No control characters (checked by the regex engine in pydantic-core, not in Python).
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]
EventId = Annotated[str, Field(pattern=r"^evt_[0-9a-f]{32}$")]
EventType = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$", max_length=100)]
CommandId = Annotated[str, Field(pattern=r"^cmd_[A-Za-z0-9_.:\-]{1,200}$")]
Payload = dict[str, Any]
# The name a field this code does not know must have to be kept: the wire's own camelCase form.
EXTRA_FIELD_NAME = re.compile(r"^[a-z][A-Za-z0-9]{0,63}$")


class _Envelope(BaseModel):
    model_config = ConfigDict(
        strict=True,
        frozen=True,
        # A field a newer writer added is kept and ignored (see the module's docstring).
        extra="allow",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_by_alias=True,
        validate_by_name=True,
    )

    @model_validator(mode="after")
    def _extras_checked(self) -> _Envelope:
        extra = self.__pydantic_extra__
        if extra:
            _check_extras(type(self).__name__, extra)
        return self


def _check_extras(kind: str, extra: dict[str, Any]) -> None:
    """A field this code does not know is kept only under a camelCase name, with a JSON value
    (what the wire can carry: an envelope built in Python could hold anything)."""
    for name, value in extra.items():
        if not EXTRA_FIELD_NAME.match(name):
            raise EnvelopeError(
                kind,
                name or '""',  # an empty key is named as JSON writes it
                value,
                "unknown field, and not one a newer writer may add: a field this version does "
                "not know is kept only under a camelCase name (letters and digits, starting "
                "with a lowercase letter, at most 64); check the spelling against the schema",
            )
        try:
            orjson.dumps(value, option=_PLAIN_JSON_ONLY)
        except TypeError as exc:
            raise EnvelopeError(
                kind,
                name,
                value,
                f"an unknown field's value must be plain JSON (objects with string keys, arrays, "
                f"strings, numbers, booleans, null), nested at most {MAX_NESTING} deep ({exc})",
            ) from exc


class Event(_Envelope):
    """An immutable fact. ``slot`` is the event's dense 1-based position in its project's log,
    assigned by the outbox; events entering by another door (the feed pump) carry none."""

    event_id: EventId
    event_type: EventType
    event_version: Annotated[int, Field(ge=1)] = 1
    tenant_id: Name
    project_id: Name
    change_id: Name | None = None
    task_id: Name | None = None
    actor: Name
    resource: Annotated[str, Field(max_length=1000)] | None = None
    canonical_generation: Annotated[int, Field(ge=0)] | None = None
    caused_by: Name | None = None
    correlation_id: Name | None = None
    timestamp: Timestamp
    payload: Payload = Field(default_factory=dict)
    slot: Annotated[int, Field(ge=1)] | None = None


class Command(_Envelope):
    """A request for work, carried on a command queue. Past ``deadline`` it is not executed."""

    command_id: CommandId
    command_type: EventType
    project_id: Name
    change_id: Name | None = None
    task_id: Name | None = None
    attempt: Annotated[int, Field(ge=1)] = 1
    created_at: Timestamp
    deadline: Timestamp | None = None
    payload: Payload = Field(default_factory=dict)


E = TypeVar("E", bound=_Envelope)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def _wire_name(model: type[_Envelope], loc: tuple[int | str, ...]) -> str:
    if not loc:
        return "<envelope>"
    # An empty key is named as JSON writes it, '""': an error must name what was wrong, and a
    # field named '' named nothing.
    parts = [str(part) or '""' for part in loc]
    head = loc[0]
    if isinstance(head, str) and head in model.model_fields:
        parts[0] = model.model_fields[head].alias or head
    return ".".join(parts)


def _translate(model: type[E], exc: ValidationError) -> EnvelopeError:
    error = exc.errors(include_url=False)[0]
    raised = error.get("ctx", {}).get("error")
    if isinstance(raised, EnvelopeError):  # the extras' check names its field itself
        return raised
    field = _wire_name(model, tuple(error["loc"]))
    reason = error["msg"]
    if error["type"] == "extra_forbidden":
        reason = "unknown field"
    elif error["type"] == "missing":
        reason = "required field is missing"
    value = MISSING if error["type"] == "missing" else error.get("input")
    return EnvelopeError(model.__name__, field, value, reason)


def build(model: type[E], /, **fields: Any) -> E:
    """Construct an envelope in Python, raising EnvelopeError (not ValidationError)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise _translate(model, exc) from exc


# Per envelope model, its fields in order: (Python name, wire name).
_WIRE_FIELDS: dict[type[_Envelope], tuple[tuple[str, str], ...]] = {}
# orjson hands these to ``default`` (none here, so it raises) instead of writing them its own way:
# a payload holding one is written by pydantic's JSON mode, as before.
_PLAIN_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _wire_fields(model: type[_Envelope]) -> tuple[tuple[str, str], ...]:
    fields = _WIRE_FIELDS.get(model)
    if fields is None:
        fields = _WIRE_FIELDS[model] = tuple(
            (name, info.alias or name) for name, info in model.model_fields.items()
        )
    return fields


def encode(envelope: _Envelope, *, max_bytes: int) -> bytes:
    """Canonical wire bytes: the known fields in the model's order, then the fields this code
    does not know in the order they came (their nulls too: they are written back as they were
    read). Raises EnvelopeTooLarge past ``max_bytes``.

    The wire object is built from the fields directly (pydantic's JSON-mode dump took two thirds
    of the time); a payload with anything but plain JSON values in it (a datetime, a dataclass,
    a subclass of str or int, a key that is not a string, an integer past 64 bits) is written
    by that dump, as before, so the bytes are the same either way."""
    values = envelope.__dict__
    extra = envelope.__pydantic_extra__
    wire: dict[str, Any] = {}
    for name, alias in _wire_fields(type(envelope)):
        value = values[name]
        if value is not None:
            # The envelopes' only datetime fields are Timestamps; the payload is a dict.
            wire[alias] = format_time(value) if type(value) is datetime else value
    if extra:
        wire.update(extra)
    try:
        data = orjson.dumps(wire, option=_PLAIN_JSON_ONLY)
    except TypeError:
        known = envelope.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude=set(extra) if extra else None
        )
        data = orjson.dumps({**known, **extra} if extra else known)
    if len(data) > max_bytes:
        raise EnvelopeTooLarge(type(envelope).__name__, len(data), max_bytes)
    return data


def decode(model: type[E], data: bytes | str | None, *, max_bytes: int) -> E:
    """Parse wire bytes into ``model``; every failure is an EnvelopeError naming what was wrong."""
    _, parsed = _parsed(model, data, max_bytes)
    return _validated(model, parsed)


def decode_with_wire(
    model: type[E], data: bytes | str | None, *, max_bytes: int
) -> tuple[E, bytes | None]:
    """:func:`decode`, and the bytes themselves when they are the envelope's canonical encoding
    (``encode(envelope) == data``), else None: a reader that writes the envelope on whole (the
    archiver) need not encode it again. Telling costs a fifth of encoding: the envelopes are
    strict (a wire value is the field's value, never coerced), so the bytes are canonical when
    their keys are the model's in order with none of a non-None default left out, no value is
    null, and orjson writes the parsed object back as the same bytes (no whitespace, escapes or
    other number forms); the fields this code does not know, after the known ones, are written
    back as they came."""
    raw, parsed = _parsed(model, data, max_bytes)
    envelope = _validated(model, parsed)
    return envelope, raw if _canonical(model, parsed, raw) else None


def _parsed(
    model: type[_Envelope], data: bytes | str | None, max_bytes: int
) -> tuple[bytes, dict[str, Any]]:
    kind = model.__name__
    if data is None:
        raise EnvelopeError(kind, "<envelope>", None, "record has no value")
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise EnvelopeTooLarge(kind, len(raw), max_bytes)
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(kind, "<envelope>", raw[:60], f"not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise EnvelopeError(kind, "<envelope>", parsed, "must be a JSON object")
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING:  # fewer brackets cannot nest deeper
        _check_nesting(kind, parsed)
    return raw, parsed


# orjson reads JSON nested deeper than it writes: at most this many containers, one in another,
# the envelope's own object included. An envelope nested deeper decoded, and then failed (not as
# an EnvelopeError) wherever it was encoded again: the publisher's pass, a reader keeping wire
# bytes, the dead-letter path.
MAX_NESTING = 254


def _check_nesting(kind: str, parsed: dict[str, Any]) -> None:
    for key, value in parsed.items():
        deepest, stack = 0, [(value, 2)]
        while stack:
            item, depth = stack.pop()
            if isinstance(item, dict | list):
                deepest = max(deepest, depth)
                stack.extend(
                    (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
                )
        if deepest > MAX_NESTING:
            raise EnvelopeError(
                kind,
                key or '""',  # an empty key is named as JSON writes it
                "<nested>",
                f"nested {deepest} levels deep; an envelope holds at most {MAX_NESTING}",
            )


def _validated(model: type[E], parsed: dict[str, Any]) -> E:
    try:
        # The model's validator itself: model_validate is this call behind one more frame.
        envelope: E = model.__pydantic_validator__.validate_python(parsed, by_alias=True)
    except ValidationError as exc:
        raise _translate(model, exc) from exc
    return envelope


# Per envelope model, the key sequences found to be canonical (the wire names in the model's
# order, none missing that encode would write): at most one per set of optional fields present.
# Sequences with unknown fields are judged each time, never kept: their names are the writers'
# to choose, and a set of them would grow with every new name.
_CANONICAL_KEYS: dict[type[_Envelope], set[tuple[str, ...]]] = {}
# Per envelope model, its wire names and their positions in the model's order.
_POSITIONS: dict[type[_Envelope], dict[str, int]] = {}


def _canonical(model: type[_Envelope], parsed: dict[str, Any], raw: bytes) -> bool:
    keys = tuple(parsed)
    known = _CANONICAL_KEYS.setdefault(model, set())
    if keys in known:
        if None in parsed.values():
            return False
    else:
        head = _known_head(model, keys)
        if head is None or not _canonical_keys(model, keys[:head]):
            return False
        if head == len(keys):
            known.add(keys)
        # A known field's null is left out by encode; an unknown one's is written back.
        if any(parsed[key] is None for key in keys[:head]):
            return False
    return orjson.dumps(parsed) == raw


def _positions(model: type[_Envelope]) -> dict[str, int]:
    positions = _POSITIONS.get(model)
    if positions is None:
        positions = _POSITIONS[model] = {
            alias: n for n, (_, alias) in enumerate(_wire_fields(model))
        }
    return positions


def _known_head(model: type[_Envelope], keys: tuple[str, ...]) -> int | None:
    """How many of ``keys`` are known wire names before the first unknown one; None when a
    known one follows an unknown one (``encode`` writes the unknown ones last)."""
    positions = _positions(model)
    head = 0
    while head < len(keys) and keys[head] in positions:
        head += 1
    if any(key in positions for key in keys[head:]):
        return None
    return head


def _canonical_keys(model: type[_Envelope], keys: tuple[str, ...]) -> bool:
    """Are ``keys`` the wire names ``encode`` writes, in its order, for some set of the model's
    own fields? (Fields this code does not know come after them: :func:`_known_head`.)"""
    fields = model.model_fields
    wire = _wire_fields(model)
    position = _positions(model)
    found = [position.get(key, -1) for key in keys]
    if -1 in found or found != sorted(set(found)):
        return False
    present = set(keys)
    # A field left out is decoded to its default: canonical only if encode leaves it out too.
    return all(
        alias in present
        for name, alias in wire
        if fields[name].is_required()
        or fields[name].get_default(call_default_factory=True) is not None
    )


def decode_event(data: bytes | str | None, *, max_bytes: int) -> Event:
    return decode(Event, data, max_bytes=max_bytes)


def decode_command(data: bytes | str | None, *, max_bytes: int) -> Command:
    return decode(Command, data, max_bytes=max_bytes)


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before the outbox gives it a slot (and, unless the writer says, a time): what a
    writer appends. Every field a writer's SQL ``INSERT`` can set is here; ``occurred_at`` is the
    envelope's ``timestamp`` (None: the time of the append)."""

    event_id: str
    event_type: str
    project_id: str
    change_id: str | None
    task_id: str | None
    actor: str
    payload: dict[str, object]
    canonical_generation: int | None = None
    resource: str | None = None
    event_version: int = 1
    caused_by: str | None = None
    correlation_id: str | None = None
    occurred_at: datetime | None = None

    def to_event(self, *, tenant_id: str, timestamp: datetime, slot: int | None) -> Event:
        """The event, stamped ``occurred_at`` if the draft has one, else ``timestamp``."""
        return build(
            Event,
            event_id=self.event_id,
            event_type=self.event_type,
            event_version=self.event_version,
            tenant_id=tenant_id,
            project_id=self.project_id,
            change_id=self.change_id,
            task_id=self.task_id,
            actor=self.actor,
            resource=self.resource,
            canonical_generation=self.canonical_generation,
            caused_by=self.caused_by,
            correlation_id=self.correlation_id,
            timestamp=self._in_range(timestamp if self.occurred_at is None else self.occurred_at),
            payload=self.payload,
            slot=slot,
        )

    @staticmethod
    def _in_range(value: datetime) -> datetime:
        # A time whose UTC instant falls outside years 1-9999 (year 1 at +01:00, say) cannot be
        # written in the wire's form; datetime itself overflows converting it.
        if value.tzinfo is not None:
            try:
                value.astimezone(UTC)
            except OverflowError:
                raise EnvelopeError(
                    "Event",
                    "timestamp",
                    value,
                    "in UTC it falls outside the years 0001-9999 the form YYYY-MM-DDTHH:MM:SS.mmmZ "
                    "can write",
                ) from None
        return value
