"""A real S3-compatible server for the archive's S3 store tests: S3Proxy (Apache jclouds behind
the S3 REST API, on a local directory), resolved from Maven Central by ``infra/s3proxy/pom.xml``
into ``.local/s3proxy/jars`` once and started on a free loopback port per test module."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.environment import ROOT

POM = ROOT / "infra" / "s3proxy" / "pom.xml"
JARS = ROOT / ".local" / "s3proxy" / "jars"
IDENTITY = "rhumbatron-test"
CREDENTIAL = "rhumbatron-test-secret"
START_TIMEOUT_S = 60.0  # a bound on a JVM start on a busy 2-core machine, not an expectation


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    identity: str = IDENTITY
    credential: str = CREDENTIAL


def jars() -> Path:
    """The jars, resolved once per pom version (like infra/local.sh does for Kafka)."""
    stamp = JARS / ".pom-sha256"
    want = hashlib.sha256(POM.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return JARS
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise RuntimeError("the S3 store tests need mvn and java (as the Kafka infra does)")
    tmp = JARS.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ],
        check=True,
        timeout=600,
    )
    shutil.rmtree(JARS, ignore_errors=True)
    tmp.rename(JARS)
    stamp.write_text(want)
    return JARS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3proxy(data_dir: Path) -> Iterator[S3Server]:
    port = _free_port()
    conf = data_dir / "s3proxy.conf"
    (data_dir / "blobs").mkdir(parents=True, exist_ok=True)
    conf.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint=http://127.0.0.1:{port}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={IDENTITY}",
                f"s3proxy.credential={CREDENTIAL}",
                "jclouds.provider=filesystem",
                f"jclouds.filesystem.basedir={data_dir / 'blobs'}",
            ]
        )
        + "\n"
    )
    log = (data_dir / "s3proxy.log").open("wb")
    proc = subprocess.Popen(
        [
            "java",
            "-Xmx256m",
            "-DLOG_LEVEL=warn",
            "-cp",
            f"{jars()}/*",
            "org.gaul.s3proxy.Main",
            "--properties",
            str(conf),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"S3Proxy exited {proc.returncode}: {(data_dir / 's3proxy.log').read_text()[-2000:]}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"S3Proxy did not listen on {port}") from None
                time.sleep(0.2)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def create_bucket(server: S3Server, name: str, region: str = "us-east-1") -> None:
    """Make the bucket ``name`` on ``server`` (boto3, as an operator's tool would)."""
    import boto3  # type: ignore[import-untyped]

    client: Any = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.identity,
        aws_secret_access_key=server.credential,
        region_name=region,
    )
    client.create_bucket(Bucket=name)
