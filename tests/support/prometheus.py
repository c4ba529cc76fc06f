"""Debian's Prometheus for the dashboards' tests (installed by ``infra/local.sh prometheus-install``):
``promtool``, and a ``prometheus`` of the test's own on a free port, with a configuration and a
data directory in the test's temporary folder, queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support.environment import ROOT
from tests.support.waiting import stop_process

DASHBOARDS = ROOT / "infra" / "dashboards"
ALERT_RULES = DASHBOARDS / "alerts.yml"
START_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 30.0
POLL_S = 0.25

T = TypeVar("T")


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} not found: run `infra/local.sh prometheus-install`")
    return found


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=QUERY_TIMEOUT_S,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass(frozen=True)
class Target:
    """One scrape target: the job it belongs to, its ``host:port``, and the labels it gets."""

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)


def config(targets: Sequence[Target], rule_files: Sequence[Path], scrape_interval: str) -> str:
    """A Prometheus configuration, written as JSON (which is YAML too)."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append(
            {"targets": [target.address], "labels": target.labels}
        )
    return json.dumps(
        {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": groups} for job, groups in jobs.items()
            ],
        },
        indent=2,
    )


class QueryError(AssertionError):
    pass


class Prometheus:
    """A running prometheus: ``query`` an expression, read its ``rules`` and ``targets``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=QUERY_TIMEOUT_S)

    def _data(self, path: str, **params: str) -> Any:
        answer = self.http.get(path, params=params)
        body = answer.json()
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now: ``[{"metric": {...}, "value": [t, v]}]``."""
        data = self._data("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise QueryError(f"{expr} is a {data['resultType']}, not an instant vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """The values ``label`` takes on the series ``match`` selects (Grafana's label_values)."""
        values: list[str] = self._data(f"/api/v1/label/{label}/values", **{"match[]": match})
        return values

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._data("/api/v1/rules")["groups"] for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._data("/api/v1/targets")["activeTargets"]
        return active


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = START_TIMEOUT_S) -> T:
    """``probe()``'s first answer that is not None, tried until ``timeout`` (a bound on a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout:.0f}s")
        time.sleep(POLL_S)


@contextmanager
def running_prometheus(
    folder: Path,
    targets: Sequence[Target] = (),
    *,
    rule_files: Sequence[Path] = (ALERT_RULES,),
    scrape_interval: str = "1s",
) -> Iterator[Prometheus]:
    """Debian's prometheus on a free port of 127.0.0.1, until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / "prometheus.yml"
    config_file.write_text(config(targets, rule_files, scrape_interval))
    checked = promtool("check", "config", config_file)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prometheus = Prometheus(f"http://127.0.0.1:{port}")

    def ready() -> bool | None:
        if proc.poll() is not None:
            raise AssertionError(
                f"prometheus exited {proc.returncode}:\n{(folder / 'prometheus.log').read_text()}"
            )
        try:
            return True if prometheus.http.get("/-/ready").status_code == 200 else None
        except httpx.TransportError:
            return None

    try:
        wait_for("prometheus to be ready", ready)
        yield prometheus
    finally:
        prometheus.http.close()
        stop_process(proc)
        log.close()
