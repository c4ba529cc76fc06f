"""Tracing in tests: an SDK provider installed as the global one for a while, then removed.

The API lets a process set its global tracer provider once; a test needs its own and needs none
after it (the tracing-off tests), so :func:`installed_provider` resets the API's globals around
it. Rhumbatron's modules ask for their tracer at use (streams.tracing.tracer), so they follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.util._once import Once


def _reset(provider: trace.TracerProvider | None) -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@contextmanager
def installed_provider(sampler: Sampler | None = None) -> Iterator[InMemorySpanExporter]:
    before = trace._TRACER_PROVIDER
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset(before)


@contextmanager
def no_provider() -> Iterator[None]:
    before = trace._TRACER_PROVIDER
    _reset(None)
    try:
        yield
    finally:
        _reset(before)


def hex_id(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]
