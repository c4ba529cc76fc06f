"""SlotClaims against a model that remembers every claim: the same answers, within the memory
the layout promises (nothing past the horizon, no fingerprint at or below the base)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.runtime.slot_claims import APPLIED, CONFLICT, DEAD, NONE, SlotClaims, fingerprint

claims_ = st.lists(st.tuples(st.integers(1, 80), st.booleans(), st.integers(0, 3)), max_size=120)


def _model(steps: list[tuple[int, bool, int]]) -> tuple[dict[int, int], set[int]]:
    printed: dict[int, int] = {}
    dead: set[int] = set()
    for slot, is_dead, who in steps:
        if slot in printed:
            if not is_dead:
                dead.discard(slot)
            continue
        printed[slot] = who
        if is_dead:
            dead.add(slot)
    return printed, dead


@settings(max_examples=400, deadline=None)
@given(claims_, st.integers(1, 30))
def test_claims_answer_as_a_full_record_would(steps, horizon) -> None:
    record = SlotClaims()
    for slot, is_dead, who in steps:
        record.claim(slot, who, dead=is_dead, horizon=horizon)
        assert record.above == [] or record.above[-1] - record.base <= horizon
        assert all(s > record.base for s in record.prints)
        assert record.above == [] or record.above[0] > record.base + 1
    printed, dead = _model(steps)
    again = SlotClaims.decode(record.encode())
    for r in (record, again):
        for slot in range(1, 90):
            for who in range(4):
                got = r.verdict(slot, who)
                if slot not in printed:
                    assert got == NONE, (slot, r)
                    continue
                want = DEAD if slot in dead else APPLIED
                if printed[slot] != who and slot > r.base:
                    want = CONFLICT
                assert got == want, (slot, who, r)


def test_a_project_in_order_costs_its_base_only() -> None:
    record = SlotClaims()
    for slot in range(1, 100_001):
        record.claim(slot, fingerprint(f"evt_{slot}"), dead=False, horizon=1_000)
    assert record.encode() == b"100000"


def test_a_gap_that_never_closes_costs_one_range() -> None:
    record = SlotClaims()
    record.claim(1, 0, dead=False, horizon=100)
    for slot in range(3, 10_000):
        record.claim(slot, slot, dead=False, horizon=100)
    assert record.missing == [2, 2]
    assert record.base >= 10_000 - 1 - 100
    assert len(record.prints) <= 100
    record.claim(2, 7, dead=False, horizon=100)  # published late: applied, and the gap closes
    assert record.missing == []
    assert record.verdict(2, 7) == APPLIED


def test_a_retried_dead_letter_is_applied_and_a_late_copy_stays_a_duplicate() -> None:
    record = SlotClaims()
    record.claim(1, 11, dead=False, horizon=10)
    record.claim(2, 22, dead=True, horizon=10)
    record.claim(3, 33, dead=False, horizon=10)
    assert record.base == 3 and record.verdict(2, 22) == DEAD
    record.claim(2, 22, dead=False, horizon=10)
    assert record.verdict(2, 22) == APPLIED
    record.claim(2, 22, dead=True, horizon=10)  # the first decision stands
    assert record.verdict(2, 22) == APPLIED
