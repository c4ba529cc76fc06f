"""One contract for the operator state that survives Redis loss: the dead-letter index (each
letter, its status, its audit) and the audit logs, each change written first to the durable audit
topic (consumers/runtime/audit_records.py) and rebuilt from it alone
(consumers/runtime/state_rebuild.py). Run on the twins (one MemoryAudit shared by the dead-letter
twin and the audit-log twins) and on the real thing (the audit topic on Kafka, the index and
logs in Redis).

Subclasses provide ``make_state()``: a fresh environment's :class:`OperatorState`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

import pytest

from consumers.runtime.audit_records import DurableAudit, entry_record, transition_record
from consumers.runtime.controls import AuditLog
from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import (
    DeadLetter,
    DeadLetterStore,
    Entry,
    LetterKind,
    LetterStatus,
    command_letter_id,
)
from consumers.runtime.state_rebuild import RebuildReport
from streams.clock import ManualClock
from streams.envelopes import format_time
from streams.errors import AuditNotDurable, DeadLetterActionRefused
from tests.contracts.dead_letters import T0, letter

SLUGS = ("ledger", "pump")
# The real store cuts a letter's copy on the audit topic into parts this large (its
# dead_letter_record_max_bytes); the twin is made with the same.
PART_MAX_BYTES = 16 * 1024


class OperatorState(Protocol):
    @property
    def letters(self) -> DeadLetterStore: ...

    @property
    def durable(self) -> DurableAudit:
        """The audit topic, or its twin, under the letters and the logs."""

    def log(self, slug: str) -> AuditLog: ...

    def lose(self) -> None:
        """Redis loses every key of the environment (the index, its marker, the logs)."""

    def rebuild(self) -> RebuildReport: ...

    def fail_next_audit_write(self) -> None: ...


def command_letter(n: int) -> DeadLetter:
    command_id = f"cmd_{n}"
    return DeadLetter(
        id=command_letter_id(command_id),
        kind=LetterKind.COMMAND,
        source_topic="rhumbatron-indexing-t",
        source_partition=0,
        error="HandlerFailed: gave up",
        error_type="router.workers.HandlerFailed",
        attempts=3,
        created_at=format_time(T0 + timedelta(seconds=n)),
        entries=[Entry(40 + n, b'{"command_id": "%d"}' % n, b"proj", [("rh.error", b"x")])],
        origin_queue="indexing",
        command_id=command_id,
    )


def poison_letter() -> DeadLetter:
    # Headers as a hostile producer leaves them: no value, not UTF-8, one name twice.
    headers: list[tuple[str, bytes | None]] = [
        ("none", None),
        ("raw", b"\xff\x01"),
        ("dup", b"1"),
        ("dup", b"2"),
    ]
    big = bytes(range(256)) * 200  # larger than a part: cut into several on the topic
    return letter(
        30, kind=LetterKind.POISON, entries=[Entry(30, big, b"\x80key", headers)], error="garbage"
    )


def listing(state: OperatorState) -> dict[str, Any]:
    """What the operator is shown: every letter whole (status, audit, entries) and each log."""
    return {
        "letters": [d.to_json() for d in state.letters.list(limit=10_000)],
        "logs": {slug: state.log(slug).entries(limit=10_000) for slug in SLUGS},
    }


def actions(state: OperatorState, clock: ManualClock, sent: list[Any]) -> DeadLetterActions:
    return DeadLetterActions(
        state.letters,
        clock,
        lambda *record: sent.append(record),
        lambda slug: f"rhumbatron_redelivery_{slug}_t",
        lambda tp: tp.partition,
        lambda purpose: f"rhumbatron-{purpose}-t",
    )


def failing_send(*_: Any) -> None:
    raise RuntimeError("broker gone")


class DurableStateContract:
    def make_state(self) -> OperatorState:
        raise NotImplementedError

    def populate(self, state: OperatorState) -> None:
        """Letters of each kind in each status, and entries in two logs."""
        clock = ManualClock(T0 + timedelta(minutes=5))
        sent: list[Any] = []
        state.letters.write([letter(n) for n in (1, 2, 3, 4)])
        state.letters.write([poison_letter(), command_letter(1), command_letter(2)])
        ops = actions(state, clock, sent)
        ops.retry(letter(1).id, who="ana", why="fixed the handler")
        ops.retry(command_letter(1).id, who="ana")
        ops.dismiss(letter(2).id, who="bo", why="a test event")
        ops.dismiss(poison_letter().id, who="bo", why="garbage from a bad deploy")
        failing = DeadLetterActions(
            state.letters,
            clock,
            failing_send,
            ops.redelivery_topic,
            ops.redelivery_partition,
            ops.queue_topic,
        )
        with pytest.raises(DeadLetterActionRefused):
            failing.retry(letter(3).id, who="cy")  # open → retrying → open again
        for n in range(3):
            state.log("ledger").append({"action": "skip_through", "offset": n, "who": "ana"})
        state.log("pump").append({"action": "forget", "feed": "f", "who": "bo", "why": "reset"})

    def test_a_lost_index_and_logs_come_back_as_they_were(self) -> None:
        state = self.make_state()
        self.populate(state)
        before = listing(state)
        statuses = {d["id"]: d["status"] for d in before["letters"]}
        assert sorted(statuses.values()) == sorted(
            ["retried", "retried", "dismissed", "dismissed", "open", "open", "open"]
        )
        state.lose()
        assert listing(state) == {"letters": [], "logs": {"ledger": [], "pump": []}}
        report = state.rebuild()
        assert listing(state) == before
        assert report.letters_restored == 7
        assert report.entries_restored == 4

    def test_a_rebuild_twice_or_over_an_intact_index_changes_nothing(self) -> None:
        state = self.make_state()
        self.populate(state)
        before = listing(state)
        assert not state.rebuild().changed()
        assert listing(state) == before
        state.lose()
        assert state.rebuild().changed()
        again = state.rebuild()
        assert not again.changed()
        assert again.letters_kept == 7
        assert listing(state) == before

    def test_a_letter_retried_after_a_rebuild_is_sent_and_marked(self) -> None:
        state = self.make_state()
        self.populate(state)
        state.lose()
        state.rebuild()
        sent: list[Any] = []
        clock = ManualClock(T0 + timedelta(hours=1))
        done = actions(state, clock, sent).retry(letter(4).id, who="di", why="after the loss")
        assert done.status == LetterStatus.RETRIED
        assert [a["action"] for a in done.audit] == ["retrying", "retried"]
        assert len(sent) == 1
        # The rebuilt letter's own history goes on: its changes since are durable too.
        before = listing(state)
        state.lose()
        state.rebuild()
        assert listing(state) == before

    def test_a_failed_durable_write_of_an_entry_changes_nothing(self) -> None:
        state = self.make_state()
        log = state.log("ledger")
        log.append({"action": "re_reduce", "who": "ana"})
        ran = []
        state.fail_next_audit_write()
        with pytest.raises(AuditNotDurable, match="audit topic"), log.recording({"n": 1}):
            ran.append(True)
        assert ran == []  # the action the entry records never ran
        assert [e["action"] for e in log.entries()] == ["re_reduce"]
        state.lose()
        state.rebuild()
        assert [e["action"] for e in log.entries()] == ["re_reduce"]

    def test_a_failed_durable_write_of_a_status_change_changes_nothing(self) -> None:
        state = self.make_state()
        state.letters.write([letter(1)])
        state.fail_next_audit_write()
        with pytest.raises(AuditNotDurable, match="nothing was changed"):
            actions(state, ManualClock(T0), []).dismiss(letter(1).id, who="ana", why="no")
        kept = state.letters.get(letter(1).id)
        assert kept is not None and kept.status == LetterStatus.OPEN and kept.audit == []
        state.lose()
        state.rebuild()
        rebuilt = state.letters.get(letter(1).id)
        assert rebuilt is not None and rebuilt.status == LetterStatus.OPEN and rebuilt.audit == []

    def test_a_failed_durable_write_of_a_letter_indexes_nothing(self) -> None:
        state = self.make_state()
        state.fail_next_audit_write()
        with pytest.raises(AuditNotDurable):
            state.letters.write([letter(1)])
        assert state.letters.get(letter(1).id) is None

    def test_an_entry_whose_action_failed_is_voided(self) -> None:
        state = self.make_state()
        log = state.log("ledger")
        with pytest.raises(ValueError, match="refused"), log.recording({"action": "skip"}):
            raise ValueError("the store refused the move")
        assert log.entries() == []
        state.lose()
        state.rebuild()
        assert log.entries() == []

    def test_what_the_topic_took_and_redis_did_not_is_restored(self) -> None:
        # The durable write succeeded, the Redis write after it did not (Redis went away).
        state = self.make_state()
        state.letters.write([letter(1)])
        state.log("ledger").append({"action": "first", "who": "runtime"})
        change = {"action": "dismissed", "who": "ana", "why": "lost write", "at": format_time(T0)}
        state.durable.write(
            [
                transition_record(letter(1).id, 0, "open", "dismissed", change),
                entry_record("ledger", {"action": "second", "who": "bo", "audit_id": "a2"}),
            ]
        )
        report = state.rebuild()
        assert (report.letters_updated, report.entries_restored) == (1, 1)
        repaired = state.letters.get(letter(1).id)
        assert repaired is not None
        assert (repaired.status, repaired.audit) == (LetterStatus.DISMISSED, [change])
        assert [e["action"] for e in state.log("ledger").entries()] == ["second", "first"]

    def test_the_index_keeps_letters_and_logs_apart_per_letter_and_slug(self) -> None:
        state = self.make_state()
        state.letters.write([letter(1), letter(2)])
        ops = actions(state, ManualClock(T0), [])
        ops.dismiss(letter(1).id, who="ana", why="one")
        state.log("ledger").append({"action": "only ledger"})
        state.lose()
        state.rebuild()
        second = state.letters.get(letter(2).id)
        assert second is not None and second.status == LetterStatus.OPEN
        assert state.log("pump").entries() == []
        assert [e["action"] for e in state.log("ledger").entries()] == ["only ledger"]
