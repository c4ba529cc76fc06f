"""The transport contract against the in-memory twin the runtime's property tests run on."""

from __future__ import annotations

from consumers.runtime.memory import MemoryLog, MemoryOutput, MemoryOutputLog, MemoryTransport
from consumers.runtime.transport import Output, OutputLog, Transport
from tests.contracts.transport import TransportContract


class MemoryBench:
    topic = "contract_in"
    out_topic = "contract_out"

    def __init__(self) -> None:
        self.log = MemoryLog()
        self.log.create(self.topic, 2)
        self.log.create(self.out_topic, 2)

    def append(self, partition: int, value: bytes) -> int:
        return self.log.append(self.topic, partition, value)

    def member(self) -> Transport:
        transport = MemoryTransport(self.log, "contract-group")
        transport.subscribe([self.topic], lambda tps: {}, lambda tps: None)
        transport.poll(0, 0)  # the assignment happens inside poll, as librdkafka's does
        return transport

    def output(self) -> Output:
        return MemoryOutput(self.log)

    def output_log(self) -> OutputLog:
        return MemoryOutputLog(self.log)

    def close(self) -> None:
        pass


class TestMemoryTransport(TransportContract):
    def make_bench(self) -> MemoryBench:
        return MemoryBench()
