"""One contract for the pump's sink (streams/pump/pump.py: ``Sink``), run on the in-memory twin
(tests/support/pump.py: ``MemorySink``) and on Kafka (streams/pump/kafka.py: ``KafkaSink``).
Subclasses provide ``make_sink(fail_commit)`` (``fail_commit``: which of its commits, counted
from 1, fails before it is committed) and ``visible(sink)``: the events a reader finds
committed, in order."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streams.errors import RhumbatronError
from streams.pump.identity import Checkpoint
from streams.pump.page import read_page
from streams.pump.pump import Sink
from tests.support.pump import IDENTITY, feed

EVENTS = read_page(
    b"\n".join(feed("contract", 12, projects=3)), after=0, max_envelope_bytes=1 << 20
).events


class PumpSinkContract:
    def make_sink(self, fail_commit: int | None = None) -> Sink:
        raise NotImplementedError

    def visible(self, sink: Sink) -> Sequence[str]:
        """The event ids a reader finds committed, in order per project."""
        raise NotImplementedError

    def test_a_fresh_sink_has_no_checkpoint(self) -> None:
        assert self.make_sink().checkpoint() is None

    def test_a_checkpoint_alone_is_stored_with_nothing_published(self) -> None:
        sink = self.make_sink()
        sink.commit([], Checkpoint(IDENTITY, 0))
        assert sink.checkpoint() == Checkpoint(IDENTITY, 0)
        assert list(self.visible(sink)) == []

    def test_a_batch_and_its_checkpoint_are_committed_together(self) -> None:
        sink = self.make_sink()
        sink.commit(EVENTS[:5], Checkpoint(IDENTITY, EVENTS[4].sequence))
        sink.commit(EVENTS[5:], Checkpoint(IDENTITY, EVENTS[-1].sequence))
        assert sink.checkpoint() == Checkpoint(IDENTITY, EVENTS[-1].sequence)
        assert sorted(self.visible(sink)) == sorted(e.event.event_id for e in EVENTS)

    def test_a_failed_commit_publishes_nothing_and_keeps_the_checkpoint(self) -> None:
        sink = self.make_sink(fail_commit=2)
        sink.commit(EVENTS[:5], Checkpoint(IDENTITY, EVENTS[4].sequence))
        with pytest.raises(RhumbatronError):
            sink.commit(EVENTS[5:], Checkpoint(IDENTITY, EVENTS[-1].sequence))
        assert sink.checkpoint() == Checkpoint(IDENTITY, EVENTS[4].sequence)
        assert sorted(self.visible(sink)) == sorted(e.event.event_id for e in EVENTS[:5])
        sink.commit(EVENTS[5:], Checkpoint(IDENTITY, EVENTS[-1].sequence))  # goes on after it
        assert sorted(self.visible(sink)) == sorted(e.event.event_id for e in EVENTS)
