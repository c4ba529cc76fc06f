"""Envelopes decoded from bytes that nearly are one: a valid Event's or Command's wire bytes cut,
with bytes changed, inserted or removed, a key given twice, a value nested deep, numbers past
64 bits, a field the model does not know (a newer writer's, or one of no camelCase name). Whatever the bytes, decoding either refuses them with an EnvelopeError that names a
field and a reason, or gives an envelope that encodes (with and without its wire bytes) and
decodes back equal: nothing a reader accepts can fail later where it is written again.

test_envelopes.py and test_envelope_fast_paths.py fuzz the fields of a parsed object; these
work on the bytes.

``RHUMBATRON_PROPERTY_EXAMPLES`` scales the examples in `make test` (here 10 times it, the
decoder being fast); the ``slow`` variant runs ``RHUMBATRON_SOAK_EXAMPLES``.
"""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.envelopes import (
    MAX_NESTING,
    Command,
    Event,
    _Envelope,
    decode,
    decode_with_wire,
    encode,
)
from streams.errors import EnvelopeError

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30")) * 10
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "5000")) * 4
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
LIMIT = 64 * 1024

EVENT = orjson.dumps(
    {
        "eventId": "evt_" + "0123456789abcdef" * 2,
        "eventType": "task.started",
        "eventVersion": 1,
        "tenantId": "tenant-1",
        "projectId": "proj-1",
        "changeId": "chg-1",
        "taskId": "task-1",
        "actor": "agent:a",
        "timestamp": "2026-03-01T12:00:00.123Z",
        "payload": {"agentId": "a", "list": [1, 2.5, None, True], "nested": {"k": "v"}},
        "slot": 3,
    }
)
COMMAND = orjson.dumps(
    {
        "commandId": "cmd_x-1",
        "commandType": "agent.wake",
        "projectId": "proj-1",
        "attempt": 1,
        "createdAt": "2026-03-01T12:00:00.123Z",
        "deadline": "2026-03-01T13:00:00.123Z",
        "payload": {"agentId": "a"},
    }
)
BASES = {Event: EVENT, Command: COMMAND}
# Unknown fields' names (camelCase ones are kept, others refused) and values.
EXTRA_NAMES = [b"newField", b"traceState", b"a", b"x9Y", b"new_field", b"New", b"", b"\\u0041b"]
EXTRA_VALUES = [
    b"null",
    b"1",
    b"-0",
    b"1e3",
    b'"s"',
    b"[1,[null]]",
    b'{"k":{}}',
    b"[" * 300 + b"]" * 300,
]
# Bytes that mean something in JSON, for insertions and replacements.
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"null", b"1e999", b"-0", b"\xff"]


@st.composite
def mutations(draw: st.DrawFn, base: bytes) -> bytes:
    raw = base
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(["cut", "change", "insert", "remove", "twice", "nest", "big", "extra"])
        )
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if how == "cut":
            raw = raw[:at]
        elif how == "change":
            raw = (
                raw[:at]
                + draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=2))
                + raw[at + 1 :]
            )
        elif how == "insert":
            raw = (
                raw[:at]
                + draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=3))
                + raw[at:]
            )
        elif how == "remove":
            raw = raw[:at] + raw[at + draw(st.integers(1, 5)) :]
        elif how == "twice":  # a key given twice: the last wins, as orjson reads it
            raw = (
                raw[:-1] + b',"projectId":' + draw(st.sampled_from([b'"p2"', b"1", b"null"])) + b"}"
            )
        elif how == "extra":  # an unknown field, last (as encode writes it) or first
            field = (
                b'"'
                + draw(st.sampled_from(EXTRA_NAMES))
                + b'":'
                + draw(st.sampled_from(EXTRA_VALUES))
            )
            if draw(st.booleans()):
                raw = raw[:-1] + b"," + field + b"}" if raw.endswith(b"}") else raw + field
            else:
                raw = b"{" + field + b"," + raw[1:]
        elif how == "nest":
            depth = draw(st.integers(MAX_NESTING - 4, 1100))
            raw = raw.replace(
                b'"payload":{', b'"payload":{"deep":' + b"[" * depth + b"]" * depth + b",", 1
            )
        else:
            raw = raw.replace(
                b'"slot":3',
                b'"slot":'
                + draw(
                    st.sampled_from(
                        [b"18446744073709551616", b"1e3", b"3.0", b"-9223372036854775809"]
                    )
                ),
                1,
            )
    return raw


def holds(model: type[_Envelope], raw: bytes) -> None:
    """Refused naming a field and a reason, or decoded into an envelope that is written again."""
    try:
        envelope = decode(model, raw, max_bytes=LIMIT)
    except EnvelopeError as exc:
        assert exc.field and exc.reason, exc
        with pytest.raises(EnvelopeError):
            decode_with_wire(model, raw, max_bytes=LIMIT)
        return
    wire = encode(envelope, max_bytes=LIMIT)
    assert decode(model, wire, max_bytes=LIMIT) == envelope
    again, kept = decode_with_wire(model, raw, max_bytes=LIMIT)
    assert again == envelope and kept in (raw, None)


@PROPERTY
@given(st.sampled_from([Event, Command]), st.data())
def test_near_valid_bytes_are_refused_or_written_back(
    model: type[_Envelope], data: st.DataObject
) -> None:
    holds(model, data.draw(mutations(BASES[model])))


@pytest.mark.slow
@SOAK
@given(st.sampled_from([Event, Command]), st.data())
def test_near_valid_bytes_soak(model: type[_Envelope], data: st.DataObject) -> None:
    holds(model, data.draw(mutations(BASES[model])))


def test_an_envelope_nested_deeper_than_can_be_written_is_refused_naming_the_field() -> None:
    # orjson reads JSON nested deeper than it writes: such an event decoded, then failed with a
    # TypeError wherever it was encoded again (the PostgreSQL publisher's pass, a reader keeping
    # wire bytes), stopping that pass or partition on every try.
    def nested(containers: int) -> bytes:
        # The envelope's object and the payload's are two of the containers.
        depth = containers - 2
        return EVENT.replace(
            b'"payload":{', b'"payload":{"d":' + b"[" * depth + b"]" * depth + b",", 1
        )

    holds(Event, nested(MAX_NESTING))
    with pytest.raises(EnvelopeError) as refused:
        decode(Event, nested(MAX_NESTING + 1), max_bytes=LIMIT)
    assert refused.value.field == "payload"
    assert f"nested {MAX_NESTING + 1} levels deep" in str(refused.value)
