"""Fail-points: named places where a test can make the process die, to prove that a crash there
loses nothing and doubles nothing.

Armed by the environment variable ``RHUMBATRON_FAILPOINTS`` (comma-separated names, each
optionally ``name@N`` to fire on the N-th hit, default the first, and optionally ``:stop`` or
``:hang``). A hit on an armed point kills the process with SIGKILL: no cleanup, no flush, exactly
like a power cut; with ``:stop`` it SIGSTOPs itself instead (a stall: a long GC pause, a frozen VM)
and goes on where it was when someone sends SIGCONT; with ``:hang`` the thread that hit it never
returns while the process's other threads go on (a loop wedged in a call: what a liveness probe
is for). In-process tests pass their own ``failpoint`` callable to the
runner or the worker instead (e.g. one raising, to simulate the crash of one component while the
test goes on).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

ENV = "RHUMBATRON_FAILPOINTS"

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _kill(name: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _stop(name: str) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _hang(name: str) -> None:
    threading.Event().wait()


MODES: dict[str, Callable[[str], None]] = {"": _kill, "stop": _stop, "hang": _hang}


def _from_env() -> dict[str, tuple[int, Callable[[str], None]]]:
    out: dict[str, tuple[int, Callable[[str], None]]] = {}
    for item in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        spec, _, mode = item.partition(":")
        name, _, nth = spec.partition("@")
        if mode not in MODES:
            raise ValueError(f"{ENV}: {item!r}: the mode after ':' is 'stop' or 'hang'")
        out[name] = (int(nth) if nth else 1, MODES[mode])
    return out


def hit(name: str) -> None:
    """Mark that execution reached ``name``; fire if armed for this hit."""
    with _lock:
        armed = _from_env().get(name)
        if armed is None:
            return
        _hits[name] = _hits.get(name, 0) + 1
        fire = _hits[name] == armed[0]
    if fire:
        armed[1](name)
