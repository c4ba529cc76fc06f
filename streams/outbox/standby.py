"""Active and standby publishers: one publisher per outbox publishes, any other started on it
stands by, ready, and takes over once the holder goes.

A publisher that finds the outbox's publisher lease held (PublisherLocked: a SQLite outbox's
kernel lock, a PostgreSQL outbox's advisory lock) does not give up: :func:`take_over` says who
holds the lease (once per holder), then tries it again every ``poll_s``. The kernel or the server
frees the lease however its holder ends (a clean stop, a crash, a SIGKILL, a dropped connection),
so a standby takes over within about ``poll_s`` of the holder going. Nothing is sent without the
lease: two publishers never publish the same outbox at once.

``rhumbatron_publisher_active{outbox}`` shows the role: 1 while this process holds the outbox's
lease and publishes, 0 while it stands by.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from streams.errors import PublisherLocked
from streams.outbox.publisher import Publisher

# This process's role per outbox location (1 active, 0 standby), as the gauge reads it.
_roles: dict[str, int] = {}
_roles_lock = threading.Lock()


def _observe_roles(_: CallbackOptions) -> Iterator[Observation]:
    with _roles_lock:
        roles = sorted(_roles.items())
    for outbox, active in roles:
        yield Observation(active, {"outbox": outbox})


metrics.get_meter("rhumbatron.outbox").create_observable_gauge(
    "rhumbatron_publisher_active",
    callbacks=[_observe_roles],
    unit="",
    description="1 while this process holds the outbox's publisher lease and publishes, "
    "0 while it stands by",
)


class PublisherRole:
    """This process's role on one outbox (``location``: the store's, which names no password),
    as ``rhumbatron_publisher_active`` shows it. Closed, the outbox's series goes."""

    def __init__(self, location: str) -> None:
        self.location = location

    def __enter__(self) -> PublisherRole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def active(self) -> None:
        self._set(1)

    def standby(self) -> None:
        self._set(0)

    def close(self) -> None:
        with _roles_lock:
            _roles.pop(self.location, None)

    def _set(self, value: int) -> None:
        with _roles_lock:
            _roles[self.location] = value


# Callback aliases: what take_over reports, and what it calls while it waits.
HolderSeen = Callable[[PublisherLocked], None]  # the lease is held: by whom, in the error's words
Tick = Callable[[], None]  # a health beat


def take_over(
    build: Callable[[], Publisher],
    *,
    poll_s: float,
    stop: threading.Event,
    beat_s: float,
    tick: Tick = lambda: None,
    held: HolderSeen = lambda _: None,
) -> Publisher | None:
    """The publisher ``build`` makes (it takes the lease), as soon as the lease is free: tried at
    once, then every ``poll_s`` while another holds it. ``held`` is told who holds it, once per
    holder (their words change only when the holder does); ``tick`` is called at least every
    ``beat_s`` while waiting, so a standby stays live. None once ``stop`` is set."""
    if beat_s <= 0:
        raise ValueError(f"beat_s ({beat_s}) must be more than 0")
    said: str | None = None
    while not stop.is_set():
        tick()
        try:
            return build()
        except PublisherLocked as exc:
            if str(exc) != said:
                said = str(exc)
                held(exc)
        if _wait(stop, poll_s, beat_s, tick):
            break
    return None


def _wait(stop: threading.Event, seconds: float, beat_s: float, tick: Tick) -> bool:
    """Wait ``seconds`` (real time), beating at least every ``beat_s``; True once stopped."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if stop.wait(min(left, beat_s)):
            return True
        tick()
