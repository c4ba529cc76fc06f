"""The index-state and workflow-registry contracts against the in-memory twins the worker unit
tests use."""

from __future__ import annotations

from router.workers.helpers import (
    IndexStates,
    MemoryIndexStates,
    MemoryWorkflowRegistry,
    WorkflowRegistry,
)
from tests.contracts.worker_registries import IndexStatesContract, WorkflowRegistryContract


class TestMemoryIndexStates(IndexStatesContract):
    """One process: every "worker" of a test shares the same twin."""

    def setup_method(self) -> None:
        self.states = MemoryIndexStates()

    def make_states(self) -> IndexStates:
        return self.states


class TestMemoryWorkflowRegistry(WorkflowRegistryContract):
    def setup_method(self) -> None:
        self.registry = MemoryWorkflowRegistry()

    def make_registry(self) -> WorkflowRegistry:
        return self.registry
