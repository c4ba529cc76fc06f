"""One contract for every ObjectStore (STYLE: shared test classes per interface): the archive's
parts and index live in one. Subclasses provide the ``store`` fixture: a store of its own, empty,
per test. The directory store and the in-memory twin run it in unit tests, the S3 store on moto's
mock (request shapes) and against S3Proxy (a real S3-compatible server)."""

from __future__ import annotations

import pytest

from consumers.subscriptions.archive.store import ObjectStore
from streams.errors import ArchiveStoreError, ObjectMissing


class ObjectStoreContract:
    @pytest.fixture
    def store(self) -> ObjectStore:
        raise NotImplementedError

    def test_put_get_replace(self, store: ObjectStore) -> None:
        store.put("events/2026-01-01/stream-00/a.gz", b"one")
        store.put("events/2026-01-01/stream-00/a.gz", b"two")
        assert store.get("events/2026-01-01/stream-00/a.gz") == b"two"
        store.put("index/e", b"")
        assert store.get("index/e") == b""

    def test_bytes_come_back_exactly(self, store: ObjectStore) -> None:
        # A gzip part is arbitrary bytes: no decoding, no newline translation, no truncation.
        data = bytes(range(256)) * 64 + b"\r\n\x00"
        store.put("events/d/part.gz", data)
        assert store.get("events/d/part.gz") == data
        store.put("events/d/part.gz", b"short")  # a shorter replacement leaves no tail behind
        assert store.get("events/d/part.gz") == b"short"

    def test_list_by_prefix_in_order(self, store: ObjectStore) -> None:
        keys = [
            "events/2026-01-02/stream-01/b.gz",
            "events/2026-01-01/stream-00/a.gz",
            "events/2026-01-01/stream-07/c.gz",
            "index/stream-00/p0/x",
        ]
        for key in keys:
            store.put(key, key.encode())
        assert list(store.list("events/")) == sorted(keys[:3])
        assert list(store.list("events/2026-01-01/")) == sorted(keys[1:3])
        assert list(store.list("events/2026-01-0")) == sorted(keys[:3])
        assert list(store.list("index/stream-00/p0/")) == ["index/stream-00/p0/x"]
        assert list(store.list("none/")) == []

    def test_list_orders_keys_as_strings_not_as_paths(self, store: ObjectStore) -> None:
        # The reader walks parts in listed order: "-" and "." sort before "/", which sorts
        # before digits, whatever directories a store keeps the keys in.
        keys = ["a/b0", "a/b/c", "a/b.c", "a/b-c", "a/b/a/z"]
        for key in keys:
            store.put(key, b"")
        assert list(store.list("a/")) == ["a/b-c", "a/b.c", "a/b/a/z", "a/b/c", "a/b0"]
        assert list(store.list("a/b/")) == ["a/b/a/z", "a/b/c"]

    def test_a_listing_is_complete_while_its_keys_are_deleted(self, store: ObjectStore) -> None:
        # The expiry sweep deletes the parts it is listing.
        keys = [f"events/d/p{n:02d}" for n in range(5)]
        for key in keys:
            store.put(key, b"x")
        seen = []
        for key in store.list("events/"):
            seen.append(key)
            store.delete(key)
        assert seen == keys
        assert list(store.list("events/")) == []

    def test_missing_and_delete(self, store: ObjectStore) -> None:
        with pytest.raises(ObjectMissing, match="no object 'events/x'"):
            store.get("events/x")
        store.put("events/x", b"1")
        store.delete("events/x")
        store.delete("events/x")  # idempotent
        with pytest.raises(ObjectMissing):
            store.get("events/x")
        assert list(store.list("events/")) == []

    def test_a_missing_object_is_also_a_key_error(self, store: ObjectStore) -> None:
        with pytest.raises(KeyError):
            store.get("never/written")

    def test_delete_removes_that_key_only(self, store: ObjectStore) -> None:
        for key in ("events/a", "events/ab", "events/a.gz", "events/b/a"):
            store.put(key, key.encode())
        store.delete("events/a")
        assert list(store.list("events/")) == ["events/a.gz", "events/ab", "events/b/a"]
        assert store.get("events/ab") == b"events/ab"

    def test_bad_keys_are_refused_before_any_call(self, store: ObjectStore) -> None:
        for bad in ("../x", "/abs", "a//b", "a/../b", "sp ace", "", "a/", "a/./b"):
            with pytest.raises(ArchiveStoreError, match="is not a relative path"):
                store.put(bad, b"")
            with pytest.raises(ArchiveStoreError, match="is not a relative path"):
                store.get(bad)
            with pytest.raises(ArchiveStoreError, match="is not a relative path"):
                store.delete(bad)
        with pytest.raises(ArchiveStoreError, match="kept for temporaries"):
            store.put("events/x.tmp-1", b"")
        assert list(store.list("")) == []

    def test_many_keys_list_completely(self, store: ObjectStore) -> None:
        keys = [f"index/stream-00/p0/{n:020d}" for n in range(1100)]  # past one S3 list page
        for key in keys:
            store.put(key, b"")
        assert list(store.list("index/")) == keys
