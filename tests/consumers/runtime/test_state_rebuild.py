"""The rebuild's rules on records made by hand (consumers/runtime/state_rebuild.py): which status
changes apply, which copy of a letter counts, how a log's missing entries are merged in."""

from __future__ import annotations

from typing import Any

import orjson

from consumers.runtime.audit_records import (
    Raw,
    entry_record,
    letter_records,
    transition_record,
)
from consumers.runtime.dead_letters import LetterStatus
from consumers.runtime.state_rebuild import merged_letter, merged_log, read_state
from tests.contracts.dead_letters import letter


def raw(*records: tuple[str, dict[str, Any]]) -> list[Raw]:
    return [(key, orjson.dumps(value)) for key, value in records]


def change(who: str) -> dict[str, str]:
    return {"action": "x", "who": who, "why": "w", "at": "2026-03-01T12:00:00.000000Z"}


def written(n: int = 1, *, error: str = "boom", part_max_bytes: int = 900_000) -> list[Raw]:
    d = letter(n, error=error)
    return raw(*letter_records(d.id, orjson.dumps(d.to_json()), part_max_bytes))


ID = letter(1).id


def test_changes_apply_in_order_each_onto_the_state_it_was_made_from() -> None:
    records = written() + raw(
        transition_record(ID, 0, "open", "retrying", change("ana")),
        transition_record(ID, 1, "retrying", "open", change("ana")),
        transition_record(ID, 2, "open", "dismissed", change("bo")),
        # made from a state the letter never had: not applied
        transition_record(ID, 3, "open", "retrying", change("cy")),
    )
    d = read_state(records).letters[ID]
    assert d.status == LetterStatus.DISMISSED
    assert [a["who"] for a in d.audit] == ["ana", "ana", "bo"]


def test_a_later_change_made_from_the_same_state_replaces_the_earlier() -> None:
    # The earlier one's Redis write failed after the topic took it; the operator acted again
    # on the letter as Redis still had it.
    records = written() + raw(
        transition_record(ID, 0, "open", "retrying", change("lost")),
        transition_record(ID, 0, "open", "dismissed", change("bo")),
    )
    d = read_state(records).letters[ID]
    assert (d.status, [a["who"] for a in d.audit]) == (LetterStatus.DISMISSED, ["bo"])


def test_a_voided_change_is_not_applied() -> None:
    lost = transition_record(ID, 0, "open", "dismissed", change("lost the race"))
    won = transition_record(ID, 0, "open", "retrying", change("won"))
    records = [*written(), *raw(won, lost), (lost[0], None)]
    d = read_state(records).letters[ID]
    assert (d.status, [a["who"] for a in d.audit]) == (LetterStatus.RETRYING, ["won"])


def test_a_letter_in_parts_counts_once_whole_and_its_last_copy_wins() -> None:
    first = written(error="first" * 100, part_max_bytes=64)
    second = written(error="second" * 100, part_max_bytes=64)
    assert len(first) > 3
    assert read_state(first[:-1]).letters == {}  # a part missing: no letter
    assert read_state(first + second).letters[ID].error == "second" * 100
    # Compaction keeps the last record of each key: the second copy's parts, whole.
    assert read_state(second).letters[ID].error == "second" * 100


def test_a_change_of_a_letter_the_topic_does_not_hold_is_left_out() -> None:
    state = read_state(raw(transition_record(ID, 0, "open", "dismissed", change("ana"))))
    assert state.letters == {}


def test_the_index_keeps_its_letter_unless_the_topic_extends_its_audit() -> None:
    derived = letter(1)
    derived.audit = [change("ana"), change("bo")]
    derived.status = LetterStatus.DISMISSED
    held = letter(1)
    held.audit = [change("ana")]
    held.status = LetterStatus.RETRYING
    assert merged_letter(None, derived) == derived
    extended = merged_letter(held, derived)
    assert extended is not None and extended.audit == derived.audit
    assert merged_letter(derived, derived) is None
    other = letter(1)
    other.audit = [change("someone else")]
    assert merged_letter(other, derived) is None


def test_a_log_gets_what_it_lacks_its_own_older_entries_kept_first() -> None:
    def e(n: int, with_id: bool = True) -> dict[str, Any]:
        return {"n": n, **({"audit_id": f"a{n}"} if with_id else {})}

    derived = [e(1), e(2), e(3)]
    assert merged_log([e(3), e(2), e(1)], derived) is None
    # Redis lost entry 2; it holds an entry from before the topic and one written after the
    # topic was read.
    held = [e(4), e(3), e(1), e(0, with_id=False)]
    assert merged_log(held, derived) == [e(4), e(3), e(2), e(1), e(0, with_id=False)]


def test_an_entry_voided_is_not_restored() -> None:
    key, value = entry_record("ledger", {"n": 1, "audit_id": "a1"})
    assert read_state([*raw((key, value)), (key, None)]).logs == {}
    assert read_state(raw((key, value))).logs == {"ledger": [value["entry"]]}
