"""The archiver's lines, made from a prefix kept per partition, against the line as it was first
written (one join of its parts per event): the same bytes for any topic, partition, offset and
event, and a topic that is not an event stream still refused on every event. A part's offsets
read off its lines' starts against parsing every line."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.runtime.types import TP, Delivery, Phase
from consumers.subscriptions.archive.archiver import AuditArchiver, PartLimits
from consumers.subscriptions.archive.format import (
    decode_line,
    encode_line,
    line_offsets,
    offsets_line_by_line,
)
from streams.envelopes import Event, build, encode
from streams.errors import ArchiveFormatError
from tests.support.archive import MemoryObjects

LIMIT = 4096


def joined_line(tp: TP, offset: int, event: Event) -> bytes:
    return b"".join(
        (
            b'{"topic":',
            orjson.dumps(tp.topic),
            b',"partition":%d,"offset":%d,"event":' % (tp.partition, offset),
            encode(event, max_bytes=LIMIT),
            b"}",
        )
    )


def an_event(project: str, n: int) -> Event:
    return build(
        Event,
        event_id=f"evt_{n:032x}",
        event_type="task.created",
        tenant_id="t",
        project_id=project,
        actor="a",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        payload={"n": n, "text": project},
        slot=n + 1,
    )


def delivery(tp: TP, offset: int) -> Delivery:
    return Delivery(tp, offset, Phase.LIVE, True, 0)


@settings(max_examples=100, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=30),
    partition=st.integers(0, 10_000),
    offsets=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=4),
    project=st.text(
        alphabet=st.characters(min_codepoint=0x20, exclude_categories=["Cs"]),
        min_size=1,
        max_size=20,
    ),  # lone surrogates are not text an envelope can carry (refused by decode_event)
)
def test_lines_are_the_joined_form(
    topic: str, partition: int, offsets: list[int], project: str
) -> None:
    archiver = AuditArchiver(
        MemoryObjects(), PartLimits(10, 1 << 20, 60.0), {topic: 3}, max_envelope_bytes=LIMIT
    )
    tp = TP(topic, partition)
    for n, offset in enumerate(offsets):
        event = an_event(project, n)
        (line,) = archiver.process(event, None, delivery(tp, offset)).lines
        assert (
            line
            == joined_line(tp, offset, event)
            == encode_line(tp, offset, event, max_bytes=LIMIT)
        )
        assert decode_line(line, where="test").offset == offset


def test_a_topic_that_is_no_event_stream_is_refused_every_time() -> None:
    archiver = AuditArchiver(
        MemoryObjects(), PartLimits(10, 1 << 20, 60.0), {"s0": 0}, max_envelope_bytes=LIMIT
    )
    archiver.process(an_event("p", 0), None, delivery(TP("s0", 0), 0))
    for offset in (0, 1):
        with pytest.raises(ArchiveFormatError, match="not an event stream"):
            archiver.process(an_event("p", 1), None, delivery(TP("other", 0), offset))


@settings(max_examples=150, deadline=None)
@given(
    topic=st.one_of(
        st.text(min_size=1, max_size=20), st.from_regex(r"[a-z0-9._-]{1,20}", fullmatch=True)
    ),
    partition=st.integers(0, 10_000),
    offsets=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=6),
)
def test_a_parts_offsets_are_those_of_parsing_every_line(
    topic: str, partition: int, offsets: list[int]
) -> None:
    tp = TP(topic, partition)
    lines = [encode_line(tp, o, an_event("p", n), max_bytes=LIMIT) for n, o in enumerate(offsets)]
    content = b"".join(line + b"\n" for line in lines)
    expected = (len(offsets), min(offsets), max(offsets))
    assert line_offsets(content, key="k") == offsets_line_by_line(lines, key="k") == expected


@pytest.mark.parametrize(
    "bad", [b"not json", b'{"topic":"s0","partition":0}', b'{"offset":"7"}', b"[1, 2]"]
)
def test_a_part_with_a_line_in_another_form_is_read_line_by_line(bad: bytes) -> None:
    good = encode_line(TP("s0", 0), 5, an_event("p", 0), max_bytes=LIMIT)
    with pytest.raises(ArchiveFormatError, match="k line 2"):
        line_offsets(good + b"\n" + bad + b"\n", key="k")
    assert line_offsets(good + b"\n" + b'{"offset":9}' + b"\n", key="k") == (2, 5, 9)
