"""The telemetry of one process: its tracer provider and exporters (OpenTelemetry SDK).

A placeholder until the tracing work lands: ``start`` installs nothing yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.settings import Settings


@dataclass
class Telemetry:
    """What ``start`` installed; ``shutdown`` flushes and stops it."""

    service: str

    def shutdown(self) -> None:
        pass


def start(settings: Settings, role: str) -> Telemetry:
    """Install the tracer provider of process role ``role`` (``publisher``, a subscription's slug,
    ``worker-<queue>`` …)."""
    return Telemetry(service=f"rhumbatron-{role}")
