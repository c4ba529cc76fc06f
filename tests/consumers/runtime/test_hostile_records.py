"""Records nobody of ours wrote, on a stream: bytes that are not an event, JSON that nearly is one,
a record with no value, and headers Kafka allows but no producer of ours writes (a name with no
value, bytes that are not UTF-8, huge values, a name given twice, our own names carrying lies).

Each such record is dead-lettered as poison once, its letter naming what was wrong and holding
its value and headers exactly as they came; every real event around it, hostile headers or not,
is applied once and in slot order. On the in-memory twin, with tracing off and on (the trace
context is read from the headers); the chaos matrix's row 9 does the same on Kafka.

``RHUMBATRON_PROPERTY_EXAMPLES`` sets the examples in `make test`; the ``slow`` variant runs
``RHUMBATRON_SOAK_EXAMPLES``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind
from streams.envelopes import MAX_NESTING, decode_event, encode
from streams.errors import EnvelopeError
from streams.headers import EVENT_ID, EVENT_TYPE, ORIGIN_OFFSET, PREFIX
from streams.tracing import TRACEPARENT, TRACESTATE
from tests.support.runtime_harness import LIMIT, REDELIVERY, World, event
from tests.support.tracing import installed_provider

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30"))
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "3000"))
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)

PROJECTS = ("alpha", "beta", "gamma")
Headers = tuple[tuple[str, bytes | None], ...]

# A real event's wire bytes, the base of the near-valid values.
VALID = encode(event("alpha", 1), max_bytes=LIMIT)

header_names = st.one_of(
    st.sampled_from(
        [
            TRACEPARENT,
            TRACESTATE,
            EVENT_TYPE,
            EVENT_ID,
            ORIGIN_OFFSET,
            PREFIX + "dead_letter_id",
            PREFIX + "error",
            "dlq.id",
            "content_type",
            "",
        ]
    ),
    st.text(max_size=20),
)
header_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"\xff\xfe\xfd",  # not UTF-8
            b"\xc3",  # a UTF-8 sequence cut short
            b"00-" + b"f" * 32 + b"-" + b"f" * 16 + b"-01",  # a sampled traceparent, all f
            b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-00",  # the invalid all-zero one
            b"zz-" + b"g" * 32 + b"-" + b"h" * 16 + b"-0x",  # traceparent-shaped garbage
            b"9" * 5000,  # a number no int() reads (over Python's digit limit)
            b"-1",
        ]
    ),
    st.integers(1000, 200_000).map(lambda n: b"x" * n),  # huge
)
hostile_headers = st.lists(st.tuples(header_names, header_values), max_size=6).map(tuple)


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    """A real event's bytes, spoilt one way: cut short, a byte changed, a field dropped or given a
    wrong value, wrapped, doubled."""
    how = draw(st.sampled_from(["cut", "byte", "drop", "wrong", "wrap", "twice", "deep"]))
    if how == "cut":
        return VALID[: draw(st.integers(0, len(VALID) - 1))]
    if how == "byte":
        at = draw(st.integers(0, len(VALID) - 1))
        b = draw(st.integers(0, 255).filter(lambda b: b != VALID[at]))
        return VALID[:at] + bytes([b]) + VALID[at + 1 :]
    obj = orjson.loads(VALID)
    name = draw(st.sampled_from(sorted(obj)))
    if how == "drop":
        del obj[name]
        if name == "payload":  # optional: leaving it out is still an event
            obj["eventId"] = "evt_bad"
    elif how == "wrong":
        obj[name] = draw(st.sampled_from([None, "", 0, -1, [], {}, "x" * 300, "\x00"]))
        if name == "payload" and obj[name] == {}:
            obj["slot"] = 0
    elif how == "wrap":
        return orjson.dumps([obj])
    elif how == "twice":
        return VALID + VALID
    else:  # a payload nested deeper than an envelope may be, or than a JSON parser goes
        depth = draw(st.integers(MAX_NESTING - 1, 1100))
        obj["payload"] = {"deep": orjson.Fragment(b"[" * depth + b"]" * depth)}
    return orjson.dumps(obj)


def _decodes(value: bytes | None) -> bool:
    try:
        decode_event(value, max_bytes=LIMIT)
    except EnvelopeError:
        return False
    return True


# A spoilt value that happens to be an event still is one: such a draw is not hostile.
hostile_values = st.one_of(st.none(), st.binary(max_size=80), near_valid()).filter(
    lambda v: not _decodes(v)
)


@dataclass(frozen=True)
class Step:
    """One record published: a real event (``n`` of ``project``), or a hostile value."""

    project: str
    n: int  # 0: a hostile record
    value: bytes | None
    headers: Headers


@st.composite
def logs(draw: st.DrawFn) -> list[Step]:
    count = dict.fromkeys(PROJECTS, 0)
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 25))):
        project = draw(st.sampled_from(PROJECTS))
        headers = draw(st.one_of(st.just(()), hostile_headers))
        if draw(st.booleans()):
            count[project] += 1
            steps.append(Step(project, count[project], None, headers))
        else:
            steps.append(Step(project, 0, draw(hostile_values), headers))
    return steps


Where = tuple[str, int, int]  # topic, partition, offset


def run(world: World, steps: list[Step]) -> dict[Where, Step]:
    """Publish the steps on their projects' partitions and drain a ledger; the hostile records
    by where they are."""
    hostile: dict[Where, Step] = {}
    for step in steps:
        tp = world.tp_of(step.project)
        value = encode(event(step.project, step.n), max_bytes=LIMIT) if step.n else step.value
        offset = world.log.append(
            tp.topic,
            tp.partition,
            value,
            step.project.encode(),
            step.headers,  # type: ignore[arg-type]
        )
        if not step.n:
            hostile[(tp.topic, tp.partition, offset)] = step
    world.drain(world.runner())
    return hostile


def check(world: World, steps: list[Step], hostile: dict[Where, Step]) -> None:
    note(f"steps: {steps}")
    real = {p: sum(1 for s in steps if s.project == p and s.n) for p in PROJECTS}
    assert world.ledger() == {p: list(range(1, n + 1)) for p, n in real.items() if n}
    assert set(world.ledger_counts().values()) <= {1}
    letters = world.dead.list()
    assert all(letter.kind == LetterKind.POISON for letter in letters), letters
    by_record = {(d.source_topic, d.source_partition, d.offsets[0]): d for d in letters}
    assert len(by_record) == len(letters) == len(hostile)  # one letter each, no more
    for key, step in hostile.items():
        letter: DeadLetter = by_record[key]
        assert len(letter.entries) == 1 and letter.attempts == 1
        entry: Entry = letter.entries[0]
        assert entry.value == step.value and entry.headers == list(step.headers)
        assert letter.error.strip(), "a poison letter must say what was wrong"


@PROPERTY
@given(logs())
def test_hostile_records_are_dead_lettered_once_and_real_events_applied_once(
    steps: list[Step],
) -> None:
    world = World()
    check(world, steps, run(world, steps))


@PROPERTY
@given(logs())
def test_the_same_with_tracing_on(steps: list[Step]) -> None:
    with installed_provider():
        world = World()
        check(world, steps, run(world, steps))


@pytest.mark.slow
@SOAK
@given(logs())
def test_hostile_records_soak(steps: list[Step]) -> None:
    world = World()
    check(world, steps, run(world, steps))


def test_a_poison_record_with_headers_that_have_no_value_is_dead_lettered_as_it_came() -> None:
    # A Kafka header may have no value; the letter's JSON once had no way to write one, and the
    # write failed on every try: the partition stopped for good behind that record.
    world = World()
    tp = world.tp_of("alpha")
    headers = (("note", None), ("note", b"\xff\xfe"), (TRACEPARENT, None))
    world.log.append(tp.topic, tp.partition, b"not json", b"alpha", headers)  # type: ignore[arg-type]
    world.publish(event("alpha", 1))
    world.drain(world.runner())
    assert world.ledger() == {"alpha": [1]}
    (letter,) = world.dead.list()
    assert letter.kind == LetterKind.POISON and "not valid JSON" in letter.error
    assert letter.entries[0].headers == list(headers)


def test_a_traceparent_with_no_value_does_not_stop_a_traced_batch() -> None:
    with installed_provider():
        world = World()
        tp = world.tp_of("alpha")
        value = encode(event("alpha", 1), max_bytes=LIMIT)
        world.log.append(tp.topic, tp.partition, value, b"alpha", ((TRACEPARENT, None),))  # type: ignore[arg-type]
        world.drain(world.runner())
        assert world.ledger() == {"alpha": [1]} and world.dead.list() == []


def test_a_redelivery_naming_an_offset_no_integer_reads_is_poison() -> None:
    # 5,000 digits pass isdigit(); int() refuses them past Python's digit limit, and that
    # ValueError stopped the partition's every batch. The operator's retry never writes one.
    world = World()
    world.publish(event("alpha", 1))
    partition = world.policy().redelivery_partition(world.tp_of("alpha"))
    assert partition is not None
    for offset in (b"9" * 5000, b"99999999999999999999"):  # past int64 too
        world.log.append(
            REDELIVERY,
            partition,
            encode(event("alpha", 2), max_bytes=LIMIT),
            b"alpha",
            ((ORIGIN_OFFSET, offset),),
        )
    world.drain(world.runner())
    assert world.ledger() == {"alpha": [1]}
    letters = world.dead.list()
    assert [d.kind for d in letters] == [LetterKind.POISON] * 2
    assert all("rh.origin_offset" in d.error for d in letters)
