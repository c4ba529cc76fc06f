"""One contract for the runtime's Kafka-facing parts (Transport, Output, OutputLog), run against
the in-memory twin (unit) and confluent-kafka on the real broker (integration). The runtime's
property tests run on the twin, so the twin must do what librdkafka does.

Subclasses provide ``make_bench``: a fresh pair of topics (``topic``, two partitions, and
``out_topic``), a way to append plain records and to delete a partition's prefix, factories for
group members, transactional outputs and output logs bound to one group, and a way to make a
second member join (taking one partition away) and leave again (giving it back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar

import pytest

from consumers.runtime.transport import (
    AssignCallback,
    Committed,
    Output,
    OutputLog,
    RevokeCallback,
    Transport,
)
from consumers.runtime.types import (
    TP,
    OutRecord,
    Record,
    parse_cursor_marker,
    parse_txn_marker,
)
from streams.errors import TransactionFailed

T = TypeVar("T")

# How long an eventually-true fact (an asynchronous commit, a rebalance) may take on a loaded
# broker before the contract calls it broken.
SETTLE_S = 30.0


class Bench(Protocol):
    topic: str
    out_topic: str

    def append(self, partition: int, value: bytes) -> int: ...

    def delete_before(self, partition: int, offset: int) -> None:
        """Retention: the partition's records below ``offset`` are gone."""

    def member(self) -> Transport:
        """A new member of the bench's group, subscribed to ``topic``, with every partition
        assigned (from the group's committed offsets) by the time it is returned."""

    def join(self, on_assign: AssignCallback, on_revoke: RevokeCallback) -> Transport:
        """A new member of the group, subscribed with these callbacks; nothing is assigned to it
        before it polls."""

    def take_one(self, first: Transport, step: Callable[[], None]) -> Transport:
        """A second member joins and takes one of ``first``'s two partitions. Returns once each
        owns one; ``step`` polls ``first`` meanwhile (a rebalance needs every member polling)."""

    def leave(self, second: Transport, first: Transport, step: Callable[[], None]) -> None:
        """``second`` leaves the group; returns once ``first`` owns both partitions again."""

    def output(self) -> Output: ...

    def output_log(self) -> OutputLog: ...

    def close(self) -> None: ...


def eventually(probe: Callable[[], T], ok: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + SETTLE_S
    while True:
        value = probe()
        if ok(value) or time.monotonic() > deadline:
            assert ok(value), f"{what}: still {value!r} after {SETTLE_S} s"
            return value
        time.sleep(0.1)


def drain(transport: Transport, *, want: int, batch: int = 100) -> list[Record]:
    got: list[Record] = []

    def read() -> int:
        got.extend(transport.poll(batch, 0.2))
        return len(got)

    eventually(read, lambda n: n >= want, f"records read (want {want})")
    return got


def drain_quietly(transport: Transport) -> None:
    transport.poll(100, 0.2)


def by_partition(records: list[Record]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.offset)
    return out


def commit_and_wait(member: Transport, offsets: Mapping[TP, int]) -> None:
    member.commit_offsets(offsets, {})
    eventually(
        lambda: {tp: c.offset if c else None for tp, c in member.committed(offsets).items()},
        lambda got: got == dict(offsets),
        "the group's offsets",
    )


def no_rebalance(tps: list[TP]) -> Mapping[TP, int | None]:
    return {}


def ignore(tps: list[TP]) -> None:
    pass


class TransportContract:
    def make_bench(self) -> Bench:
        raise NotImplementedError

    @pytest.fixture
    def bench(self) -> Iterator[Bench]:
        made = self.make_bench()
        try:
            yield made
        finally:
            made.close()

    def test_offsets_sent_in_a_transaction_come_back_with_their_marker(self, bench: Bench) -> None:
        for n in range(3):
            bench.append(0, b"v%d" % n)
        member = bench.member()
        drain(member, want=3)
        tp = TP(bench.topic, 0)
        output = bench.output()
        output.begin()
        output.produce(OutRecord(bench.out_topic, "k", b"x", "rid-landed"))
        output.send_offsets({tp: 3}, member.group_metadata(), {tp: "rhumbatron.txn=7"})
        output.commit()
        got = member.committed([tp, TP(bench.topic, 1)])
        assert got[tp] == Committed(3, "rhumbatron.txn=7")
        assert parse_txn_marker(got[tp].metadata) == 7  # type: ignore[union-attr]
        assert got[TP(bench.topic, 1)] is None
        output.close()
        member.close()

    def test_an_aborted_transaction_leaves_neither_its_offsets_nor_its_records(
        self, bench: Bench
    ) -> None:
        bench.append(0, b"v")
        member = bench.member()
        drain(member, want=1)
        tp = TP(bench.topic, 0)
        output = bench.output()
        output.begin()
        output.produce(OutRecord(bench.out_topic, "k", b"kept", "rid-kept"))
        output.send_offsets({tp: 1}, member.group_metadata(), {tp: "rhumbatron.txn=1"})
        output.commit()
        output.begin()
        output.produce(OutRecord(bench.out_topic, "k", b"gone", "rid-aborted"))
        output.send_offsets({tp: 1}, member.group_metadata(), {tp: "rhumbatron.txn=2"})
        output.abort()
        assert member.committed([tp])[tp] == Committed(1, "rhumbatron.txn=1")
        log = bench.output_log()
        wanted = [
            OutRecord(bench.out_topic, "k", b"", "rid-kept"),
            OutRecord(bench.out_topic, "k", b"", "rid-aborted"),
            OutRecord(bench.out_topic, "k", b"", "rid-never-sent"),
        ]
        assert log.find(wanted, since_ms=int(time.time() * 1000) - 60_000) == {"rid-kept"}
        output.close()
        member.close()

    def test_an_offset_commit_carries_the_mark_it_was_given_or_none(self, bench: Bench) -> None:
        bench.append(0, b"v")
        bench.append(1, b"v")
        member = bench.member()
        drain(member, want=2)
        plain, marked = TP(bench.topic, 0), TP(bench.topic, 1)
        member.commit_offsets({plain: 1, marked: 1}, {marked: "rhumbatron.cursor=0"})
        got = eventually(
            lambda: member.committed([plain, marked]),
            lambda c: None not in c.values(),
            "the commits",
        )
        assert got == {plain: Committed(1, ""), marked: Committed(1, "rhumbatron.cursor=0")}
        assert parse_txn_marker(got[plain].metadata) is None  # type: ignore[union-attr]
        assert parse_cursor_marker(got[marked].metadata) == 0  # type: ignore[union-attr]
        member.close()

    def test_on_assign_none_or_omitted_starts_at_the_committed_offset_else_the_beginning(
        self, bench: Bench
    ) -> None:
        tp0 = TP(bench.topic, 0)
        for n in range(3):
            bench.append(0, b"a%d" % n)
            bench.append(1, b"b%d" % n)
        earlier = bench.member()
        commit_and_wait(earlier, {tp0: 2})
        earlier.close()
        member = bench.join(lambda tps: {tp0: None}, ignore)  # tp1 omitted
        got = by_partition(drain(member, want=4))
        assert got == {0: [2], 1: [0, 1, 2]}, got
        member.close()

    def test_an_offset_from_on_assign_wins_over_the_committed_one(self, bench: Bench) -> None:
        tp0, tp1 = TP(bench.topic, 0), TP(bench.topic, 1)
        for n in range(3):
            bench.append(0, b"a%d" % n)
            bench.append(1, b"b%d" % n)
        earlier = bench.member()
        commit_and_wait(earlier, {tp0: 2})
        earlier.close()
        member = bench.join(lambda tps: {tp0: 1, tp1: 2}, ignore)
        got = by_partition(drain(member, want=3))
        assert got == {0: [1, 2], 1: [2]}, got
        member.close()

    def test_log_start_moves_with_retention_and_a_new_member_starts_there(
        self, bench: Bench
    ) -> None:
        tp0, tp1 = TP(bench.topic, 0), TP(bench.topic, 1)
        for n in range(4):
            bench.append(0, b"a%d" % n)
        bench.append(1, b"b")
        probe = bench.join(no_rebalance, ignore)
        assert probe.log_start(tp0) == 0 and probe.log_start(tp1) == 0
        probe.close()
        bench.delete_before(0, 2)
        member = bench.join(no_rebalance, ignore)
        got = by_partition(drain(member, want=3))
        assert got == {0: [2, 3], 1: [0]}, got
        assert member.log_start(tp0) == 2 and member.log_start(tp1) == 0
        member.close()

    def test_high_watermark_cached_and_asked(self, bench: Bench) -> None:
        tp0, tp1 = TP(bench.topic, 0), TP(bench.topic, 1)
        for n in range(3):
            bench.append(0, b"a%d" % n)
        member = bench.member()
        assert member.high_watermark(tp0, cached=False) == 3
        assert member.high_watermark(tp1, cached=False) == 0
        # From the last fetch: unknown (-1) or behind, never ahead of the log.
        assert -1 <= member.high_watermark(tp0) <= 3
        drain(member, want=3)
        eventually(
            lambda: (member.poll(100, 0.1), member.high_watermark(tp0))[1],
            lambda high: high == 3,
            "the cached end after reading to it",
        )
        bench.append(0, b"a3")
        assert member.high_watermark(tp0, cached=False) == 4
        assert -1 <= member.high_watermark(tp0) <= 4
        member.close()

    def test_a_seek_moves_the_position_and_drops_what_was_fetched_before_it(
        self, bench: Bench
    ) -> None:
        tp0 = TP(bench.topic, 0)
        for n in range(6):
            bench.append(0, b"a%d" % n)
        member = bench.member()
        first = eventually(lambda: member.poll(1, 0.2), bool, "the first record")
        assert [r.offset for r in first] == [0]
        member.seek(tp0, 4)  # later: 1..3, fetched already, must not come
        assert by_partition(drain(member, want=2)) == {0: [4, 5]}
        member.seek(tp0, 1)  # earlier: read again
        assert by_partition(drain(member, want=5)) == {0: [1, 2, 3, 4, 5]}
        assert member.poll(100, 0.5) == []
        member.close()

    def test_a_poll_hands_over_what_is_there_without_waiting_for_a_full_batch(
        self, bench: Bench
    ) -> None:
        # A poll waits for its first message, not for max_records of them nor for its
        # timeout: a trickle of events is handed over as it comes. The polls run aside, bounded;
        # one may end on a partition's end alone, the next one brings the record.
        member = bench.member()
        drain_quietly(member)
        bench.append(0, b"alone")
        got: list[Record] = []

        def poll_until_a_record() -> None:
            while not got:
                got.extend(member.poll(1000, 3600.0))

        polling = threading.Thread(target=poll_until_a_record)
        polling.daemon = True
        polling.start()
        polling.join(SETTLE_S)
        assert not polling.is_alive(), "a poll with records there waited for more"
        assert [r.value for r in got] == [b"alone"]
        member.close()

    def test_caught_up_is_what_the_polls_have_seen_of_the_end(self, bench: Bench) -> None:
        tp0, tp1 = TP(bench.topic, 0), TP(bench.topic, 1)
        for n in range(3):
            bench.append(0, b"a%d" % n)
        member = bench.member()
        assert not member.caught_up([tp0])
        eventually(lambda: member.poll(1, 0.2), bool, "the first record")
        assert not member.caught_up([tp0])
        drain(member, want=2)
        eventually(
            lambda: (member.poll(100, 0.1), member.caught_up([tp0, tp1]))[1],
            bool,
            "caught up after reading to the end",
        )
        bench.append(0, b"a3")
        bench.append(0, b"a4")
        # librdkafka learns of new records from fetches, which only a poll hands over.
        assert member.caught_up([tp0]), "caught_up changed without a poll"
        got = eventually(lambda: member.poll(1, 0.2), bool, "a new record")
        assert [r.offset for r in got] == [3]
        assert not member.caught_up([tp0]) and member.caught_up([tp1])
        eventually(
            lambda: (member.poll(100, 0.1), member.caught_up([tp0]))[1],
            bool,
            "caught up again",
        )
        member.seek(tp0, 1)
        assert not member.caught_up([tp0])
        drain(member, want=4)
        eventually(
            lambda: (member.poll(100, 0.1), member.caught_up([tp0]))[1],
            bool,
            "caught up after the seek back",
        )
        member.close()

    def test_rebalance_callbacks_run_inside_poll_and_a_reassigned_partition_fetches_again(
        self, bench: Bench
    ) -> None:
        tps = {TP(bench.topic, 0), TP(bench.topic, 1)}
        for n in range(2):
            bench.append(0, b"a%d" % n)
            bench.append(1, b"b%d" % n)
        polling = False
        # (callback, its partitions, the member's assignment then, inside poll?)
        calls: list[tuple[str, set[TP], set[TP], bool]] = []

        def on_assign(got: list[TP]) -> Mapping[TP, int | None]:
            calls.append(("assign", set(got), member.assignment(), polling))
            return {}

        def on_revoke(gone: list[TP]) -> None:
            calls.append(("revoke", set(gone), member.assignment(), polling))

        read: list[Record] = []

        def step() -> None:
            nonlocal polling
            polling = True
            try:
                read.extend(member.poll(100, 0.2))
            finally:
                polling = False

        def read_on() -> int:
            step()
            return len(read)

        member = bench.join(on_assign, on_revoke)
        assert calls == [] and member.assignment() == set()
        eventually(read_on, lambda n: n >= 4, "the first reads")
        assert member.assignment() == tps
        assert calls == [("assign", tps, set(), True)], calls
        member.pause(tps)
        calls.clear()

        second = bench.take_one(member, step)
        (stayed,) = member.assignment()
        (moved,) = tps - {stayed}
        assert second.assignment() == {moved}
        # The revoke callback runs before the partition goes: the member still owns it.
        assert calls == [("revoke", {moved}, tps, True)], calls
        # Offsets of a partition no longer owned are not committed.
        member.commit_offsets({moved: 1, stayed: 2}, {})
        committed = eventually(
            lambda: member.committed(tps),
            lambda c: c[stayed] is not None,
            "the commit of the partition kept",
        )
        assert committed == {stayed: Committed(2, ""), moved: None}, committed
        calls.clear()

        read.clear()
        bench.leave(second, member, step)
        assert calls == [("assign", {moved}, {stayed}, True)], calls
        # Paused before it went, the moved partition fetches again (from the beginning:
        # nothing committed); the kept one is still paused.
        eventually(read_on, lambda n: n >= 2, "records of the partition given back")
        assert by_partition(read) == {moved.partition: [0, 1]}, read
        member.resume([stayed])
        bench.append(stayed.partition, b"new")
        assert by_partition(drain(member, want=1)) == {stayed.partition: [2]}
        # Closing gives everything up: the revoke callback runs inside close, first.
        calls.clear()
        member.close()
        assert calls == [("revoke", tps, tps, False)], calls

    def test_group_metadata_from_before_a_rebalance_is_refused_and_fresh_metadata_works(
        self, bench: Bench
    ) -> None:
        bench.append(0, b"a")
        bench.append(1, b"b")
        member = bench.member()
        drain(member, want=2)
        stale = member.group_metadata()
        second = bench.take_one(member, lambda: drain_quietly(member))
        (stayed,) = member.assignment()
        output = bench.output()
        output.begin()
        output.produce(OutRecord(bench.out_topic, "k", b"x", "rid-stale"))
        # A zombie's offsets: the coordinator fences a generation that moved on.
        with pytest.raises(TransactionFailed) as refused:
            output.send_offsets({stayed: 1}, stale, {stayed: "rhumbatron.txn=1"})
            output.commit()
        assert refused.value.abortable
        output.abort()
        output.begin()
        output.send_offsets({stayed: 1}, member.group_metadata())  # no metadata: ""
        output.commit()
        assert member.committed([stayed]) == {stayed: Committed(1, "")}
        output.close()
        second.close()
        member.close()

    def _write_transactions(self, bench: Bench) -> None:
        """Two committed transactions on one key's partition, an aborted one between them:
        ``a``, ``b`` | marker | (``gone`` and its abort marker, if it was sent) | ``c`` |
        marker."""
        output = bench.output()
        for values, commit in (((b"a", b"b"), True), ((b"gone",), False), ((b"c",), True)):
            output.begin()
            for value in values:
                output.produce(OutRecord(bench.topic, "k", value, f"rid-{value.decode()}"))
            if commit:
                output.commit()
            else:
                output.abort()
        output.close()

    def test_position_passes_transaction_markers_once_a_partition_is_read_to_its_end(
        self, bench: Bench
    ) -> None:
        member = bench.member()
        tps = [TP(bench.topic, 0), TP(bench.topic, 1)]
        assert [member.position(tp) for tp in tps] == [None, None], "nothing handed over yet"
        self._write_transactions(bench)
        got = drain(member, want=2)
        (tp,) = {r.tp for r in got}
        (other,) = set(tps) - {tp}

        def read_on() -> bool:
            got.extend(member.poll(100, 0.1))
            return member.caught_up(tps)

        eventually(read_on, bool, "read to the end")
        assert [r.value for r in got] == [b"a", b"b", b"c"]
        offsets = [r.offset for r in got]
        end = member.high_watermark(tp, cached=False)
        # The markers take offsets no reader is handed (and so does the aborted record, when
        # the producer had sent it before the abort: Kafka writes records as they go out).
        assert offsets[1] == offsets[0] + 1 and offsets[2] >= offsets[1] + 2, offsets
        assert end == offsets[2] + 2, (offsets, end)
        assert member.position(tp) == end
        assert member.position(other) == 0
        member.close()

    def test_position_stops_after_the_last_record_handed_over_and_a_seek_forgets_it(
        self, bench: Bench
    ) -> None:
        self._write_transactions(bench)
        member = bench.member()
        got = drain(member, want=3)
        (tp,) = {r.tp for r in got}
        a, b, c = (r.offset for r in got)
        member.seek(tp, a)
        assert member.position(tp) is None
        one = eventually(lambda: member.poll(1, 0.2), bool, "the first record again")
        assert [r.offset for r in one] == [a] and member.position(tp) == a + 1
        one = eventually(lambda: member.poll(1, 0.2), bool, "the second record")
        # A full batch stops right after its last record: the marker behind it is not read yet.
        assert [r.offset for r in one] == [b] and member.position(tp) == b + 1
        one = eventually(lambda: member.poll(1, 0.2), bool, "the third record")
        # The marker and the aborted transaction before it are passed on the way.
        assert [r.offset for r in one] == [c] and member.position(tp) == c + 1
        eventually(
            lambda: (member.poll(100, 0.1), member.caught_up([tp]))[1], bool, "read to the end"
        )
        assert member.position(tp) == member.high_watermark(tp, cached=False) == c + 2
        member.close()
