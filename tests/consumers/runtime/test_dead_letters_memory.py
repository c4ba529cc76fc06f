"""The dead-letter store contract against the in-memory twin the runtime's tests run on."""

from __future__ import annotations

from typing import cast

from consumers.runtime.dead_letters import DeadLetterStore, MemoryDeadLetters
from tests.contracts.dead_letters import DeadLetterStoreContract


class TestMemoryDeadLetters(DeadLetterStoreContract):
    def make_store(self) -> DeadLetterStore:
        return MemoryDeadLetters()

    def failing_view(self, store: DeadLetterStore) -> DeadLetterStore:
        cast(MemoryDeadLetters, store).fail_next_write = True
        return store
