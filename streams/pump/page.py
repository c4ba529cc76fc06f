"""One page of the feed: NDJSON lines ``{"sequence": N, "event": <Event envelope>}``.

A page is read line by line and stops at the first line it refuses: the lines before it are
published (in their batches, each checkpointed), nothing from it on. A line is refused when
it is not JSON, not an object of exactly ``sequence`` and ``event``, when its sequence does not
strictly increase (from the checkpoint for the first line; gaps are allowed), when its event is
not a valid envelope, is over the envelope size limit, is not in canonical form (written
compactly in its own key order, it must be the bytes ``encode`` writes), or carries a slot
(only the outbox assigns slots)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson

from streams.envelopes import Event, decode_event, encode
from streams.errors import EnvelopeError, FeedLineRejected


@dataclass(frozen=True, slots=True)
class FeedEvent:
    sequence: int
    line: int  # 1-based, within its page
    event: Event
    value: bytes  # the canonical envelope: what is published


@dataclass(frozen=True, slots=True)
class ReadPage:
    events: list[FeedEvent]  # every good line before the first refused one
    lines: int  # lines on the page
    rejected: FeedLineRejected | None


def page_lines(body: bytes) -> list[bytes]:
    """The page's lines; a final newline ends the last line (it does not start an empty one),
    and a line may end with ``\\r\\n``."""
    if not body:
        return []
    lines = body.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def read_page(body: bytes, *, after: int, max_envelope_bytes: int) -> ReadPage:
    """The page's events up to its first refused line, checked against ``after`` (the
    checkpoint's sequence)."""
    lines = page_lines(body)
    events: list[FeedEvent] = []
    last = after
    for number, raw in enumerate(lines, start=1):
        try:
            event = _read_line(number, raw, last, max_envelope_bytes)
        except FeedLineRejected as refused:
            return ReadPage(events, len(lines), refused)
        events.append(event)
        last = event.sequence
    return ReadPage(events, len(lines), None)


def _read_line(number: int, raw: bytes, last: int, max_envelope_bytes: int) -> FeedEvent:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FeedLineRejected(number, None, f"malformed JSON ({exc})") from exc
    if not isinstance(obj, dict) or set(obj) != {"sequence", "event"}:
        found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise FeedLineRejected(
            number, None, f'a line must be {{"sequence": N, "event": {{...}}}}, found {found}'
        )
    sequence = obj["sequence"]
    if type(sequence) is not int:
        raise FeedLineRejected(number, None, f"sequence {sequence!r:.40} is not an integer")
    if sequence <= last:
        raise FeedLineRejected(
            number, sequence, f"sequence {sequence} does not increase from {last}"
        )
    if not isinstance(obj["event"], dict):
        raise FeedLineRejected(number, sequence, "the event must be a JSON object")
    compact = orjson.dumps(obj["event"])
    try:
        event = decode_event(compact, max_bytes=max_envelope_bytes)
    except EnvelopeError as exc:
        raise FeedLineRejected(number, sequence, f"not a valid event: {exc}") from exc
    if event.slot is not None:
        raise FeedLineRejected(
            number, sequence, f"the event carries slot {event.slot}: only the outbox assigns slots"
        )
    canonical = encode(event, max_bytes=max_envelope_bytes)
    if canonical != compact:
        raise FeedLineRejected(
            number,
            sequence,
            "the event is not in canonical form (fields in the envelope's order, absent "
            "optional fields left out, defaults written, times as YYYY-MM-DDTHH:MM:SS.mmmZ): "
            f"canonical {canonical[:80]!r}, found {compact[:80]!r}",
        )
    return FeedEvent(sequence, number, event, canonical)


def batches(
    events: Sequence[FeedEvent], *, max_events: int, max_bytes: int
) -> Iterator[list[FeedEvent]]:
    """The events in order, cut into batches of at most ``max_events`` whose envelopes total at
    most ``max_bytes`` (an envelope is never over the budget: the settings require
    pump_batch_max_bytes >= max_envelope_bytes)."""
    batch: list[FeedEvent] = []
    size = 0
    for event in events:
        if batch and (len(batch) >= max_events or size + len(event.value) > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += len(event.value)
    if batch:
        yield batch
