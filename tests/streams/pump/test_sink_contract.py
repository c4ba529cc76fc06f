"""The pump-sink contract on the in-memory twin and on the real broker: a checkpoint alone, a
batch with its checkpoint, a failed commit that leaves neither."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.pump import sink as kafka_sink
from streams.errors import TransactionFailed
from streams.pump.kafka import KafkaSink
from streams.pump.pump import Sink
from tests.contracts.pump_sink import PumpSinkContract
from tests.support.environment import cleanup_environment, make_settings
from tests.support.pump import MemorySink, committed_events

FEED = "http://127.0.0.1:1/contract-feed"


class TestMemorySink(PumpSinkContract):
    def make_sink(self, fail_commit: int | None = None) -> Sink:
        return MemorySink(fail_at={fail_commit} if fail_commit else set())

    def visible(self, sink: Sink) -> Sequence[str]:
        assert isinstance(sink, MemorySink)
        return [e.event.event_id for e in sink.committed]


@pytest.mark.integration
class TestKafkaSink(PumpSinkContract):
    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        self.settings: Settings = make_settings()
        provision_environment(self.settings)
        self.sinks: list[KafkaSink] = []
        yield
        for made in self.sinks:
            made.close()
        cleanup_environment(self.settings)

    def make_sink(self, fail_commit: int | None = None) -> Sink:
        made = kafka_sink(self.settings, FEED)
        commits = 0

        def failpoint(name: str) -> None:
            nonlocal commits
            if name == "pump.before_commit":
                commits += 1
                if commits == fail_commit:
                    raise TransactionFailed("test", "failing before the commit on purpose")

        made.failpoint = failpoint
        self.sinks.append(made)
        return made

    def visible(self, sink: Sink) -> Sequence[str]:
        return [e.event_id for e in committed_events(self.settings)]
