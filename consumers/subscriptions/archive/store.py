"""Object stores for the archive: the ``ObjectStore`` protocol and two implementations.

- :class:`LocalObjectStore` (the default): a directory; a ``put`` writes a temporary file in the
  target's directory, fsyncs it, renames it over the key and fsyncs the directory, so a key holds
  either nothing or the whole object, across a crash or a power cut. Parts are created 0600 and
  the directories it makes 0700 (streams/files.py): an archive holds every event's payload.
- :class:`S3ObjectStore`: any S3-compatible service (``pip install rhumbatron[s3]``); boto3 is
  imported only when this store is built, so the core does not need it. An S3 PUT is atomic.

Keys are ``/``-separated relative paths of letters, digits and ``._-``; anything else (``..``, an
absolute path, an empty segment) is refused before touching the store.
"""

from __future__ import annotations

import importlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from streams.errors import ArchiveStoreError, ObjectMissing
from streams.files import open_private, private_dir

_KEY = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
_TMP_MARK = ".tmp-"


class ObjectStore(Protocol):
    """Where archive parts live."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` durably and atomically (replacing any object there)."""

    def get(self, key: str) -> bytes:
        """The object's bytes; raises :class:`ObjectMissing` if there is none."""

    def list(self, prefix: str) -> Iterator[str]:
        """Keys starting with ``prefix``, in lexicographic order."""

    def delete(self, key: str) -> None:
        """Remove the object; removing a missing object is not an error."""

    def describe(self) -> str:
        """Where this store is, for messages."""


def check_key(key: str) -> str:
    if not _KEY.match(key) or any(seg in (".", "..") for seg in key.split("/")):
        raise ArchiveStoreError(
            f"object key {key!r} is not a relative path of letters, digits and '._-' segments"
        )
    if _TMP_MARK in key:
        raise ArchiveStoreError(f"object key {key!r} contains {_TMP_MARK!r}, kept for temporaries")
    return key


class LocalObjectStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _ensure_dir(self, directory: Path) -> None:
        """Create missing directories one by one, fsyncing each parent so the new entry
        survives a power cut (a renamed file in a directory that was never synced can vanish)."""
        missing = []
        d = directory
        while not d.exists():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            private_dir(d, parents=False)
            _fsync_dir(d.parent)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            self._ensure_dir(path.parent)
            tmp = path.with_name(f".{path.name}{_TMP_MARK}{secrets.token_hex(6)}")
            fd = open_private(tmp, os.O_WRONLY | os.O_EXCL)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)
        except OSError as exc:
            raise ArchiveStoreError(f"cannot write {key!r} in {self.describe()}: {exc}") from exc

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ObjectMissing(key, self.describe()) from None
        except OSError as exc:
            raise ArchiveStoreError(f"cannot read {key!r} in {self.describe()}: {exc}") from exc

    def list(self, prefix: str) -> Iterator[str]:
        # Walk only the directory the prefix points into, not the whole store.
        head, _, _ = prefix.rpartition("/")
        base = self.root / head if head else self.root
        existing = next(d for d in (self.root, *self.root.parents) if d.exists())
        if not existing.is_dir():
            raise ArchiveStoreError(
                f"cannot list {prefix + '*'!r} in {self.describe()}: {existing} is not a "
                "directory; point archive_dir (RHUMBATRON_ARCHIVE_DIR) at a directory"
            )
        if not base.is_dir():
            return iter(())  # nothing archived there yet

        def unreadable(exc: OSError) -> None:
            # os.walk skips what it cannot read unless told: a listing must not silently miss
            # parts (verify and expire would report a day short).
            raise ArchiveStoreError(
                f"cannot list {prefix + '*'!r} in {self.describe()}: {exc}"
            ) from exc

        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable):
            dirnames.sort()
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if _TMP_MARK in name:
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    found.append(key)
        return iter(sorted(found))

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise ArchiveStoreError(f"cannot delete {key!r} in {self.describe()}: {exc}") from exc
        # Empty directories (a day whose parts all expired) go too, up to the root.
        d = path.parent
        while d != self.root and self.root in d.parents:
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class S3ObjectStore:
    """An S3-compatible bucket; every key lives under ``prefix`` (e.g. ``"<env>/"``)."""

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        timeout_s: float = 10.0,
        client: Any = None,
    ) -> None:
        if not bucket:
            raise ArchiveStoreError("the S3 store needs a bucket (setting archive_s3_bucket)")
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        if client is None:
            try:
                boto3 = importlib.import_module("boto3")
                botocore_config = importlib.import_module("botocore.config")
            except ModuleNotFoundError as exc:
                raise ArchiveStoreError(
                    "the S3 archive store needs boto3: pip install 'rhumbatron[s3]'"
                ) from exc
            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=botocore_config.Config(
                    connect_timeout=timeout_s,
                    read_timeout=timeout_s,
                    retries={"max_attempts": 3},
                    # boto3 >= 1.36 adds CRC32 checksums (aws-chunked trailers) to every PUT by
                    # default; S3-compatible servers refuse them as "NotImplemented". Checksums
                    # only where the API requires them; parts carry their own SHA-256 anyway.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
        self.client = client

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"bucket s3://{self.bucket}/{self.prefix}{where}"

    def _fail(self, action: str, key: str, exc: Exception) -> ArchiveStoreError:
        return ArchiveStoreError(f"cannot {action} {key!r} in {self.describe()}: {exc}")

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code", ""))
        return ""

    def put(self, key: str, data: bytes) -> None:
        full = self.prefix + check_key(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except Exception as exc:
            raise self._fail("write", key, exc) from exc

    def get(self, key: str) -> bytes:
        full = self.prefix + check_key(key)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            return bytes(response["Body"].read())
        except Exception as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectMissing(key, self.describe()) from None
            raise self._fail("read", key, exc) from exc

    def list(self, prefix: str) -> Iterator[str]:
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            # Some S3-compatible servers list directory placeholders ("a/b/"); no object of
            # ours ends in "/" (check_key), so they are never ours.
            keys = [
                item["Key"][len(self.prefix) :]
                for page in pages
                for item in page.get("Contents", [])
                if not item["Key"].endswith("/")
            ]
        except Exception as exc:
            raise self._fail("list", prefix + "*", exc) from exc
        return iter(sorted(keys))

    def delete(self, key: str) -> None:
        full = self.prefix + check_key(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            raise self._fail("delete", key, exc) from exc
