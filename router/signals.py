"""Graceful stop for long-running commands."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT. Install it before any slow start-up (connecting,
    provisioning, joining the group), so a stop that arrives early still ends the process
    cleanly instead of killing it mid-way."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
