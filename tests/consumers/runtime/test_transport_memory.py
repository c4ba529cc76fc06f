"""The transport contract against the in-memory twin the runtime's property tests run on."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from consumers.runtime.memory_transport import (
    MemoryLog,
    MemoryOutput,
    MemoryOutputLog,
    MemoryTransport,
)
from consumers.runtime.transport import (
    AssignCallback,
    Output,
    OutputLog,
    RevokeCallback,
    Transport,
)
from consumers.runtime.types import TP
from tests.contracts.transport import TransportContract, ignore, no_rebalance

GROUP = "contract-group"


class MemoryBench:
    topic = "contract_in"
    out_topic = "contract_out"

    def __init__(self) -> None:
        self.log = MemoryLog()
        self.log.create(self.topic, 2)
        self.log.create(self.out_topic, 2)
        self.retention: dict[TP, int] = {}

    def append(self, partition: int, value: bytes) -> int:
        return self.log.append(self.topic, partition, value)

    def delete_before(self, partition: int, offset: int) -> None:
        self.retention[TP(self.topic, partition)] = offset

    def member(self) -> Transport:
        transport = self.join(no_rebalance, ignore)
        transport.poll(0, 0)  # the assignment happens inside poll, as librdkafka's does
        return transport

    def join(self, on_assign: AssignCallback, on_revoke: RevokeCallback) -> Transport:
        transport = MemoryTransport(self.log, GROUP)
        transport.retention_start = self.retention
        transport.subscribe([self.topic], on_assign, on_revoke)
        return transport

    def take_one(self, first: Transport, step: Callable[[], None]) -> Transport:
        owner = cast(MemoryTransport, first)
        second = MemoryTransport(self.log, GROUP, auto_assign=False)
        second.retention_start = self.retention
        second.subscribe([self.topic], no_rebalance, ignore)
        moved = max(owner.assignment())
        owner.revoke([moved])
        step()
        second.assign([moved])
        second.poll(0, 0)
        return second

    def leave(self, second: Transport, first: Transport, step: Callable[[], None]) -> None:
        leaving = cast(MemoryTransport, second)
        gone = sorted(leaving.assignment())
        leaving.revoke(gone)
        leaving.poll(0, 0)
        leaving.close()
        cast(MemoryTransport, first).assign(gone)
        step()

    def output(self) -> Output:
        return MemoryOutput(self.log)

    def output_log(self) -> OutputLog:
        return MemoryOutputLog(self.log)

    def close(self) -> None:
        pass


class TestMemoryTransport(TransportContract):
    def make_bench(self) -> MemoryBench:
        return MemoryBench()
