"""``audit-archiver``: every event, once, in gzip NDJSON parts in an object store.

A files processor on the runtime (``consumers/runtime/parts.py``): ``process`` turns each fresh
event into one line (its topic, partition, offset and canonical envelope); the runtime collects a
partition's lines in an open part and asks :meth:`AuditArchiver.should_close` when the part is
done (event count, uncompressed size, age: settings). It then records the finished part with the
cursor *before* anything moves, and calls :meth:`AuditArchiver.store`, which writes the part and
then its index entry. A crash anywhere in between is recovered by the next owner of the partition
re-running ``store`` with the recorded bytes, so every event lands in exactly one part and every
stored part has its index entry. Formats and keys: ``consumers.subscriptions.archive.format`` and ``docs/archive.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from consumers.runtime.parts import Line
from consumers.runtime.types import JSON, TP, BaseProcessor, Delivery, EffectKind, Effects
from consumers.subscriptions.archive.format import (
    IndexEntry,
    PartKey,
    compress,
    decompress,
    line_of,
    line_offsets,
    line_prefix,
    part_key,
    stream_of,
)
from consumers.subscriptions.archive.store import ObjectStore
from streams.envelopes import Event, encode


@dataclass(frozen=True)
class PartLimits:
    """When an open part is done: whichever limit is reached first."""

    max_events: int
    max_bytes: int  # uncompressed NDJSON
    max_age_s: float

    def __post_init__(self) -> None:
        if self.max_events < 1 or self.max_bytes < 1 or self.max_age_s <= 0:
            raise ValueError(
                f"archive part limits must be positive, got events={self.max_events} "
                f"bytes={self.max_bytes} age={self.max_age_s}s"
            )


class AuditArchiver(BaseProcessor):
    slug: ClassVar[str] = "audit-archiver"
    consumes: ClassVar[frozenset[str] | None] = None  # every event type
    effect_kind: ClassVar[EffectKind] = EffectKind.FILES
    keeps_wire: ClassVar[bool] = True  # a line holds the canonical envelope: the record's, if so

    def __init__(
        self,
        objects: ObjectStore,
        limits: PartLimits,
        streams: Mapping[str, int],
        *,
        max_envelope_bytes: int,
        gzip_level: int = 6,
    ) -> None:
        self.objects = objects
        self.limits = limits
        self.streams = dict(streams)  # event stream name -> stream index (the NN of keys)
        self.max_envelope_bytes = max_envelope_bytes
        self.gzip_level = gzip_level
        # Each partition's line_prefix, made on its first event (the topic checked then too).
        self._prefixes: dict[TP, bytes] = {}
        # The key and (lowest, highest) offset of each (stream, partition)'s last finished part,
        # so that storing it right after need not decompress what was just compressed. A part
        # stored without one (the pending copy a crash left) is read to find them.
        self._bounds: dict[tuple[int, int], tuple[str, int, int]] = {}

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        # delivery.tp/offset are the event's origin, also for an operator's redelivery.
        tp = delivery.tp
        prefix = self._prefixes.get(tp)
        if prefix is None:
            stream_of(self.streams, tp.topic)  # only event streams are archived
            prefix = self._prefixes[tp] = line_prefix(tp)
        envelope = delivery.wire
        if envelope is None or len(envelope) > self.max_envelope_bytes:
            envelope = encode(event, max_bytes=self.max_envelope_bytes)  # raises if too large
        return Effects(lines=[line_of(prefix, delivery.offset, envelope)])

    # -- PartWriter --------------------------------------------------------------------------------
    def should_close(self, lines: int, size: int, age_s: float) -> bool:
        limits = self.limits
        return lines > 0 and (
            lines >= limits.max_events or size >= limits.max_bytes or age_s >= limits.max_age_s
        )

    def finish(self, tp: TP, lines: list[Line]) -> tuple[str, bytes]:
        content = b"".join(line.data + b"\n" for line in lines)
        stream = stream_of(self.streams, tp.topic)
        key = part_key(stream, tp.partition, lines[0].timestamp_ms, content).key
        offsets = [line.offset for line in lines]  # not in order after an operator's redelivery
        self._bounds[stream, tp.partition] = (key, min(offsets), max(offsets))
        return key, compress(content, self.gzip_level)

    def store(self, key: str, blob: bytes) -> None:
        """The part, then its index entry. Both are idempotent (same key, same bytes), and the
        runtime calls this again after a crash until it returns, so no stored part lacks its
        entry."""
        part = PartKey.parse(key)
        known = self._bounds.pop((part.stream, part.partition), None)
        if known is not None and known[0] == key:  # the key holds the content's hash
            _, first, last = known
        else:
            _, first, last = line_offsets(decompress(blob, key=key), key=key)
        self.objects.put(key, blob)
        self.objects.put(IndexEntry.of(part, first, last).key, b"")
