"""An SDK tracer provider with an in-memory exporter, installed for one test and removed after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.tracing import installed_provider


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with installed_provider() as exporter:
        yield exporter
