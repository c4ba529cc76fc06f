"""One contract for the runtime's Kafka-facing parts (Transport, Output, OutputLog), run against
the in-memory twin (unit) and confluent-kafka on the real broker (integration). The runtime's
property tests run on the twin, so the twin must do what librdkafka does.

Subclasses provide ``make_bench``: a fresh pair of topics (``topic``, two partitions, and
``out_topic``), a way to append plain records, and factories for group members, transactional
outputs and output logs bound to one group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from consumers.runtime.transport import Committed, Output, OutputLog, Transport
from consumers.runtime.types import TP, OutRecord, Record, parse_txn_marker

T = TypeVar("T")

# How long an eventually-true fact (an asynchronous commit, a rebalance) may take on a loaded
# broker before the contract calls it broken.
SETTLE_S = 30.0


class Bench(Protocol):
    topic: str
    out_topic: str

    def append(self, partition: int, value: bytes) -> int: ...

    def member(self) -> Transport:
        """A new member of the bench's group, subscribed to ``topic``, with every partition
        assigned (from the group's committed offsets) by the time it is returned."""

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


def drain(transport: Transport, *, want: int) -> list[Record]:
    got: list[Record] = []

    def read() -> int:
        got.extend(transport.poll(100, 0.2))
        return len(got)

    eventually(read, lambda n: n >= want, f"records read (want {want})")
    return got


class TransportContract:
    def make_bench(self) -> Bench:
        raise NotImplementedError

    def test_offsets_sent_in_a_transaction_come_back_with_their_marker(self) -> None:
        bench = self.make_bench()
        try:
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
        finally:
            bench.close()

    def test_an_aborted_transaction_leaves_neither_its_offsets_nor_its_records(self) -> None:
        bench = self.make_bench()
        try:
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
        finally:
            bench.close()

    def test_a_plain_offset_commit_carries_no_marker(self) -> None:
        bench = self.make_bench()
        try:
            bench.append(1, b"v")
            member = bench.member()
            drain(member, want=1)
            tp = TP(bench.topic, 1)
            member.commit_offsets({tp: 1})
            got = eventually(
                lambda: member.committed([tp])[tp],
                lambda c: c is not None,
                "the plain commit",
            )
            assert got == Committed(1, "")
            assert parse_txn_marker(got.metadata) is None
            member.close()
        finally:
            bench.close()
