"""Every long-running command runs inside ``observed``: its cycle collector tuned
(router/wiring/collector.py), its telemetry (traces, metrics) started for its process role, and
its own metrics and health endpoint when one is configured."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from prometheus_client.registry import Collector

from router.settings import Settings
from router.wiring import collector, metrics, probes, telemetry


@contextmanager
def observed(
    settings: Settings,
    role: str,
    needs: Sequence[str] = ("kafka", "redis"),
    collectors: Sequence[Collector] = (),
) -> Iterator[probes.ProcessHealth]:
    """``needs``: what the command depends on, which its readiness checks reach;
    ``collectors``: what its ``/metrics`` serves besides its own counters (the operator server's
    fleet-wide gauges)."""
    collector.tune(settings)
    with ExitStack() as stack:
        installed = telemetry.start(settings, role)
        stack.callback(installed.shutdown)
        measured = metrics.start(settings, role)
        stack.callback(measured.close)
        if measured.registry is not None:
            for extra in collectors:
                measured.registry.register(extra)
        checks = (
            probes.dependency_checks(settings, needs) if settings.metrics_port is not None else {}
        )
        health = probes.ProcessHealth(settings.health_stale_s, checks=checks)
        endpoint = probes.serve(settings, health, role, measured.registry)
        if endpoint is not None:
            stack.callback(endpoint.close)
        yield health
