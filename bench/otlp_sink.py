"""An OTLP/HTTP sink for the tracing cases, run as a process of its own
(``python -m bench.otlp_sink``): it takes ``POST /v1/traces`` (and ``/v1/metrics``, ``/v1/logs``)
as the OTLP exporters send them, decodes each trace request with ``opentelemetry-proto`` and counts
its spans; ``GET /count`` answers ``{"spans": n, "requests": n}``. It prints its port on its first
line and serves until terminated.

Why not the tests' receiver (tests/support/otlp.py): the bench measures the instrumented process
alone, so the receiving end runs apart, as a collector would, and what the bench runs must not
depend on the test tree. The two share the wire format only; this one keeps counts, not spans.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_EMPTY = ExportTraceServiceResponse().SerializeToString()
_lock = threading.Lock()
_counts = {"spans": 0, "requests": 0}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/traces":
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with _lock:
                _counts["spans"] += spans
                _counts["requests"] += 1
        self._answer(_EMPTY, "application/x-protobuf")

    def do_GET(self) -> None:
        with _lock:
            body = json.dumps(_counts).encode()
        self._answer(body, "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
