"""What a long-running command says while it runs: one start line (what it works on: the
environment, the group, the topics, the state directory) and a progress line every few seconds,
on stderr so stdout stays the command's result.

On a terminal the progress is one live line (``rich``) rewritten in place; anywhere else (a pipe,
a log file, a test) each is a plain line of its own, and only when it says something new, so an
idle process does not fill a log."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from consumers.lag import group_lag
from router.settings import Settings
from router.wiring.provisioning import topics_phrase
from streams.admin import admin_client
from streams.topology import GroupReads

Sample = Callable[[], str]


def state_dir(settings: Settings) -> Path:
    """Where this environment keeps its local state (outboxes, archive, rollup data)."""
    return settings.state_dir


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_line(
    command: str, settings: Settings, *, group: str | None = None, topics: Sequence[str] = ()
) -> str:
    """``consume ledger: env dev, group rhumbatron-ledger-dev, topics …_00-07_dev, … (9), state
    dir /…``, printed on stderr; returns it."""
    parts = [f"env {settings.env}"]
    if group is not None:
        parts.append(f"group {group}")
    if topics:
        parts.append(f"topics {topics_phrase(list(topics))}")
    parts.append(f"state dir {state_dir(settings)}")
    line = f"{command}: {', '.join(parts)}"
    say(line)
    return line


def group_topics(reads: GroupReads) -> list[str]:
    return [*reads.subscribed, *reads.assigned]


class LagProbe:
    """The group's lag summed over the topics it reads (consumers.lag, the one place lag is
    computed). Each call is a few broker requests, so the reporter asks once a line."""

    def __init__(self, settings: Settings, reads: GroupReads) -> None:
        self._base = settings.kafka_config()
        self._admin: Any = None
        self._reads = reads
        self._timeout = settings.connect_timeout_s

    def __call__(self) -> str:
        try:
            if self._admin is None:
                self._admin = admin_client(self._base)
            return str(
                sum(p.lag for p in group_lag(self._admin, self._base, self._reads, self._timeout))
            )
        except Exception:  # a broker hiccup: a progress line never ends the command
            return "?"


class ProgressReporter:
    """Every ``interval_s``, the line ``sample()`` gives (asked in this reporter's own thread, so
    a slow lag request never holds the loop); or push a line with :meth:`show`. A context
    manager: the thread starts on enter and stops on exit."""

    def __init__(
        self,
        sample: Sample | None,
        interval_s: float,
        *,
        stream: IO[str] | None = None,
        live: bool | None = None,
    ) -> None:
        self._sample = sample
        self._interval_s = interval_s
        self._stream = stream if stream is not None else sys.stderr
        self._live = self._stream.isatty() if live is None else live
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: str | None = None
        self._lock = threading.Lock()
        self._status: Any = None

    def __enter__(self) -> ProgressReporter:
        if self._live:
            from rich.console import Console

            self._status = Console(file=self._stream).status("starting")
            self._status.start()
        if self._sample is not None:
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._interval_s + 1)
        if self._status is not None:
            self._status.stop()
            if self._last is not None:
                print(self._last, file=self._stream, flush=True)  # the last figures stay shown

    def show(self, line: str) -> None:
        with self._lock:
            if line == self._last:
                return
            self._last = line
            if self._status is not None:
                self._status.update(line)
            else:
                print(line, file=self._stream, flush=True)

    def _run(self) -> None:
        assert self._sample is not None
        started = time.monotonic()
        shown: str | None = None
        while not self._stop.wait(self._interval_s):
            try:
                figures = self._sample()
            except Exception as exc:  # a progress line never ends the command
                figures = f"progress unavailable: {exc}"
            if figures != shown:  # said only when something moved
                shown = figures
                self.show(f"{figures} [{time.monotonic() - started:.0f}s]")
