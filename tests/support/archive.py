"""The archive's object store in memory, for unit and property tests."""

from __future__ import annotations

from collections.abc import Iterator

from consumers.subscriptions.archive.store import check_key
from streams.errors import ObjectMissing


class MemoryObjects:
    """An object store in a dict; it keeps the ObjectStore contract (tests/contracts/
    object_store.py), the directory store and the S3 store run too. ``puts`` counts writes."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts = 0

    def put(self, key: str, data: bytes) -> None:
        self.objects[check_key(key)] = bytes(data)
        self.puts += 1

    def get(self, key: str) -> bytes:
        if check_key(key) not in self.objects:
            raise ObjectMissing(key, self.describe())
        return self.objects[key]

    def list(self, prefix: str) -> Iterator[str]:
        return iter(sorted(k for k in self.objects if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        self.objects.pop(check_key(key), None)

    def describe(self) -> str:
        return "memory"
