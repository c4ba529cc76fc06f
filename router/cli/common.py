"""What every command module shares: JSON output, durations, counts, queues and feed URLs given
on the command line, the operator's name for audit logs, and a graceful stop on SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import getpass
import os
import re
import signal
import sys
import threading
from urllib.parse import urlsplit

import orjson

from streams.errors import ConfigurationError, TopologyError
from streams.topology import QUEUE_PURPOSES, Topology

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def print_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def parse_duration(text: str, *, option: str) -> int:
    """``90s``, ``30m``, ``2h``, ``7d`` → seconds: a positive whole number and one unit."""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) == 0:
        raise ConfigurationError(
            f"{option} must be a positive duration: a whole number and one unit, s (seconds), "
            f"m (minutes), h (hours) or d (days), e.g. 90s, 30m, 12h, 7d; got {text!r}"
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def non_negative_int(text: str) -> int:
    """An ``argparse`` ``type=``: a whole number, 0 or more. argparse turns the refusal into a
    usage error (exit 2) naming the option."""
    return int(_at_least(text, 0, whole=True))


def positive_int(text: str) -> int:
    """An ``argparse`` ``type=``: a whole number, 1 or more."""
    return int(_at_least(text, 1, whole=True))


def non_negative_float(text: str) -> float:
    """An ``argparse`` ``type=``: a number of seconds (fractions allowed), 0 or more."""
    return _at_least(text, 0, whole=False)


def _at_least(text: str, least: int, *, whole: bool) -> float:
    what = "a whole number" if whole else "a number"
    try:
        value: float = int(text) if whole else float(text)
    except ValueError:
        value = float("nan")
    if not value >= least:  # NaN (not a number, or given as "nan") is refused too
        raise argparse.ArgumentTypeError(f"must be {what} >= {least}, got {text!r}")
    return value


# What --queue says in --help: the queues are the settings', so argparse cannot list them.
QUEUE_HELP = (
    ", ".join(QUEUE_PURPOSES) + " or a queue of the settings' own ([queues.<name>], docs/queues.md)"
)


def known_queue(topology: Topology, name: str | None) -> str | None:
    """``--queue``'s value, if one of the settings' queues; else a ConfigurationError naming
    them (exit 2, as argparse's own refusals)."""
    if name is None:
        return None
    try:
        return topology.known_queue(name)
    except TopologyError as exc:
        raise ConfigurationError(f"--queue: {exc}") from None


def feed_url(text: str) -> str:
    """An ``argparse`` ``type=``: a feed's URL, absolute http or https with a host, nothing in it
    that is blank or a control character (the feed is named by it in the checkpoint topic, the
    audit log and every message about it)."""
    parts = urlsplit(text)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or any(c.isspace() or not c.isprintable() for c in text)
    ):
        raise argparse.ArgumentTypeError(
            f"must be the feed's URL, http:// or https:// with a host, got {text!r}"
        )
    return text


def operator_name(given: str | None) -> str:
    """Who an operator action is recorded as: ``--who``, else the login name."""
    if given:
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT. Install it before any slow start-up (connecting,
    provisioning, joining the group), so a stop that arrives early still ends the process
    cleanly instead of killing it mid-way."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
