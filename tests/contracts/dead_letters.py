"""One contract for the dead-letter store (STYLE: shared test classes per interface), run on the
in-memory twin (unit) and on the real store, Kafka topic plus Redis index (integration). The
runtime's tests and the operator's run on the twin, so the twin must behave as the real one.

Subclasses provide ``make_store`` (a fresh, empty store) and ``failing_view`` (a store over the
same index whose next write fails as the real one does when Kafka does not take the records).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import (
    DeadLetter,
    DeadLetterStore,
    Entry,
    LetterKind,
    LetterStatus,
    batch_letter_id,
)
from consumers.runtime.types import TP
from streams.clock import ManualClock
from streams.envelopes import format_time
from streams.errors import DeadLetterActionRefused, DeliveryFailed

T0 = datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
SOURCE = "rhumbatron_events_00_t"


def letter(
    offset: int,
    *,
    at: datetime = T0,
    kind: LetterKind = LetterKind.EVENT_BATCH,
    entries: list[Entry] | None = None,
    error: str = "boom",
) -> DeadLetter:
    return DeadLetter(
        id=batch_letter_id("ledger", SOURCE, 1, offset, kind),
        kind=kind,
        source_topic=SOURCE,
        source_partition=1,
        error=error,
        error_type="ValueError",
        attempts=5,
        created_at=format_time(at),
        entries=entries
        if entries is not None
        else [Entry(offset, b'{"n": %d}' % offset, b"proj", [("event_id", b"e%d" % offset)])],
        subscription="ledger",
    )


class DeadLetterStoreContract:
    def make_store(self) -> DeadLetterStore:
        raise NotImplementedError

    def failing_view(self, store: DeadLetterStore) -> DeadLetterStore:
        raise NotImplementedError

    def test_entries_round_trip_exactly(self) -> None:
        store = self.make_store()
        odd = letter(
            7,
            kind=LetterKind.POISON,
            entries=[
                Entry(
                    7,
                    b"\xff\x00\xfe not utf-8",
                    None,
                    [("raw", b"\xff\x01"), ("dup", b"1"), ("dup", b"2"), ("empty", b"")],
                ),
                Entry(8, None, b"\x80key", [], "evt_x", "task.created", "proj_1"),
                Entry(9, b"", b"", []),
            ],
            error="not valid JSON: \u00e9\U0001f600",
        )
        odd.origin_queue = "index.build"
        odd.command_id = "cmd_1"
        store.write([odd])
        assert store.get(odd.id) == odd
        assert store.list() == [odd]
        assert store.get("dl_" + "0" * 24) is None

    def test_the_store_keeps_its_own_copy(self) -> None:
        store = self.make_store()
        original = letter(1)
        store.write([original])
        original.status = LetterStatus.DISMISSED
        original.entries.append(Entry(2, b"x"))
        got = store.get(original.id)
        assert got is not None and got.status == LetterStatus.OPEN and got.offsets == [1]
        got.audit.append({"action": "forged"})
        assert store.get(original.id) == letter(1)

    def test_a_write_is_idempotent_on_the_letter_id(self) -> None:
        store = self.make_store()
        first = letter(3)
        store.write([first, replace(first, error="second copy in the same write")])
        assert store.transition(first.id, to=LetterStatus.DISMISSED, who="op", why="seen", now=T0)
        store.write([replace(first, error="written again after a crash", audit=[])])
        got = store.get(first.id)
        assert got is not None and got.error == "boom" and got.status == LetterStatus.DISMISSED
        assert [d.id for d in store.list()] == [first.id]

    def test_list_orders_by_creation_then_id_and_filters_by_status_before_the_limit(
        self,
    ) -> None:
        store = self.make_store()
        late, early, middle = (
            letter(1, at=T0 + timedelta(seconds=2)),
            letter(2, at=T0),
            letter(3, at=T0 + timedelta(milliseconds=1)),
        )
        same = [letter(n, at=T0 + timedelta(seconds=1)) for n in (10, 11, 12, 13)]
        store.write([late, *same[:2]])
        store.write([early, middle, *same[2:]])
        tied = sorted(d.id for d in same)
        oldest_first = [early.id, middle.id, *tied, late.id]
        assert [d.id for d in store.list()] == oldest_first
        assert [d.id for d in store.list(newest_first=True)] == oldest_first[::-1]
        assert [d.id for d in store.list(limit=2)] == oldest_first[:2]
        assert store.list(limit=0) == []
        for d in (early, same[0], late):
            assert store.transition(d.id, to=LetterStatus.DISMISSED, who="op", why="noise", now=T0)
        still_open = [i for i in oldest_first if i not in {early.id, same[0].id, late.id}]
        assert [d.id for d in store.list(status=LetterStatus.OPEN, limit=3)] == still_open[:3]
        assert [d.id for d in store.list(status=LetterStatus.DISMISSED, newest_first=True)] == [
            late.id,
            same[0].id,
            early.id,
        ]
        assert store.list(status=LetterStatus.RETRIED) == []

    def test_transitions_are_check_and_set_and_audited(self) -> None:
        store = self.make_store()
        d = letter(4)
        store.write([d])
        t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
        assert not store.transition(
            "dl_" + "0" * 24, to=LetterStatus.RETRYING, who="a", why="", now=t1
        )
        assert store.transition(d.id, to=LetterStatus.RETRYING, who="alice", why="fixed", now=t1)
        # Not open any more: a second click is refused and changes nothing.
        assert not store.transition(d.id, to=LetterStatus.RETRYING, who="bob", why="again", now=t2)
        assert not store.transition(d.id, to=LetterStatus.DISMISSED, who="bob", why="x", now=t2)
        assert store.transition(
            d.id,
            to=LetterStatus.RETRIED,
            who="alice",
            why="sent",
            now=t2,
            frm=LetterStatus.RETRYING,
        )
        got = store.get(d.id)
        assert got is not None and got.status == LetterStatus.RETRIED
        assert got.audit == [
            {
                "action": LetterStatus.RETRYING,
                "who": "alice",
                "why": "fixed",
                "at": format_time(t1),
            },
            {"action": LetterStatus.RETRIED, "who": "alice", "why": "sent", "at": format_time(t2)},
        ]
        assert [x.id for x in store.list(status=LetterStatus.RETRIED)] == [d.id]

    def test_of_concurrent_transitions_exactly_one_wins(self) -> None:
        store = self.make_store()
        d = letter(5)
        store.write([d])
        wins: list[str] = []
        start = threading.Barrier(6)

        def click(who: str) -> None:
            start.wait()
            if store.transition(d.id, to=LetterStatus.RETRYING, who=who, why="click", now=T0):
                wins.append(who)

        threads = [threading.Thread(target=click, args=(f"op{n}",)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = store.get(d.id)
        assert len(wins) == 1 and got is not None
        assert [a["who"] for a in got.audit] == wins

    def test_operator_retry_and_dismiss_over_the_store(self) -> None:
        store = self.make_store()
        retried, broken, dismissed, poison = letter(1), letter(2), letter(3), letter(4)
        poison.kind = LetterKind.POISON
        store.write([retried, broken, dismissed, poison])
        sent: list[tuple[str, int | None, bytes | None, bytes]] = []
        failing = {broken.entries[0].value}

        def send(
            topic: str,
            partition: int | None,
            key: bytes | None,
            value: bytes,
            headers: list[tuple[str, bytes]],
        ) -> None:
            if value in failing:
                raise ConnectionError("broker gone")
            sent.append((topic, partition, key, value))

        clock = ManualClock(T0)
        actions = DeadLetterActions(
            store,
            clock,
            send,
            lambda slug: f"rhumbatron_redelivery_{slug}_t",
            lambda tp: tp.partition if tp == TP(SOURCE, 1) else None,
            lambda purpose: f"rhumbatron_queue_{purpose}_t",
            stale_retry_s=60,
        )
        done = actions.retry(retried.id, who="alice")
        assert done.status == LetterStatus.RETRIED
        assert [a["action"] for a in done.audit] == [LetterStatus.RETRYING, LetterStatus.RETRIED]
        assert sent == [("rhumbatron_redelivery_ledger_t", 1, b"proj", b'{"n": 1}')]
        with pytest.raises(DeadLetterActionRefused):
            actions.retry(retried.id, who="bob")  # already handled
        with pytest.raises(DeadLetterActionRefused):
            actions.retry(broken.id, who="alice")
        back = store.get(broken.id)
        assert back is not None and back.status == LetterStatus.OPEN
        assert [a["action"] for a in back.audit] == [LetterStatus.RETRYING, LetterStatus.OPEN]
        failing.clear()
        assert actions.retry(broken.id, who="alice").status == LetterStatus.RETRIED
        with pytest.raises(DeadLetterActionRefused):
            actions.retry(poison.id, who="alice")
        gone = actions.dismiss(poison.id, who="alice", why="producer fixed")
        assert gone.status == LetterStatus.DISMISSED and gone.audit[-1]["why"] == "producer fixed"
        assert actions.dismiss(dismissed.id, who="bob", why="dup").status == LetterStatus.DISMISSED
        with pytest.raises(DeadLetterActionRefused):
            actions.dismiss(dismissed.id, who="bob", why="dup")
        assert {d.id for d in store.list(status=LetterStatus.OPEN)} == set()

    def test_a_failed_write_raises_and_leaves_nothing_behind(self) -> None:
        store = self.make_store()
        kept, lost = letter(1), letter(2)
        store.write([kept])
        with pytest.raises(DeliveryFailed):
            self.failing_view(store).write([lost])
        assert store.get(lost.id) is None
        assert [d.id for d in store.list()] == [kept.id]
        store.write([lost])  # the batch comes again: nothing half-written stands in the way
        assert store.get(lost.id) == lost
