"""The small HTTP endpoint of one long-running process: ``/metrics``, ``/healthz``, ``/readyz``.

A placeholder until the metrics work lands: ``serve`` starts nothing yet.
"""

from __future__ import annotations

from router.settings import Settings


class Health:
    """What the process says of itself: ``beat()`` from its main loop (live), ``ready`` once it
    does its work (subscribed, connected)."""

    def __init__(self) -> None:
        self.ready = False

    def beat(self) -> None:
        pass


class Endpoint:
    def close(self) -> None:
        pass


def serve(settings: Settings, health: Health, role: str) -> Endpoint | None:
    """Start the endpoint when ``settings.metrics_port`` is set; None when it is not."""
    return None
