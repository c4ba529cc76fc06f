"""The ObjectStore contract (tests/contracts/object_store.py) on the in-memory twin, the directory
store and the S3 store, and what each of them adds.

The S3 store runs here against moto's in-process S3 *mock*: this checks the requests our client
makes (keys, prefixes, pagination, the missing-object error) — a unit test, not a test against a
real S3-compatible server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.subscriptions.archive.store import LocalObjectStore, ObjectStore, S3ObjectStore
from streams.errors import ArchiveStoreError
from tests.contracts.object_store import ObjectStoreContract
from tests.support.archive import MemoryObjects


class TestMemoryObjects(ObjectStoreContract):
    """The twin the archiver's unit and property tests write to."""

    @pytest.fixture
    def store(self) -> ObjectStore:
        return MemoryObjects()


class TestLocalObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> ObjectStore:
        return LocalObjectStore(tmp_path)

    def test_no_temporary_is_left_and_empty_directories_go(self, tmp_path: Path) -> None:
        store = LocalObjectStore(tmp_path)
        store.put("events/2026-01-01/stream-00/a.gz", b"x")
        assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
        store.delete("events/2026-01-01/stream-00/a.gz")
        assert list(tmp_path.iterdir()) == []

    def test_a_temporary_left_by_a_crash_is_never_listed(self, tmp_path: Path) -> None:
        store = LocalObjectStore(tmp_path)
        store.put("events/d/a.gz", b"x")
        (tmp_path / "events" / "d" / ".b.gz.tmp-0123").write_bytes(b"half")
        assert list(store.list("events/")) == ["events/d/a.gz"]

    def test_an_unwritable_root_is_reported_naming_the_key(self, tmp_path: Path) -> None:
        (tmp_path / "events").write_text("a file where a directory should be")
        with pytest.raises(ArchiveStoreError, match="cannot write 'events/a.gz' in directory"):
            LocalObjectStore(tmp_path).put("events/a.gz", b"x")


class TestS3ObjectStoreOnMoto(ObjectStoreContract):
    """Request shapes only: moto is a mock of S3, not an S3-compatible server."""

    @pytest.fixture
    def store(self) -> Iterator[ObjectStore]:
        moto = pytest.importorskip("moto")
        boto3 = pytest.importorskip("boto3")
        with moto.mock_aws():
            client: Any = boto3.client("s3", region_name="us-east-1")
            client.create_bucket(Bucket="archive")
            client.put_object(Bucket="archive", Key="other-env/events/x", Body=b"not ours")
            yield S3ObjectStore(bucket="archive", prefix="tenv/", client=client)

    def test_keys_live_under_the_environments_prefix(self, store: ObjectStore) -> None:
        assert isinstance(store, S3ObjectStore)
        store.put("events/a", b"1")
        listed = store.client.list_objects_v2(Bucket="archive")["Contents"]
        assert sorted(o["Key"] for o in listed) == ["other-env/events/x", "tenv/events/a"]
        assert list(store.list("events/")) == ["events/a"]

    def test_a_missing_bucket_is_reported_naming_the_bucket(self, store: ObjectStore) -> None:
        assert isinstance(store, S3ObjectStore)
        gone = S3ObjectStore(bucket="no-such-bucket", client=store.client)
        with pytest.raises(ArchiveStoreError, match="s3://no-such-bucket"):
            gone.put("events/a", b"1")


def test_the_s3_store_needs_a_bucket() -> None:
    with pytest.raises(ArchiveStoreError, match="needs a bucket"):
        S3ObjectStore(bucket="", client=object())
