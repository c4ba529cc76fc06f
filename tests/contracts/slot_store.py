"""Slot claims and the state layout, one contract for the stores that keep them (memory, Redis,
Redis Cluster): outbox events claimed by (outbox, project, slot), conflicts told from
duplicates, both layouts written until ``state migrate --finalize``, and a release that does not
speak the layout it finds writing nothing."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.runtime.slot_claims import SlotRef
from consumers.runtime.store import Commit, Store
from consumers.runtime.types import Progress
from streams.errors import ClaimsFound, CursorMoved, LayoutNewer
from tests.contracts.store import TPX

OUTBOX = "obx_" + "0f" * 8


def ids(n: int, tag: str = "a") -> list[str]:
    return [f"evt_{tag * 2}{i:030x}" for i in range(1, n + 1)]


def refs(events: list[str], first_slot: int = 1, project: str = "p1") -> dict[str, SlotRef]:
    return {e: SlotRef.of(OUTBOX, project, first_slot + i, e) for i, e in enumerate(events)}


# The release that writes slot claims, whatever this checkout's defaults (an older release's
# store is made with ``release``).
NEW: dict[str, Any] = {"speaks": 2, "writes_slot_claims": True}


class SlotStoreContract:
    def make_store(self, **options: Any) -> Store:
        """A store speaking layout 2 and writing slot claims (``options``: claim_gap_horizon)."""
        raise NotImplementedError

    def release(self, store: Store, *, speaks: int, writes_slot_claims: bool) -> Store:
        """Another release's store over the same state."""
        raise NotImplementedError

    def finalize(self, store: Store) -> None:
        """``rhumbatron state migrate --finalize`` to layout 2 on the store's environment."""
        raise NotImplementedError

    def _finalized(self, **options: Any) -> tuple[Store, int]:
        """A store finalized to layout 2, and the epoch it took TPX at."""
        store = self.make_store(**options)
        self.finalize(store)
        return store, store.acquire(TPX)

    def _commit(self, store: Store, epoch: int, at: int, **fields: Any) -> int:
        """Commit the next offset; returns it."""
        store.commit(Commit(TPX, epoch, at - 1, 0, Progress(acked_through=at), **fields))
        return at + 1

    def test_outbox_events_are_claimed_by_slot_and_a_different_event_there_is_a_conflict(
        self,
    ) -> None:
        store, epoch = self._finalized()
        first, second, third = ids(3)
        slots = refs([first, second, third])  # slots 1, 2, 3
        at = self._commit(store, epoch, 0, claims=[first, third], slots=slots)
        found = store.decisions(TPX, 0, [first, second, third], slots)
        assert found == ({first, third}, set(), set())
        # Finalized, an outbox event is claimed by its slot alone.
        assert store.decisions(TPX, 0, [first, third]) == (set(), set(), set())
        # Another event at a claimed slot above the base (slot 3, past the gap at 2) is a
        # conflict; at or below it (slot 1) the outbox's UNIQUE constraint makes it a copy.
        (stranger,) = ids(1, "f")
        at_third = {stranger: SlotRef.of(OUTBOX, "p1", 3, stranger)}
        assert store.decisions(TPX, 0, [stranger], at_third) == (set(), set(), {stranger})
        at_first = {stranger: SlotRef.of(OUTBOX, "p1", 1, stranger)}
        assert store.decisions(TPX, 0, [stranger], at_first) == ({stranger}, set(), set())
        elsewhere = {stranger: SlotRef.of(OUTBOX, "p2", 3, stranger)}
        assert store.decisions(TPX, 0, [stranger], elsewhere) == (set(), set(), set())
        other_outbox = {stranger: SlotRef.of("obx_" + "1e" * 8, "p1", 3, stranger)}
        assert store.decisions(TPX, 0, [stranger], other_outbox) == (set(), set(), set())
        at = self._commit(store, epoch, at, dead_claims=[second], slots=slots)
        assert store.decisions(TPX, 0, [second], slots) == (set(), {second}, set())
        self._commit(store, epoch, at, claims=[second], slots=slots)  # an operator's retry
        assert store.decisions(TPX, 0, [second], slots) == ({second}, set(), set())
        assert store.decisions(TPX, 1, [first], slots) == (set(), set(), set())

    def test_a_commit_meeting_a_slot_claim_is_refused_whole(self) -> None:
        store, epoch = self._finalized()
        first, second = ids(2)
        slots = refs([first, second])
        at = self._commit(store, epoch, 0, claims=[first], slots=slots)
        with pytest.raises(CursorMoved):
            self._commit(store, epoch, at, claims=[second, first], slots=slots)
        with pytest.raises(ClaimsFound):
            self._commit(store, epoch, at, claims=[second, first], slots=slots, looked=False)
        assert store.decisions(TPX, 0, [second], slots) == (set(), set(), set())
        assert store.load(TPX).acked_through == 0

    def test_a_gap_is_applied_when_it_arrives_whatever_came_after_it(self) -> None:
        store, epoch = self._finalized(claim_gap_horizon=4)
        events = ids(20)
        slots = refs(events)
        late = events[1]  # slot 2, published late
        at = self._commit(store, epoch, 0, claims=[events[0], *events[2:]], slots=slots)
        assert store.decisions(TPX, 0, events, slots) == (set(events) - {late}, set(), set())
        self._commit(store, epoch, at, claims=[late], slots=slots)
        assert store.decisions(TPX, 0, events, slots) == (set(events), set(), set())

    def test_skips_are_dead_claims_by_slot(self) -> None:
        store, epoch = self._finalized()
        first, second = ids(2)
        slots = refs([first, second])
        at = self._commit(store, epoch, 0, claims=[first], slots=slots)
        store.replace_fold(
            TPX,
            None,
            (at - 1, 0),
            Progress(acked_through=at),
            None,
            dead_claims=[second],
            slots=slots,
        )
        assert store.decisions(TPX, 0, [first, second], slots) == ({first}, {second}, set())

    def test_until_finalized_both_layouts_are_written_and_either_release_reads_them(self) -> None:
        new = self.make_store()
        old = self.release(new, speaks=1, writes_slot_claims=False)
        epoch = new.acquire(TPX)
        first, second, third = ids(3)
        slots = refs([first, second, third])
        at = self._commit(new, epoch, 0, claims=[first], slots=slots)
        assert new.decisions(TPX, 0, [first]) == ({first}, set(), set())  # by id too
        assert old.decisions(TPX, 0, [first], slots) == ({first}, set(), set())
        epoch = old.acquire(TPX)  # rolled back: the old release owns the partition
        at = self._commit(old, epoch, at, claims=[second], slots=slots)
        assert new.decisions(TPX, 0, [first, second, third], slots) == (
            {first, second},
            set(),
            set(),
        )
        epoch = new.acquire(TPX)  # forward again, then finalized
        self.finalize(new)
        self._commit(new, epoch, at, claims=[third], slots=slots)
        assert new.decisions(TPX, 0, [third]) == (set(), set(), set())  # by slot alone now
        assert new.decisions(TPX, 0, [first, second, third], slots) == (
            {first, second, third},
            set(),
            set(),
        )

    def test_a_release_that_does_not_speak_the_layout_writes_nothing(self) -> None:
        new = self.make_store()
        epoch = new.acquire(TPX)
        (first,) = ids(1)
        at = self._commit(new, epoch, 0, claims=[first], slots=refs([first]))
        self.finalize(new)
        old = self.release(new, speaks=1, writes_slot_claims=False)
        before = new.load(TPX)
        with pytest.raises(LayoutNewer) as refused:
            old.acquire(TPX)
        assert "layout 2" in str(refused.value) and "up to 1" in str(refused.value)
        with pytest.raises(LayoutNewer):
            old.commit(Commit(TPX, epoch, at - 1, 0, Progress(acked_through=at)))
        with pytest.raises(LayoutNewer):
            old.replace_fold(TPX, None, (at - 1, 0), Progress(acked_through=at + 5), None)
        with pytest.raises(LayoutNewer):
            old.clear_pending(TPX, epoch)
        assert new.load(TPX) == before and new.epoch(TPX) == epoch

    def test_events_passed_over_hold_their_slots_so_the_record_stays_its_base(self) -> None:
        store, epoch = self._finalized()
        events = ids(30)
        slots = refs(events)
        # Every third event is one the processor consumes; the others it passes over.
        consumed = events[::3]
        passed = [e for e in events if e not in consumed]
        self._commit(store, epoch, 0, claims=consumed, passed=passed, slots=slots)
        assert store.decisions(TPX, 0, events, slots) == (set(events), set(), set())
        assert store.decisions(TPX, 0, passed) == (set(), set(), set())  # never by id
        assert self.record(store, "p1") == b"30"

    def record(self, store: Store, project: str) -> bytes:
        """The project's slot record at revision 0, as stored."""
        raise NotImplementedError
