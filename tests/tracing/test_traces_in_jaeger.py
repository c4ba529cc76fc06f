"""The traces in a real trace store: Jaeger v2 (built by ``infra/local.sh jaeger``), run by this
test with the shipped configuration (infra/dashboards/jaeger/config.yaml, traces in memory) on
free ports of its own. The real processes — ``produce --outbox`` (the writer), ``publish``, the
``project-view-projector`` and ``causal-router`` consumers and the ``integration`` queue's worker —
export their spans over OTLP/HTTP to Jaeger while they run on the real broker; the test then asks
Jaeger's HTTP API (``/api/services``, ``/api/traces``) for the trace of the ``change.dispatch``
command the router sent. It must be one trace with spans of the five services (each process
exports its own ``service.name``), a single root (the writer's), and every span's parent in it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.topology import queue_name
from tests.support.environment import ROOT
from tests.support.prometheus import free_port
from tests.support.traced_run import PROJECTOR, QUEUE, ROUTER, run_dispatch, traced_env
from tests.support.waiting import stop_process, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JAEGER_VERSION = "1.75.0"  # infra/local.sh's JAEGER_VERSION
JAEGER_BIN = ROOT / ".local" / "jaeger" / JAEGER_VERSION / "jaeger"
JAEGER_CONFIG = ROOT / "infra" / "dashboards" / "jaeger" / "config.yaml"
# The port variables the configuration reads, each given a free port here.
PORTS = (
    "RHUMBATRON_JAEGER_OTLP_GRPC_PORT",
    "RHUMBATRON_JAEGER_OTLP_HTTP_PORT",
    "RHUMBATRON_JAEGER_QUERY_PORT",
    "RHUMBATRON_JAEGER_QUERY_GRPC_PORT",
    "RHUMBATRON_JAEGER_HEALTH_PORT",
    "RHUMBATRON_JAEGER_METRICS_PORT",
)
# Bounds on a hang on a busy 2-core machine, not expectations.
START_TIMEOUT_S = 60.0
STORED_TIMEOUT_S = 60.0

PRODUCER = "rhumbatron-producer"
PUBLISHER = "rhumbatron-publisher"
WORKER = f"rhumbatron-worker-{QUEUE}"
SERVICES = {PRODUCER, PUBLISHER, f"rhumbatron-{PROJECTOR}", f"rhumbatron-{ROUTER}", WORKER}
CLOCK_SKEW = "clock skew adjustment"  # how Jaeger's clock-skew warnings begin


@dataclass(frozen=True)
class Jaeger:
    otlp_http: str  # what OTEL_EXPORTER_OTLP_ENDPOINT names
    api: httpx.Client  # the query service's HTTP API

    def services(self) -> list[str]:
        return list(self._data("/api/services") or [])

    def traces(self, **params: str) -> list[dict[str, Any]]:
        return list(self._data("/api/traces", **params) or [])

    def _data(self, path: str, **params: str) -> Any:
        answer = self.api.get(path, params=params)
        assert answer.status_code == 200, f"{path} {params}: {answer.status_code} {answer.text}"
        body = answer.json()
        assert not body.get("errors"), f"{path} {params}: {body['errors']}"
        return body["data"]


@contextmanager
def running_jaeger(folder: Path) -> Iterator[Jaeger]:
    """Jaeger with the shipped configuration on free ports of 127.0.0.1, until the block ends."""
    assert JAEGER_BIN.exists(), f"{JAEGER_BIN} is missing: run `infra/local.sh jaeger`"
    ports = {name: free_port() for name in PORTS}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({name: str(port) for name, port in ports.items()})
    log_file = folder / "jaeger.log"
    with log_file.open("w") as log:
        proc = subprocess.Popen(
            [str(JAEGER_BIN), "--config", str(JAEGER_CONFIG)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{ports['RHUMBATRON_JAEGER_QUERY_PORT']}", timeout=10.0
    )

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"jaeger exited {proc.returncode}:\n{log_file.read_text()[-3000:]}"
            )
        try:
            return api.get("/api/services").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(
            answers,
            START_TIMEOUT_S,
            "jaeger answers /api/services",
            lambda: log_file.read_text()[-3000:],
        )
        yield Jaeger(f"http://127.0.0.1:{ports['RHUMBATRON_JAEGER_OTLP_HTTP_PORT']}", api)
    finally:
        api.close()
        stop_process(proc)


def _tag(span: dict[str, Any], key: str) -> Any:
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


def _service(trace: dict[str, Any], span: dict[str, Any]) -> str:
    return str(trace["processes"][span["processID"]]["serviceName"])


def _parent(span: dict[str, Any]) -> str | None:
    """The span's parent: Jaeger writes an OTLP parent as the CHILD_OF reference (links are
    FOLLOWS_FROM references, to spans of other traces: the consumed batches')."""
    parents = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
    assert len(parents) <= 1, span
    return parents[0] if parents else None


def _services(trace: dict[str, Any]) -> set[str]:
    return {_service(trace, s) for s in trace["spans"]}


def _orphans(trace: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(name, parent id) of each span whose parent is not in the trace."""
    ids = {s["spanID"] for s in trace["spans"]}
    return [
        (s["operationName"], _parent(s))
        for s in trace["spans"]
        if _parent(s) is not None and _parent(s) not in ids
    ]


def _dispatch_traces(jaeger: Jaeger, env: str) -> list[dict[str, Any]]:
    """The traces Jaeger holds whose worker span handled a change.dispatch of environment env."""
    tags = {"rhumbatron.command_type": "change.dispatch", "deployment.environment.name": env}
    return jaeger.traces(service=WORKER, tags=json.dumps(tags), limit="20")


def test_a_change_dispatch_is_one_trace_of_five_services_in_jaeger(
    settings: Settings, tmp_path: Path
) -> None:
    provision_environment(settings)
    with running_jaeger(tmp_path) as jaeger:
        assert SERVICES.isdisjoint(jaeger.services())  # a store of this test's own
        env = traced_env(settings, jaeger.otlp_http)
        run_dispatch(settings, tmp_path / "outbox.sqlite", env)

        # Each process flushed its spans on its way out, and Jaeger stores what it receives after
        # its batch processor's interval: the trace is there once it holds the five services and
        # no span whose parent is missing (a bound on the wait, then the failure says which).
        found: list[dict[str, Any]] = []

        def stored() -> bool:
            found[:] = _dispatch_traces(jaeger, settings.env)
            return any(_services(t) >= SERVICES and not _orphans(t) for t in found)

        wait_until(
            stored,
            STORED_TIMEOUT_S,
            "jaeger holds the change.dispatch trace, connected, with spans of the five services",
            lambda: (
                f"services {jaeger.services()}; traces found:\n"
                + "\n".join(
                    f"{t['traceID']}: {sorted(_services(t))}, orphans {_orphans(t)}" for t in found
                )
            ),
        )
        assert set(jaeger.services()) >= SERVICES

    [trace] = found
    spans = trace["spans"]
    assert {s["traceID"] for s in spans} == {trace["traceID"]}
    by_id = {s["spanID"]: s for s in spans}
    assert len(by_id) == len(spans), "a span id twice in one trace"

    # Connected: one root, the writer's; every other span's parent is in the same trace.
    roots = [s for s in spans if _parent(s) is None]
    assert [_service(trace, r) for r in roots] == [PRODUCER], roots
    assert not _orphans(trace)
    # Jaeger's own reading of the trace: its adjusters warn of a parent they cannot find or a
    # span id seen twice. Its clock-skew warnings are left out: a consumer's span starts after its
    # producer's has ended (the record waits in Kafka), which Jaeger reads as two clocks apart.
    warned = {
        s["operationName"]: [w for w in s["warnings"] if not w.startswith(CLOCK_SKEW)]
        for s in spans
        if s.get("warnings")
    }
    assert not any(warned.values()), warned

    # The worker's handling of the change.dispatch, and its ancestry back to the writer's root:
    # the router's decision, the event's publish, the outbox write.
    queue = queue_name(QUEUE, settings.env)
    [handling] = [
        s
        for s in spans
        if s["operationName"] == f"process {queue}"
        and _tag(s, "rhumbatron.command_type") == "change.dispatch"
    ]
    assert _service(trace, handling) == WORKER
    assert _tag(handling, "span.kind") == "consumer"
    assert _tag(handling, "rhumbatron.outcome") == "ok"
    chain = [handling]
    while (parent := _parent(chain[-1])) is not None:
        chain.append(by_id[parent])
    services = [_service(trace, s) for s in chain]
    assert services[-1] == PRODUCER
    assert services[1] == f"rhumbatron-{ROUTER}"
    assert chain[1]["operationName"] == "apply task.completed"
    publish = next(s for s in chain if _service(trace, s) == PUBLISHER)
    assert _tag(publish, "span.kind") == "producer"
    assert publish["operationName"].startswith("publish ")

    # The projector applied the same event, parented on the same publish.
    [projected] = [
        s
        for s in spans
        if _service(trace, s) == f"rhumbatron-{PROJECTOR}" and _parent(s) == publish["spanID"]
    ]
    assert projected["operationName"] == "apply task.completed"
