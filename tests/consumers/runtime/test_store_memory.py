from __future__ import annotations

import copy
from typing import Any

from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.store import Store
from tests.contracts.slot_store import NEW, OUTBOX, SlotStoreContract
from tests.contracts.store import TPX, StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self) -> Store:
        return MemoryStore()


class TestMemorySlotStore(SlotStoreContract):
    def make_store(self, **options: Any) -> Store:
        return MemoryStore(**{**NEW, **options})

    def release(self, store: Store, *, speaks: int, writes_slot_claims: bool) -> Store:
        assert isinstance(store, MemoryStore)
        other = copy.copy(store)  # the same claims, cursors and markers
        other.speaks, other.writes_slot_claims = speaks, writes_slot_claims
        return other

    def finalize(self, store: Store) -> None:
        assert isinstance(store, MemoryStore)
        store.finalize(2)

    def record(self, store: Store, project: str) -> bytes:
        assert isinstance(store, MemoryStore)
        found = store.slot_claims(TPX, 0, OUTBOX, project)
        assert found is not None
        return found.encode()
