"""The archive's S3 store against a real S3-compatible server (S3Proxy on a local directory): the
ObjectStore contract, and the audit-archiver writing to a bucket from a ``consume`` subprocess."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from consumers.subscriptions.archive.store import ObjectStore, S3ObjectStore
from router.settings import Settings
from router.wiring.archive import count_parts
from streams.errors import ArchiveStoreError
from streams.workload import slotted_events, workload
from tests.contracts.object_store import ObjectStoreContract
from tests.support.environment import run_cli
from tests.support.runtime_processes import cli, publish, runtime_settings
from tests.support.s3proxy import S3Server, create_bucket, s3proxy

pytestmark = pytest.mark.integration
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3proxy(tmp_path_factory.mktemp("s3proxy")) as s:
        yield s


def _bucket(server: S3Server) -> str:
    name = f"rh-{uuid.uuid4().hex[:12]}"
    create_bucket(server, name)
    return name


class TestS3ObjectStoreOnS3Proxy(ObjectStoreContract):
    @pytest.fixture
    def store(self, server: S3Server) -> ObjectStore:
        return S3ObjectStore(
            bucket=_bucket(server),
            prefix="tenv/",
            endpoint_url=server.endpoint,
            region="us-east-1",
            access_key=server.identity,
            secret_key=server.credential,
        )

    def test_wrong_credentials_are_reported_naming_the_store(self, server: S3Server) -> None:
        store = S3ObjectStore(
            bucket=_bucket(server),
            endpoint_url=server.endpoint,
            region="us-east-1",
            access_key=server.identity,
            secret_key="wrong",
        )
        with pytest.raises(
            ArchiveStoreError, match=f"cannot write 'a' in bucket .* at {server.endpoint}"
        ):
            store.put("a", b"x")


def test_the_archiver_writes_every_event_once_to_a_bucket(
    settings: Settings, server: S3Server, tmp_path: Path
) -> None:
    today = datetime.now(UTC).date()
    s = runtime_settings(
        settings,
        archive_store="s3",
        archive_s3_endpoint=server.endpoint,
        archive_s3_bucket=_bucket(server),
        archive_s3_access_key=server.identity,
        archive_s3_secret_key=server.credential,
        archive_part_max_events=40,
        batch_size=50,
    )
    start = datetime(today.year, today.month, today.day, 0, 0, 1, tzinfo=UTC)
    events = slotted_events(workload("archs3", 10, 200), tenant_id="t", start=start)
    cli(s, "provision")
    publish(s, events)
    publish(s, events)

    def rhumbatron(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(s, *args)  # the S3 keys travel as every setting does

    consumed = rhumbatron("consume", "--subscription", "audit-archiver", "--until-idle", "4")
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    verified = rhumbatron("archive", "verify", "--day", today.isoformat(), "--json")
    assert verified.returncode == 0, verified.stderr[-3000:]
    report = orjson.loads(verified.stdout)
    assert (report["events"], report["duplicate_events"], report["bad_parts"]) == (200, 0, [])
    assert report["parts"] == count_parts(s) >= 200 // 40
