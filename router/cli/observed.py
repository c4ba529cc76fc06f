"""Every long-running command runs inside ``observed``: its cycle collector tuned
(router/wiring/collector.py), its telemetry (traces, metrics) started for its process role, and
its own metrics and health endpoint when one is configured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from router.settings import Settings
from router.wiring import collector, metrics, probes, telemetry


@contextmanager
def observed(settings: Settings, role: str) -> Iterator[probes.ProcessHealth]:
    collector.tune(settings)
    with ExitStack() as stack:
        installed = telemetry.start(settings, role)
        stack.callback(installed.shutdown)
        measured = metrics.start(settings, role)
        stack.callback(measured.close)
        health = probes.ProcessHealth(settings.health_stale_s)
        endpoint = probes.serve(settings, health, role, measured.registry)
        if endpoint is not None:
            stack.callback(endpoint.close)
        yield health
