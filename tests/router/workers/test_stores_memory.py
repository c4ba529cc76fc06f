"""The workers' ledger and counter contracts against the in-memory twins the worker unit tests
use."""

from __future__ import annotations

from router.workers.stores import (
    CommandLedger,
    MemoryCommandLedger,
    MemoryWorkerMetrics,
    WorkerMetrics,
)
from tests.contracts.worker_ledgers import CommandLedgerContract, WorkerMetricsContract


class TestMemoryCommandLedger(CommandLedgerContract):
    """One process: every "worker" of a test shares the same twin."""

    def setup_method(self) -> None:
        self.ledger = MemoryCommandLedger()

    def make_ledger(self) -> CommandLedger:
        return self.ledger


class TestMemoryWorkerMetrics(WorkerMetricsContract):
    def setup_method(self) -> None:
        self.metrics = MemoryWorkerMetrics()

    def make_metrics(self) -> WorkerMetrics:
        return self.metrics

    def read_metrics(self) -> dict[str, dict[str, int]]:
        return {
            queue: dict(sorted(counts.items()))
            for queue, counts in sorted(self.metrics.counts.items())
        }
