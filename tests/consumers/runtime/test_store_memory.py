from __future__ import annotations

from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.store import Store
from tests.contracts.store import StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self) -> Store:
        return MemoryStore()
