"""Every long-running command runs inside ``observed``: its telemetry (traces, metrics) started
for its process role, and its own metrics and health endpoint when one is configured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from router.settings import Settings
from router.wiring import probes, telemetry


@contextmanager
def observed(settings: Settings, role: str) -> Iterator[probes.Health]:
    installed = telemetry.start(settings, role)
    health = probes.Health()
    endpoint = probes.serve(settings, health, role)
    try:
        yield health
    finally:
        if endpoint is not None:
            endpoint.close()
        installed.shutdown()
