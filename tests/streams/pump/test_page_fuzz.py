"""A feed page of any bytes: good lines of the reference feed, the same lines spoilt (cut, a byte
changed or inserted, sequences out of order, the event of another shape), arbitrary bytes, empty
lines and CRLF. Reading it never raises; it keeps exactly the lines before the first it refuses,
each an event in canonical form with a strictly increasing sequence and no slot; the refusal
names that line and why; and the page read up to the refused line refuses that line too.

test_page.py holds one example of each kind of bad line; this draws them.

``RHUMBATRON_PROPERTY_EXAMPLES`` scales the examples in `make test`; the ``slow`` variant runs
``RHUMBATRON_SOAK_EXAMPLES``.
"""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.envelopes import decode_event, encode
from streams.pump.page import page_lines, read_page
from tests.support.pump import feed

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30")) * 5
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "5000"))
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
MAX = 4096
GOOD = feed("fuzz", 12, step=2)  # sequences 1, 3, 5 …
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"null", b"\xff", b"\r", b" "]


@st.composite
def spoilt(draw: st.DrawFn) -> bytes:
    line = draw(st.sampled_from(GOOD))
    how = draw(st.sampled_from(["cut", "change", "insert", "sequence", "event", "slot", "extra"]))
    at = draw(st.integers(0, len(line) - 1))
    if how == "cut":
        return line[:at]
    if how == "change":
        return line[:at] + draw(st.sampled_from(TOKENS)) + line[at + 1 :]
    if how == "insert":
        return line[:at] + draw(st.sampled_from(TOKENS) | st.binary(max_size=3)) + line[at:]
    obj = orjson.loads(line)
    if how == "sequence":
        obj["sequence"] = draw(
            st.sampled_from(
                [
                    0,
                    -1,
                    2**63 - 1,
                    orjson.Fragment(b"18446744073709551616"),
                    1.5,
                    "7",
                    None,
                    True,
                    [1],
                ]
            )
            | st.integers(-5, 40)
        )
    elif how == "event":
        obj["event"] = draw(st.sampled_from([None, [], "x", 5, {}, {"eventId": "evt_x"}]))
    elif how == "slot":
        obj["event"]["slot"] = draw(st.sampled_from([1, 0, None, "1"]))
    else:
        obj[draw(st.sampled_from(["extra", "Sequence", ""]))] = 1
    return orjson.dumps(obj)


lines = st.one_of(
    st.sampled_from(GOOD),
    spoilt(),
    st.binary(max_size=60).filter(lambda b: b"\n" not in b),
    st.sampled_from([b"", b"\r", b" ", b"{}", b"[]", b"null"]),
)
pages = st.tuples(
    st.lists(lines, max_size=15),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),  # the last line ends with a newline
)


def body_of(page: tuple[list[bytes], bytes, bool]) -> bytes:
    items, end, last = page
    body = end.join(items)
    return body + end if last and items else body


def joined(items: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in items)


def holds(body: bytes, after: int) -> None:
    read = read_page(body, after=after, max_envelope_bytes=MAX)
    assert read.lines == len(page_lines(body))
    last = after
    for n, event in enumerate(read.events, start=1):
        assert event.line == n and event.sequence > last
        last = event.sequence
        assert event.event.slot is None
        assert event.value == encode(event.event, max_bytes=MAX)
        assert decode_event(event.value, max_bytes=MAX) == event.event
    if read.rejected is None:
        assert len(read.events) == read.lines
        return
    refused = read.rejected
    assert refused.line == len(read.events) + 1 <= read.lines
    assert refused.reason.strip() and f"feed line {refused.line}" in str(refused)
    # The same page cut after the refused line answers the same, and before it refuses nothing.
    kept = page_lines(body)
    again = read_page(joined(kept[: refused.line]), after=after, max_envelope_bytes=MAX)
    assert again.events == read.events and again.rejected is not None
    # (Its reason may differ in words: a line "\r" written back with "\n" reads as empty.)
    assert again.rejected.line == refused.line
    before = read_page(joined(kept[: refused.line - 1]), after=after, max_envelope_bytes=MAX)
    assert before.rejected is None and before.events == read.events


@PROPERTY
@given(pages, st.sampled_from([0, 0, 2, 7, 2**70]))
def test_any_page_keeps_the_lines_before_its_first_refused_one(
    page: tuple[list[bytes], bytes, bool], after: int
) -> None:
    holds(body_of(page), after)


@PROPERTY
@given(st.binary(max_size=400), st.integers(-1, 10))
def test_arbitrary_bytes_are_read_or_refused_never_raised(body: bytes, after: int) -> None:
    holds(body, after)


@pytest.mark.slow
@SOAK
@given(pages, st.sampled_from([0, 2, 7]))
def test_pages_soak(page: tuple[list[bytes], bytes, bool], after: int) -> None:
    holds(body_of(page), after)
