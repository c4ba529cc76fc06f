"""The telemetry of one process: its tracer provider and exporters (OpenTelemetry SDK).

:func:`start` installs the process's ``TracerProvider`` (metrics are router/wiring/probes.py's):

- **resource**: ``service.name`` = ``rhumbatron-<role>``, ``service.version`` (the installed
  package's), ``deployment.environment.name`` (``settings.env``), ``host.name``,
  ``process.pid``; ``OTEL_RESOURCE_ATTRIBUTES`` is merged over them (it cannot rename the
  service: a fleet shares its environment, and each role must keep its own name).
- **sampler**: parent-based, with ``settings.trace_sample_ratio`` of the traces that start here
  (the outbox writer, ``produce``); every later span follows its parent. The standard
  ``OTEL_TRACES_SAMPLER`` (+ ``OTEL_TRACES_SAMPLER_ARG``) wins when set.
- **exporters**, from the standard variables: OTLP over HTTP/protobuf when
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set or
  ``OTEL_TRACES_EXPORTER`` names ``otlp``; the console exporter for
  ``OTEL_TRACES_EXPORTER=console``; nothing for ``none`` or ``OTEL_SDK_DISABLED=true``. None is
  the default, and with no exporter **no provider is installed at all**: the API stays no-op
  and a span costs next to nothing (streams/tracing.py: ``active``).

The trace context travels by the default global propagator (W3C ``traceparent``/``tracestate``
and baggage), or the one ``OTEL_PROPAGATORS`` names.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from router.settings import Settings
from streams.errors import ConfigurationError

log = logging.getLogger("rhumbatron.telemetry")

# How long shutdown waits for the last spans to go out: a process stopping must not hang on a
# collector that is gone (the exporter's own timeout, OTEL_EXPORTER_OTLP_TIMEOUT, is 10 s).
SHUTDOWN_TIMEOUT_S = 5.0
# A consumed batch links every record's producer: up to the batch size, past the SDK's default
# limit of 128 links (OTEL_SPAN_LINK_COUNT_LIMIT, when set, wins).
MAX_LINKS = 10_000

EXPORTERS = ("otlp", "console", "none")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
OTLP_PROTOCOL = "http/protobuf"


@dataclass
class Telemetry:
    """What ``start`` installed; ``shutdown`` flushes and stops it."""

    service: str
    provider: TracerProvider | None = None
    exporters: tuple[str, ...] = ()

    def shutdown(self) -> None:
        """Send what is still queued and stop, within SHUTDOWN_TIMEOUT_S."""
        provider, self.provider = self.provider, None
        if provider is None:
            return
        provider.force_flush(timeout_millis=int(SHUTDOWN_TIMEOUT_S * 1000))
        # The SDK's own shutdown waits up to 30 s per processor: run it aside, bounded.
        stopping = threading.Thread(
            target=provider.shutdown, name="telemetry-shutdown", daemon=True
        )
        stopping.start()
        stopping.join(SHUTDOWN_TIMEOUT_S)
        if stopping.is_alive():
            log.warning(
                "telemetry: spans still unsent after %gs at shutdown; dropped", SHUTDOWN_TIMEOUT_S
            )


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def named_exporters(
    variable: str, kind: str, known: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[str, ...] | None:
    """The exporters a standard ``OTEL_<SIGNAL>_EXPORTER`` variable names (comma-separated, each
    once, in order; ``none`` alone means none: ``()``); None when the variable is unset, so the
    caller's default applies. ``kind`` names the signal in the error (``trace``, ``metric``)."""
    named = (os.environ if environ is None else environ).get(variable, "").strip()
    if not named:
        return None
    chosen = tuple(dict.fromkeys(n.strip().lower() for n in named.split(",") if n.strip()))
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ConfigurationError(
            f"{variable}={named!r}: unknown {kind} exporter "
            f"{', '.join(map(repr, unknown))}; one of {', '.join(known)}"
        )
    if "none" in chosen:
        if len(chosen) > 1:
            raise ConfigurationError(
                f"{variable}={named!r}: 'none' cannot be combined with an exporter"
            )
        return ()
    return chosen


def exporters() -> tuple[str, ...]:
    """The trace exporters the standard variables ask for; () for none."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return ()
    chosen = named_exporters("OTEL_TRACES_EXPORTER", "trace", EXPORTERS)
    if chosen is not None:
        return chosen
    if _env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ("otlp",)
    return ()


def sampler(settings: Settings) -> Sampler:
    """Parent-based ratio from settings, unless OTEL_TRACES_SAMPLER (+ _ARG) says otherwise."""
    name = _env("OTEL_TRACES_SAMPLER").lower()
    if not name:
        return ParentBased(
            TraceIdRatioBased(_ratio(settings.trace_sample_ratio, "trace_sample_ratio"))
        )
    if name not in SAMPLERS:
        raise ConfigurationError(
            f"OTEL_TRACES_SAMPLER={name!r}: unknown sampler; one of {', '.join(SAMPLERS)}"
        )
    if name.endswith("traceidratio"):
        raw = _env("OTEL_TRACES_SAMPLER_ARG")
        ratio = (
            _ratio(raw, "OTEL_TRACES_SAMPLER_ARG")
            if raw
            else _ratio(settings.trace_sample_ratio, "trace_sample_ratio")
        )
        root: Sampler = TraceIdRatioBased(ratio)
    else:
        root = ALWAYS_OFF if name.endswith("always_off") else ALWAYS_ON
    return ParentBased(root) if name.startswith("parentbased_") else root


def _ratio(value: object, name: str) -> float:
    try:
        ratio = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name}={value!r}: not a number; a ratio from 0 to 1") from None
    if not 0.0 <= ratio <= 1.0:
        raise ConfigurationError(f"{name}={value!r}: a ratio from 0 to 1")
    return ratio


def resource(settings: Settings, role: str) -> Resource:
    try:
        release = version("rhumbatron")
    except PackageNotFoundError:
        release = "unknown"
    ours = Resource.create(
        {
            "service.name": f"rhumbatron-{role}",
            "service.namespace": "rhumbatron",
            "service.version": release,
            "deployment.environment.name": settings.env,
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
        }
    )
    # The SDK's own reading of OTEL_RESOURCE_ATTRIBUTES, over ours (but for the service's name).
    given = dict(OTELResourceDetector().detect().attributes)
    given.pop("service.name", None)
    return ours.merge(Resource(given))


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    protocol = (
        _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
    ).lower()
    if protocol and protocol != OTLP_PROTOCOL:
        raise ConfigurationError(
            f"OTLP protocol {protocol!r} (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL): this release "
            f"exports traces over {OTLP_PROTOCOL} only"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: the OTEL_* variables


def build(settings: Settings, role: str) -> Telemetry:
    """The provider :func:`start` would install (None when no exporter is asked for), not yet
    installed."""
    service = f"rhumbatron-{role}"
    chosen = exporters()
    chosen_sampler = sampler(settings)  # a bad value is refused even with no exporter
    if not chosen:
        return Telemetry(service)
    limits = SpanLimits(max_links=None if _env("OTEL_SPAN_LINK_COUNT_LIMIT") else MAX_LINKS)
    provider = TracerProvider(
        sampler=chosen_sampler, resource=resource(settings, role), span_limits=limits
    )
    for name in chosen:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    return Telemetry(service, provider, chosen)


def start(settings: Settings, role: str) -> Telemetry:
    """Install the tracer provider of process role ``role`` (``publisher``, ``producer``, a
    subscription's slug, ``worker-<queue>``, ``dead-letter-consumer``, ``operator``,
    ``analytics-rollup``, ``demo``)."""
    built = build(settings, role)
    if built.provider is None:
        return built
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # One provider per process: a second start (the demo's parts run in one process) uses
        # the one installed first, and leaves its shutdown to whoever installed it.
        built.provider.shutdown()
        return Telemetry(built.service)
    trace.set_tracer_provider(built.provider)
    log.info("telemetry: %s exporting traces to %s", built.service, ", ".join(built.exporters))
    return built
