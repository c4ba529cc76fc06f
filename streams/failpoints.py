"""Fail-points: named places where a test can make the process die on purpose.

A crash test arms a point through the environment of the process it starts::

    RHUMBATRON_FAILPOINTS=publisher.after_ack          # die the first time the point is hit
    RHUMBATRON_FAILPOINTS=publisher.after_ack@3,x.y    # die on the third hit; several points

:func:`hit` kills the process with SIGKILL, the same as ``kill -9`` or the OOM killer: no
``finally`` blocks, no atexit handlers, no flushing — exactly the crash the code must survive.
Unarmed points cost one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

ENV_VAR = "RHUMBATRON_FAILPOINTS"

_hits: dict[str, int] = {}
_lock = threading.Lock()


def armed() -> dict[str, int]:
    """The armed points and the hit on which each fires (1 = the first)."""
    spec = os.environ.get(ENV_VAR, "")
    points: dict[str, int] = {}
    for item in spec.split(","):
        name, _, nth = item.strip().partition("@")
        if not name:
            continue
        if nth and not nth.isdigit():
            raise ValueError(
                f"{ENV_VAR} entry {item.strip()!r} is malformed: use NAME or NAME@N (N >= 1)"
            )
        points[name] = max(int(nth or 1), 1)
    return points


def hit(name: str) -> None:
    """Pass the point called ``name``; if it is armed for this hit, die at once (SIGKILL)."""
    if ENV_VAR not in os.environ:
        return
    fire_at = armed().get(name)
    if fire_at is None:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        count = _hits[name]
    if count >= fire_at:
        os.kill(os.getpid(), signal.SIGKILL)
