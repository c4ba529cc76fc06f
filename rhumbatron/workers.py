"""Running a command worker from your own process, the loop ``rhumbatron worker`` runs."""

from __future__ import annotations

import signal
import threading

from router.settings import Settings
from router.wiring.workers import open_worker, serve_worker
from router.workers.handlers import as_handler
from router.workers.worker import WorkerStats


def run_worker(
    queue: str,
    handler: object,
    *,
    settings: Settings | None = None,
    until_idle_s: float | None = None,
    stop: threading.Event | None = None,
) -> WorkerStats:
    """Serves ``queue`` with ``handler`` (a function ``handler(command, ctx)``, plain or async,
    a :class:`~rhumbatron.Handlers` registry or a :class:`~rhumbatron.QueueHandler`) until
    ``stop`` is set — by SIGTERM or SIGINT when called from the main thread without one — or
    until nothing arrived for ``until_idle_s``. ``settings``: by default read from the
    environment and ``RHUMBATRON_CONFIG`` as every command reads them."""
    settings = settings or Settings()
    command_handler = as_handler(handler, getattr(handler, "__qualname__", repr(handler)))
    if stop is None:
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
    process = open_worker(settings, queue, command_handler)
    return serve_worker(process, until_idle_s=until_idle_s, should_stop=stop.is_set)
