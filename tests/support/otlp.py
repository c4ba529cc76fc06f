"""A small OTLP/HTTP receiver for tests: what real processes export when
``OTEL_EXPORTER_OTLP_ENDPOINT`` names it.

A threading ``http.server`` on 127.0.0.1 (a free port) takes ``POST /v1/traces``, ``/v1/metrics``
and ``/v1/logs`` as the OTLP exporters send them (protobuf, gzip or not), decodes them with
``opentelemetry-proto`` and keeps each span flat — its resource's ``service.name``, ids, parent,
links, kind, name, attributes, status — and the metric and log requests as they came.
A body that does not decode is answered 400 with the reason, an unknown path 404.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.trace import SpanKind


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str | None
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each link
    kind: SpanKind
    name: str
    attributes: dict[str, Any]
    status_code: int  # OTLP's: 0 unset, 1 ok, 2 error
    status_message: str


def value_of(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, which)


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs}


def _hex(raw: bytes) -> str:
    return raw.hex()


def spans_of(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    found: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(attributes_of(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        service=service,
                        trace_id=_hex(span.trace_id),
                        span_id=_hex(span.span_id),
                        parent_id=_hex(span.parent_span_id) if span.parent_span_id else None,
                        links=tuple((_hex(lk.trace_id), _hex(lk.span_id)) for lk in span.links),
                        # OTLP counts from SPAN_KIND_UNSPECIFIED = 0; the API from INTERNAL = 0.
                        kind=SpanKind(max(span.kind - 1, 0)),
                        name=span.name,
                        attributes=attributes_of(span.attributes),
                        status_code=span.status.code,
                        status_message=span.status.message,
                    )
                )
    return found


@dataclass
class Received:
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    logs: list[ExportLogsServiceRequest] = field(default_factory=list)
    requests: int = 0


Request = ExportTraceServiceRequest | ExportMetricsServiceRequest | ExportLogsServiceRequest

# path -> the request's message class, the (empty) success response's bytes
_ROUTES: dict[str, tuple[type[Request], bytes]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse().SerializeToString()),
    "/v1/metrics": (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse().SerializeToString(),
    ),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse().SerializeToString()),
}


class OtlpReceiver:
    """Start with ``with OtlpReceiver() as receiver:``; point exporters at ``endpoint``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received = Received()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                route = _ROUTES.get(self.path)
                if route is None:
                    self._answer(HTTPStatus.NOT_FOUND, f"no OTLP route {self.path}".encode())
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    request = route[0].FromString(body)
                # protobuf's DecodeError, or gzip's; google.protobuf ships no type stubs to
                # name the first by.
                except Exception as exc:
                    self._answer(HTTPStatus.BAD_REQUEST, f"not OTLP protobuf: {exc}".encode())
                    return
                receiver._keep(request)
                self._answer(HTTPStatus.OK, route[1])

            def _answer(self, status: HTTPStatus, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # exporters post every few hundred milliseconds; no line per request

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporters add ``/v1/...``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _keep(self, request: Request) -> None:
        with self._lock:
            self._received.requests += 1
            if isinstance(request, ExportTraceServiceRequest):
                self._received.spans.extend(spans_of(request))
            elif isinstance(request, ExportMetricsServiceRequest):
                self._received.metrics.append(request)
            elif isinstance(request, ExportLogsServiceRequest):
                self._received.logs.append(request)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._received.spans)

    def metrics(self) -> list[ExportMetricsServiceRequest]:
        with self._lock:
            return list(self._received.metrics)

    def logs(self) -> list[ExportLogsServiceRequest]:
        with self._lock:
            return list(self._received.logs)

    def wait_for_spans(
        self, found: Callable[[list[ReceivedSpan]], bool], *, timeout_s: float
    ) -> list[ReceivedSpan]:
        """The spans received once ``found`` holds of them; AssertionError after ``timeout_s``
        (a bound against a hang, naming what did arrive)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(
                    f"{len(spans)} span(s) received, not what was awaited: {names}"
                )
            time.sleep(0.05)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver
