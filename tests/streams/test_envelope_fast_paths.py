"""The envelope codec's fast paths against the plain forms they replace: ``format_time`` without
strftime for a UTC time, ``decode`` calling the model's validator directly, and ``encode``
building the wire object from the fields rather than through pydantic's JSON-mode dump. Each property
compares with the earlier form, written out here, so a fast path that wrote or refused anything
differently would fail. Fields the model does not know (a newer writer's) are among the inputs:
kept under a camelCase name, written back after the known fields."""

from __future__ import annotations

import dataclasses
import enum
import json
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from streams.envelopes import (
    Command,
    Event,
    _Envelope,
    _translate,
    decode,
    decode_command,
    decode_event,
    decode_with_wire,
    encode,
    format_time,
)
from streams.errors import EnvelopeError

MAX_BYTES = 4096


def strftime_form(value: datetime) -> str:
    """The canonical time as it was first written: strftime, then the milliseconds; the year in
    four digits (strftime alone writes 999 for 0999, which the decoder refuses)."""
    utc = value.astimezone(UTC)
    return (
        f"{utc.year:04d}" + utc.strftime("-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    )


def validated_form(model: type[_Envelope], data: bytes | str | None) -> _Envelope:
    """``decode`` as it was first written: model_validate on the parsed object."""
    kind = model.__name__
    if data is None:
        raise EnvelopeError(kind, "<envelope>", None, "record has no value")
    raw = data.encode() if isinstance(data, str) else data
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(kind, "<envelope>", raw[:60], f"not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise EnvelopeError(kind, "<envelope>", parsed, "must be a JSON object")
    try:
        return model.model_validate(parsed, by_alias=True)
    except ValidationError as exc:
        raise _translate(model, exc) from exc


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except EnvelopeError as exc:
        return "error", (type(exc), str(exc), exc.field, repr(exc.value), exc.reason)


offsets = st.one_of(
    st.just(UTC),
    st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)).map(timezone),
)
times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=offsets
)


@settings(max_examples=400, deadline=None)
@given(times)
def test_format_time_is_the_strftime_form(value: datetime) -> None:
    assert format_time(value) == strftime_form(value)


def test_format_time_keeps_the_strftime_form_of_early_years() -> None:
    for year in (1, 9, 99, 999, 1000):
        value = datetime(year, 5, 6, 7, 8, 9, 987654, tzinfo=UTC)
        assert format_time(value) == strftime_form(value)


def test_an_event_of_an_early_year_decodes_from_its_own_encoding() -> None:
    # A PostgreSQL writer's occurred_at of year 1 was published as '1-01-01T…', which every
    # subscription then dead-lettered as poison.
    for stamp in ("0001-01-01T00:00:00.000Z", "0999-12-31T23:59:59.999Z"):
        raw = wire({**BASE_EVENT, "timestamp": stamp})
        assert encode(decode_event(raw, max_bytes=MAX_BYTES), max_bytes=MAX_BYTES) == raw


BASE_EVENT: dict[str, Any] = {
    "eventId": "evt_" + "0123456789abcdef" * 2,
    "eventType": "task.started",
    "eventVersion": 1,
    "tenantId": "tenant-1",
    "projectId": "proj-1",
    "changeId": "chg-1",
    "taskId": "task-1",
    "actor": "agent:a",
    "timestamp": "2026-03-01T12:00:00.123Z",
    "payload": {"agentId": "a"},
    "slot": 3,
}
BASE_COMMAND: dict[str, Any] = {
    "commandId": "cmd_x-1",
    "commandType": "agent.wake",
    "projectId": "proj-1",
    "attempt": 1,
    "createdAt": "2026-03-01T12:00:00.123Z",
    "deadline": "2026-03-01T13:00:00.123Z",
    "payload": {},
}

# Values a field may be given: the right kinds and many wrong ones.
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "2026-03-01T12:00:00.123Z",
            "2026-03-01T12:00:00Z",
            "2026-02-30T12:00:00.123Z",
            "2026-03-01T12:00:00.123+00:00",
            "0999-03-01T12:00:00.123Z",
            "evt_" + "f" * 32,
            "cmd_ok",
            "a.b",
            "A.b",
            "x\x01y",
            "",
        ]
    ),
    st.lists(st.integers(-5, 5), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2),
)


def mutated(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    # Unknown fields too: camelCase ones are kept, any other name is refused.
    names = sorted(base) + ["extraField", "traceState", "event_id", "created_at", "Odd", "x_y"]
    changes = st.dictionaries(st.sampled_from(names), st.one_of(st.just(...), values), max_size=3)

    def apply(edits: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for name, value in edits.items():
            if value is ...:
                out.pop(name, None)
            else:
                out[name] = value
        return out

    return changes.map(apply)


def wire(obj: object) -> bytes:
    return orjson.dumps(obj)


raw_records = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.sampled_from(
        [b"[]", b"1", b'"x"', b"{", b"null", b"{}", "{}", b'{"slot": 99999999999999999999999}']
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(mutated(BASE_EVENT).map(wire), raw_records))
def test_decode_event_answers_as_model_validate(data: bytes | str | None) -> None:
    assert outcome(lambda: decode_event(data, max_bytes=MAX_BYTES)) == outcome(
        lambda: validated_form(Event, data)
    )


@settings(max_examples=200, deadline=None)
@given(st.one_of(mutated(BASE_COMMAND).map(wire), raw_records))
def test_decode_command_answers_as_model_validate(data: bytes | str | None) -> None:
    assert outcome(lambda: decode_command(data, max_bytes=MAX_BYTES)) == outcome(
        lambda: validated_form(Command, data)
    )


def test_the_generated_envelopes_reach_both_outcomes() -> None:
    # The properties above mean something only if valid envelopes decode and mutated ones fail.
    assert isinstance(decode(Event, wire(BASE_EVENT), max_bytes=MAX_BYTES), Event)
    assert isinstance(decode(Command, wire(BASE_COMMAND), max_bytes=MAX_BYTES), Command)
    refused = outcome(lambda: decode_event(wire({**BASE_EVENT, "slot": 0}), max_bytes=MAX_BYTES))
    assert refused[0] == "error"


def dumped_form(envelope: _Envelope) -> bytes:
    """``encode`` as it was first written: pydantic's JSON-mode dump, then orjson; the fields the
    model does not know after it, as they are (their nulls too)."""
    extra = envelope.model_extra or {}
    known = envelope.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude=set(extra) or None
    )
    return orjson.dumps({**known, **extra})


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int


# What a payload built in Python may hold: plain JSON, and kinds orjson and pydantic's JSON mode
# could write apart (times, enums, dataclasses, tuples, big integers, keys that are not strings).
odd_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=8),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=2))])),
    st.datetimes(),
    st.dates().map(date.isoformat),
    st.dates(),
    st.sampled_from([Colour.RED, Level.HIGH, Point(1), (1, "a"), b"bytes"]),
)
odd_values = st.recursive(
    odd_leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=3)
    ),
    max_leaves=8,
)


def outcome_of_encoding(envelope: _Envelope, fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(envelope)
    except Exception as exc:
        return "error", type(exc)


# What a newer writer's unknown fields may hold: plain JSON, nulls included.
plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
extras = st.dictionaries(st.sampled_from(["newField", "traceState", "zz9"]), plain_json, max_size=2)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([Event, Command]),
    st.dictionaries(st.text(max_size=4), odd_values, max_size=4),
    st.booleans(),
    extras,
)
def test_encode_writes_the_bytes_of_the_json_mode_dump(
    model: type[_Envelope],
    payload: dict[Any, Any],
    without_optionals: bool,
    extra: dict[str, Any],
) -> None:
    base = BASE_EVENT if model is Event else BASE_COMMAND
    fields = dict(model.__pydantic_validator__.validate_python(base, by_alias=True).__dict__)
    fields["payload"] = payload  # built in Python: not validated, as a processor's may be
    if without_optionals:
        for name in ("change_id", "task_id", "deadline", "slot"):
            if name in fields:
                fields[name] = None
    envelope = model.model_construct(**fields, **extra)
    assert envelope.model_extra == extra
    assert outcome_of_encoding(envelope, lambda e: encode(e, max_bytes=1 << 20)) == (
        outcome_of_encoding(envelope, dumped_form)
    )


def test_encode_reaches_both_of_its_paths() -> None:
    # The property means something only if payloads reach both the direct path and the dump.
    event = decode_event(wire(BASE_EVENT), max_bytes=MAX_BYTES)
    assert encode(event, max_bytes=MAX_BYTES) == dumped_form(event) == wire(BASE_EVENT)
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    odd = event.model_copy(update={"payload": {"at": moment, "colour": Colour.RED, "n": {1: (2,)}}})
    assert encode(odd, max_bytes=MAX_BYTES) == dumped_form(odd)
    assert b'"at":"2026-01-02T03:04:05Z"' in encode(odd, max_bytes=MAX_BYTES)
    newer = decode_event(wire({**BASE_EVENT, "newField": None}), max_bytes=MAX_BYTES)
    odd = newer.model_copy(update={"payload": {"at": moment}})
    assert encode(odd, max_bytes=MAX_BYTES) == dumped_form(odd)
    assert encode(odd, max_bytes=MAX_BYTES).endswith(b'"newField":null}')


# The bytes of a decodable object in the forms a writer other than ours may use: orjson's (the
# canonical one when the keys are the model's), keys in another order, spaces, escapes.
@st.composite
def written(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    obj = draw(mutated(base))
    if draw(st.booleans()):
        keys = draw(st.permutations(sorted(obj)))
        obj = {key: obj[key] for key in keys}
    form = draw(st.sampled_from(["orjson", "orjson", "spaced", "ascii"]))
    if form == "orjson":
        return orjson.dumps(obj)
    return json.dumps(obj, ensure_ascii=form == "ascii", separators=(",", ": ")).encode()


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([Event, Command]), st.data())
def test_decode_with_wire_keeps_the_bytes_exactly_when_encoding_gives_them_back(
    model: type[_Envelope], data: st.DataObject
) -> None:
    raw = data.draw(written(BASE_EVENT if model is Event else BASE_COMMAND))
    got = outcome(lambda: decode_with_wire(model, raw, max_bytes=MAX_BYTES))
    plain = outcome(lambda: decode(model, raw, max_bytes=MAX_BYTES))
    if plain[0] == "error":
        assert got == plain
        return
    envelope, kept = got[1]
    assert envelope == plain[1]
    canonical = encode(envelope, max_bytes=MAX_BYTES)
    assert kept == (raw if canonical == raw else None)


def test_decode_with_wire_reaches_both_answers() -> None:
    # The property means something only if canonical bytes are kept and others are not.
    for model, base in ((Event, BASE_EVENT), (Command, BASE_COMMAND)):
        raw = wire(base)
        assert decode_with_wire(model, raw, max_bytes=MAX_BYTES)[1] == raw
        assert decode_with_wire(model, raw.decode(), max_bytes=MAX_BYTES)[1] == raw
        for other in (
            json.dumps(base).encode(),  # spaced
            wire(dict(reversed(base.items()))),  # keys out of order
            wire({k: v for k, v in base.items() if k != "payload"}),  # a default left out
            wire({**base, "changeId": None}),  # null for an absent optional field
            wire({**base, "payload": {"e": "\u00e9"}}).replace("\u00e9".encode(), b"\\u00e9"),
            wire({"newField": 1, **base}),  # an unknown field before the known ones
            wire({**base, "changeId": None, "newField": 1}),  # a known null, an unknown field
        ):
            envelope, kept = decode_with_wire(model, other, max_bytes=MAX_BYTES)
            assert kept is None and encode(envelope, max_bytes=MAX_BYTES) != other
        # A newer writer's unknown fields, after the known ones (their nulls too): canonical.
        newer = wire({**base, "newField": {"a": [1, None]}, "gone": None})
        assert decode_with_wire(model, newer, max_bytes=MAX_BYTES)[1] == newer
    early = wire({**BASE_EVENT, "timestamp": "0999-03-01T12:00:00.123Z"})
    assert decode_with_wire(Event, early, max_bytes=MAX_BYTES)[1] == early
