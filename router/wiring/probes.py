"""The small HTTP endpoint of one long-running process: ``/metrics``, ``/healthz``, ``/readyz``.

- ``/metrics``: the process's own metrics in the Prometheus text format (the registry its
  Prometheus reader collects into, router/wiring/metrics.py);
- ``/healthz`` (liveness): 200 while the process's main loop has come round
  (``ProcessHealth.beat``) within ``health_stale_s``; 503 with a JSON reason once it has not (a
  loop stuck in a call that never returns);
- ``/readyz`` (readiness): 200 once the command says it does its work
  (``ProcessHealth.ready``: subscribed, connected) and, at the time of asking, what it depends
  on answers (``dependency_checks``: a broker gives the cluster's metadata, Redis answers a
  PING, each bounded by ``probe_timeout_s``); 503 naming what failed otherwise.

It listens on ``metrics_host:metrics_port`` (0: any free port; the bound address is printed at
start) in a daemon thread of its own, the standard library's HTTP server: three paths need no
framework, and the OTel exporter's own ``start_http_server`` serves metrics alone. Unset
``metrics_port``: no endpoint.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from router.settings import Settings
from router.wiring.subscription import redis_client
from streams.admin import admin_client
from streams.errors import ConfigurationError

log = logging.getLogger("rhumbatron.probes")

PATHS = ("/metrics", "/healthz", "/readyz")


Check = Callable[[], None]  # returns when its dependency answers, raises when it does not


class ProcessHealth:
    """What the process says of itself: ``beat()`` from its main loop (live), ``ready`` once it
    does its work (subscribed, connected), and ``checks`` of what it depends on, run on each
    readiness question. A process counts as live from its start until ``stale_after_s`` passes
    without a beat."""

    def __init__(
        self,
        stale_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        checks: Mapping[str, Check] | None = None,
    ) -> None:
        self.ready = False
        self.stale_after_s = stale_after_s
        self.checks = dict(checks or {})
        self._clock = clock
        self._beat = clock()

    def beat(self) -> None:
        self._beat = self._clock()

    def liveness(self) -> tuple[bool, dict[str, object]]:
        """(live, what /healthz says)."""
        since = self._clock() - self._beat
        if since <= self.stale_after_s:
            return True, {"status": "ok", "last_beat_s": round(since, 3)}
        return False, {
            "status": "stale",
            "last_beat_s": round(since, 3),
            "reason": f"the main loop has not come round for {since:.1f}s "
            f"(health_stale_s {self.stale_after_s:g})",
        }

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """(ready, what /readyz says)."""
        if not self.ready:
            return False, {"status": "starting", "reason": "not yet subscribed or connected"}
        failed = {}
        for name, check in self.checks.items():
            try:
                check()
            except Exception as exc:  # whatever the client raises: the dependency is not there
                failed[name] = f"{type(exc).__name__}: {exc}"
        if failed:
            return False, {
                "status": "unreachable",
                "reason": "; ".join(f"{name}: {said}" for name, said in failed.items()),
                "failed": sorted(failed),
            }
        return True, {"status": "ready", "checked": sorted(self.checks)}


def dependency_checks(settings: Settings, needs: Sequence[str]) -> dict[str, Check]:
    """The readiness checks of ``needs`` (``kafka``, ``redis``), each with a client of its own
    made at its first use and bounded by ``probe_timeout_s``."""
    timeout = settings.probe_timeout_s
    clients: dict[str, Any] = {}

    def kafka() -> None:
        if "kafka" not in clients:
            clients["kafka"] = admin_client(settings.kafka_config())
        try:
            metadata = clients["kafka"].list_topics(timeout=timeout)
        except KafkaException as exc:
            raise ConnectionError(f"{settings.kafka_bootstrap}: {exc.args[0].str()}") from exc
        if not metadata.brokers:
            raise ConnectionError(f"{settings.kafka_bootstrap}: no broker answered")

    def redis() -> None:
        if "redis" not in clients:
            clients["redis"] = redis_client(settings, timeout=timeout)
        clients["redis"].ping()

    known = {"kafka": kafka, "redis": redis}
    return {name: known[name] for name in needs}


class Endpoint:
    """The running endpoint; :meth:`close` stops it."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.host = str(host)
        self.port = int(port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(
    health: ProcessHealth, registry: CollectorRegistry | None
) -> type[BaseHTTPRequestHandler]:
    # One scrape at a time: collecting runs every observable callback and empties the exporter's
    # queue of collected data; two at once would split it between them.
    scraping = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                with scraping:
                    body = generate_latest(registry) if registry is not None else b""
                self._send(200, CONTENT_TYPE_LATEST, body)
            elif path in ("/healthz", "/readyz"):
                ok, said = health.liveness() if path == "/healthz" else health.readiness()
                self._send(200 if ok else 503, "application/json", json.dumps(said).encode())
            else:
                said = {"status": "not found", "paths": list(PATHS)}
                self._send(404, "application/json", json.dumps(said).encode())

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not worth a log line

    return Handler


def serve(
    settings: Settings, health: ProcessHealth, role: str, registry: CollectorRegistry | None = None
) -> Endpoint | None:
    """Start the endpoint when ``settings.metrics_port`` is set; None when it is not. A port
    that cannot be listened on is refused naming the setting."""
    port = settings.metrics_port
    if port is None:
        return None
    host = settings.metrics_host
    handler = _handler(health, registry)
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except socket.gaierror as exc:
        raise ConfigurationError(
            f"metrics_host={host!r}: not an address to listen on ({exc.strerror}); "
            "set RHUMBATRON_METRICS_HOST to a host name or IP address of this machine"
        ) from exc
    except OSError as exc:
        raise ConfigurationError(
            f"metrics_port={port} on metrics_host={host!r}: cannot listen ({exc.strerror}); "
            "set RHUMBATRON_METRICS_PORT to a free port, or 0 for any"
        ) from exc
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, name=f"probes-{role}", kwargs={"poll_interval": 0.2}
    )
    thread.daemon = True
    thread.start()
    endpoint = Endpoint(server, thread)
    # Printed as well as logged: with port 0 it is how a scraper (or a test) learns the port.
    print(f"rhumbatron-{role}: metrics endpoint {endpoint.url}/metrics", file=sys.stderr)
    log.info("metrics endpoint %s (/metrics, /healthz, /readyz)", endpoint.url)
    return endpoint
