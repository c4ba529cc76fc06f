from __future__ import annotations

import string
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.envelopes import Command, Event, build, decode_command, decode_event, encode
from streams.errors import EnvelopeError, EnvelopeTooLarge
from streams.ids import new_event_id

LIMIT = 64 * 1024

names = st.text(alphabet=string.ascii_letters + string.digits + "-_:.", min_size=1, max_size=40)
json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
event_types = st.sampled_from(
    ["task.completed", "project.created", "canonical.advanced", "agent.woken"]
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    return build(
        Event,
        event_id=new_event_id(),
        event_type=draw(event_types),
        event_version=draw(st.integers(1, 5)),
        tenant_id=draw(names),
        project_id=draw(names),
        change_id=draw(st.none() | names),
        task_id=draw(st.none() | names),
        actor=draw(names),
        resource=draw(st.none() | st.text(max_size=30)),
        canonical_generation=draw(st.none() | st.integers(0, 10**6)),
        caused_by=draw(st.none() | names),
        correlation_id=draw(st.none() | names),
        timestamp=draw(times),
        payload=draw(st.dictionaries(st.text(max_size=10), json_values, max_size=5)),
        slot=draw(st.none() | st.integers(1, 10**9)),
    )


@given(events())
def test_good_events_round_trip_byte_stable(event: Event) -> None:
    wire = encode(event, max_bytes=LIMIT)
    back = decode_event(wire, max_bytes=LIMIT)
    assert back == event
    assert encode(back, max_bytes=LIMIT) == wire


def _valid_event_dict() -> dict[str, object]:
    data: dict[str, object] = orjson.loads(
        encode(
            build(
                Event,
                event_id=new_event_id(),
                event_type="task.started",
                tenant_id="t1",
                project_id="p1",
                task_id="task-1",
                actor="agent:a",
                timestamp=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
                payload={"agentId": "a"},
                slot=1,
            ),
            max_bytes=LIMIT,
        )
    )
    return data


# Each entry: the wire field to corrupt and values that must all be refused for it.
BAD_VALUES: dict[str, list[object]] = {
    "eventId": ["evt_123", "EVT_" + "a" * 32, "evt_" + "g" * 32, 7, None, ""],
    "eventType": ["Task.Completed", "task", "task..x", 3, "", None],
    "eventVersion": [0, -1, "1", 1.5, None],
    "tenantId": ["", None, 5, "x" * 201, "a\nb"],
    "projectId": ["", None, 5, ["p"]],
    "changeId": ["", 5, {"a": 1}],
    "actor": ["", None, 1],
    "canonicalGeneration": [-1, "1", 1.5],
    "timestamp": [
        "2026-01-02 03:04:05",
        "2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05.678",
        1700000000,
        None,
    ],
    "payload": [[], "x", 1, None],
    "slot": [0, -3, "2", 2.0],
}


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, vs in BAD_VALUES.items() for v in vs])
def test_bad_field_values_are_refused_naming_the_field(field: str, value: object) -> None:
    data = _valid_event_dict()
    data[field] = value
    with pytest.raises(EnvelopeError) as info:
        decode_event(orjson.dumps(data), max_bytes=LIMIT)
    assert info.value.field == field
    assert f"'{field}'" in str(info.value)


@given(st.sampled_from(sorted(BAD_VALUES)), st.data())
def test_generated_bad_inputs_are_all_refused(field: str, data: st.DataObject) -> None:
    wire = _valid_event_dict()
    good = wire.get(field)
    bad = data.draw(
        (
            st.integers(-(2**63), 2**63 - 1)
            | st.text(max_size=30)
            | st.lists(st.integers(0, 9), max_size=2)
            | st.booleans()
        ).filter(lambda v: v != good and not _acceptable(field, v))
    )
    wire[field] = bad
    with pytest.raises(EnvelopeError) as info:
        decode_event(orjson.dumps(wire), max_bytes=LIMIT)
    assert info.value.field == field


def _acceptable(field: str, value: object) -> bool:
    """Values the schema legitimately accepts for the field (so they are not 'bad')."""
    import re

    if isinstance(value, bool):
        return False
    if field == "eventId":
        return isinstance(value, str) and re.fullmatch(r"evt_[0-9a-f]{32}", value) is not None
    if field == "eventType":
        return (
            isinstance(value, str)
            and re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+", value) is not None
        )
    if field in ("tenantId", "projectId", "changeId", "actor"):
        return (
            isinstance(value, str) and 0 < len(value) <= 200 and all(ord(c) >= 0x20 for c in value)
        )
    if field in ("eventVersion", "slot"):
        return isinstance(value, int) and value >= 1
    if field == "canonicalGeneration":
        return isinstance(value, int) and value >= 0
    if field == "timestamp":
        return (
            isinstance(value, str)
            and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value) is not None
        )
    if field == "payload":
        return isinstance(value, dict)
    return False


@given(st.binary(max_size=200))
def test_garbage_bytes_are_refused_not_crashing(raw: bytes) -> None:
    try:
        decode_event(raw, max_bytes=LIMIT)
    except EnvelopeError:
        return
    raise AssertionError("garbage decoded into an Event")  # pragma: no cover


def test_missing_fields_and_unknown_fields_of_no_camelcase_name_are_named() -> None:
    data = _valid_event_dict()
    del data["projectId"]
    with pytest.raises(EnvelopeError, match="'projectId' = <missing>: required field is missing"):
        decode_event(orjson.dumps(data), max_bytes=LIMIT)
    data = _valid_event_dict()
    data[""] = 3  # found by the near-valid-bytes soak: the error named the field ''
    with pytest.raises(EnvelopeError, match="""field '""' = 3: unknown field""") as refused:
        decode_event(orjson.dumps(data), max_bytes=LIMIT)
    assert refused.value.field == '""'
    for name in ("task_idd", "Surprise", "1st", "with-dash", "x" * 65, "caf\u00e9"):
        data = {**_valid_event_dict(), name: 1}
        with pytest.raises(EnvelopeError, match="unknown field.*camelCase name") as refused:
            decode_event(orjson.dumps(data), max_bytes=LIMIT)
        assert refused.value.field == name


def test_an_unknown_camelcase_field_is_kept_and_written_back_after_the_known_ones() -> None:
    # A writer one release ahead added an optional field: a reader of this release keeps it.
    valid = _valid_event_dict()
    data = {**valid, "surprise": 1, "traceState": {"a": [None, 2.5]}, "gone": None}
    wire = orjson.dumps(data)
    event = decode_event(wire, max_bytes=LIMIT)
    assert event.model_extra == {"surprise": 1, "traceState": {"a": [None, 2.5]}, "gone": None}
    assert encode(event, max_bytes=LIMIT) == wire
    # Written by hand with the unknown field first: kept, and written back last.
    first = {"surprise": 1, **valid}
    again = decode_event(orjson.dumps(first), max_bytes=LIMIT)
    assert encode(again, max_bytes=LIMIT) == orjson.dumps({**valid, "surprise": 1})


def test_an_unknown_field_in_python_must_hold_json() -> None:
    fields = decode_event(orjson.dumps(_valid_event_dict()), max_bytes=LIMIT).model_dump()
    built = build(Event, **fields, newField=[1, {"k": None}])
    assert built.model_extra == {"newField": [1, {"k": None}]}
    with pytest.raises(EnvelopeError, match="'newField'.*must be plain JSON"):
        build(Event, **fields, newField={1, 2})
    with pytest.raises(EnvelopeError, match="'new_field'.*camelCase name"):
        build(Event, **fields, new_field=1)


extra_names = st.from_regex(r"\A[a-z][A-Za-z0-9]{0,20}\Z")


@given(events(), st.dictionaries(extra_names, json_values, max_size=4))
def test_events_with_unknown_fields_round_trip_byte_stable(
    event: Event, extra: dict[str, object]
) -> None:
    aliases = {info.alias for info in Event.model_fields.values()}
    unknown = {k: v for k, v in extra.items() if k not in aliases}
    wire = orjson.dumps({**orjson.loads(encode(event, max_bytes=LIMIT)), **unknown})
    back = decode_event(wire, max_bytes=LIMIT)
    assert {name: getattr(back, name) for name in Event.model_fields} == dict(event)
    assert back.model_extra == unknown
    assert encode(back, max_bytes=LIMIT) == wire


def test_oversized_envelope_is_refused_with_size_and_limit() -> None:
    data = _valid_event_dict()
    data["payload"] = {"blob": "x" * 5000}
    wire = orjson.dumps(data)
    with pytest.raises(EnvelopeTooLarge) as info:
        decode_event(wire, max_bytes=4096)
    assert info.value.size == len(wire)
    assert info.value.limit == 4096
    assert f"{len(wire)} bytes" in str(info.value) and "4096" in str(info.value)
    event = decode_event(wire, max_bytes=LIMIT)
    with pytest.raises(EnvelopeTooLarge):
        encode(event, max_bytes=4096)


def test_envelopes_are_frozen_and_strict_in_python() -> None:
    event = decode_event(orjson.dumps(_valid_event_dict()), max_bytes=LIMIT)
    with pytest.raises(Exception, match="frozen"):
        event.slot = 2  # type: ignore[misc]
    with pytest.raises(EnvelopeError, match="'slot'"):
        build(Event, **{**event.model_dump(), "slot": "3"})
    with pytest.raises(EnvelopeError, match="'timestamp'.*timezone"):
        build(Event, **{**event.model_dump(), "timestamp": datetime(2026, 1, 1)})


def test_command_round_trip_and_errors() -> None:
    command = build(
        Command,
        command_id="cmd_task-1_ready",
        command_type="agent.wake",
        project_id="p1",
        task_id="task-1",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        deadline=datetime(2026, 1, 2, tzinfo=UTC),
        payload={"agentId": "a"},
    )
    wire = encode(command, max_bytes=LIMIT)
    assert decode_command(wire, max_bytes=LIMIT) == command
    assert (
        b'"commandId":"cmd_task-1_ready"' in wire
        and b'"createdAt":"2026-01-01T00:00:00.000Z"' in wire
    )
    bad = orjson.loads(wire)
    bad["attempt"] = 0
    with pytest.raises(EnvelopeError, match="'attempt'"):
        decode_command(orjson.dumps(bad), max_bytes=LIMIT)
    bad = orjson.loads(wire)
    bad["commandId"] = "wake-1"
    with pytest.raises(EnvelopeError, match="'commandId'"):
        decode_command(orjson.dumps(bad), max_bytes=LIMIT)


@settings(max_examples=50)
@given(events())
def test_microseconds_are_canonicalised_to_milliseconds(event: Event) -> None:
    assert event.timestamp.microsecond % 1000 == 0
