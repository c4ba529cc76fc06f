"""A feed page read line by line: every kind of bad line refused with its line number, sequence
and reason, the good lines before it kept and nothing after; and batches that keep the order and
hold to both limits."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.envelopes import decode_event
from streams.pump.page import FeedEvent, batches, page_lines, read_page
from tests.support.pump import feed

MAX = 4096


def body(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def with_event(line: bytes, **changes: object) -> bytes:
    obj = orjson.loads(line)
    for name, value in changes.items():
        if value is None:
            obj["event"].pop(name, None)
        else:
            obj["event"][name] = value
    return orjson.dumps(obj)


GOOD = feed("page", 6, step=3)  # sequences 1, 4, 7, 10, 13, 16: gaps are allowed


def test_good_lines_are_read_in_order_with_their_canonical_bytes() -> None:
    read = read_page(body(GOOD), after=0, max_envelope_bytes=MAX)
    assert read.rejected is None and read.lines == 6
    assert [e.sequence for e in read.events] == [1, 4, 7, 10, 13, 16]
    for line, event in zip(GOOD, read.events, strict=True):
        assert orjson.loads(line)["event"] == orjson.loads(event.value)
        assert decode_event(event.value, max_bytes=MAX) == event.event


def test_a_page_may_end_without_a_newline_and_lines_with_crlf() -> None:
    assert page_lines(b"") == []
    assert page_lines(b"a\r\nb") == [b"a", b"b"]
    read = read_page(b"\r\n".join(GOOD[:2]), after=0, max_envelope_bytes=MAX)
    assert [e.sequence for e in read.events] == [1, 4] and read.rejected is None


BAD_LINES = [
    (b"{not json", "malformed JSON"),
    (b"", "malformed JSON"),
    (b"[1, 2]", 'a line must be {"sequence": N, "event": {...}}, found list'),
    (b'{"sequence": 99}', "found ['sequence']"),
    (b'{"sequence": 99, "event": {}, "extra": 1}', "found ['event', 'extra', 'sequence']"),
    (b'{"sequence": "99", "event": {}}', "is not an integer"),
    (b'{"sequence": true, "event": {}}', "is not an integer"),
    (b'{"sequence": 99, "event": []}', "the event must be a JSON object"),
    (b'{"sequence": 99, "event": {"eventId": "x"}}', "not a valid event"),
]


@pytest.mark.parametrize(("bad", "says"), BAD_LINES)
def test_a_bad_line_stops_the_page_after_the_good_ones(bad: bytes, says: str) -> None:
    read = read_page(body([*GOOD[:2], bad, *GOOD[2:]]), after=0, max_envelope_bytes=MAX)
    assert [e.sequence for e in read.events] == [1, 4]
    assert read.rejected is not None
    assert read.rejected.line == 3 and says in read.rejected.reason
    assert "feed line 3" in str(read.rejected)


def test_a_sequence_that_does_not_increase_is_refused() -> None:
    read = read_page(body([GOOD[1], GOOD[0]]), after=0, max_envelope_bytes=MAX)
    assert read.rejected is not None
    assert read.rejected.sequence == 1 and "sequence 1 does not increase from 4" in str(
        read.rejected
    )
    # From the checkpoint too: a first line at or below it is refused.
    read = read_page(body(GOOD), after=4, max_envelope_bytes=MAX)
    assert read.events == [] and read.rejected is not None
    assert "does not increase from 4" in read.rejected.reason


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"slot": 3}, "carries slot 3: only the outbox assigns slots"),
        ({"eventVersion": None}, "not in canonical form"),  # the default left out
        ({"changeId": None, "taskId": None, "causedBy": None}, None),  # absent: still canonical
        ({"timestamp": "2026-01-01T00:00:00Z"}, "not a valid event"),
        ({"payload": {"b": 1, "a": 2}}, None),  # a payload's own key order is the event's
    ],
)
def test_events_are_published_only_in_canonical_form(
    changes: dict[str, object], says: str | None
) -> None:
    line = with_event(GOOD[0], **changes)
    read = read_page(body([line]), after=0, max_envelope_bytes=MAX)
    if says is None:
        assert read.rejected is None and len(read.events) == 1
    else:
        assert read.rejected is not None and says in read.rejected.reason


def test_fields_out_of_the_envelopes_order_are_not_canonical() -> None:
    obj = orjson.loads(GOOD[0])
    obj["event"] = dict(reversed(list(obj["event"].items())))
    read = read_page(orjson.dumps(obj), after=0, max_envelope_bytes=MAX)
    assert read.rejected is not None and "not in canonical form" in read.rejected.reason


def test_an_oversized_event_is_refused() -> None:
    line = with_event(GOOD[0], payload={"text": "x" * MAX})
    read = read_page(body([line]), after=0, max_envelope_bytes=MAX)
    assert read.rejected is not None and "limit" in read.rejected.reason


@given(
    sizes=st.lists(st.integers(1, 300), max_size=60),
    max_events=st.integers(1, 10),
    max_bytes=st.integers(300, 2000),
)
def test_batches_keep_the_order_and_both_limits(
    sizes: list[int], max_events: int, max_bytes: int
) -> None:
    event = read_page(GOOD[0], after=0, max_envelope_bytes=MAX).events[0].event
    events = [FeedEvent(n + 1, n + 1, event, b"x" * size) for n, size in enumerate(sizes)]
    cut = list(batches(events, max_events=max_events, max_bytes=max_bytes))
    assert [e for batch in cut for e in batch] == events
    for n, batch in enumerate(cut):
        assert 1 <= len(batch) <= max_events
        assert sum(len(e.value) for e in batch) <= max_bytes
        if n + 1 < len(cut):  # a batch is cut only when the next event would not fit
            following = cut[n + 1][0]
            assert len(batch) == max_events or (
                sum(len(e.value) for e in batch) + len(following.value) > max_bytes
            )
