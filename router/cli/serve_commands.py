"""``rhumbatron serve [--port N]``: the operator HTTP API and web page in one process, bound to
``operator_host`` (127.0.0.1 by default) and ``operator_port`` (or ``--port``)."""

from __future__ import annotations

import argparse
import signal

from router.cli.common import non_negative_int
from router.operator.server import address_of, bind, server
from router.operator.service import OperatorService
from router.settings import Settings
from streams.errors import ConfigurationError


def serve(settings: Settings, args: argparse.Namespace) -> int:
    port = settings.operator_port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"port {port} is out of range 0..65535 (0: any free port)")
    sock = bind(settings.operator_host, port)
    service = OperatorService(settings)
    print(
        f"operator page at {address_of(sock)} (API under /api, OpenAPI at /openapi.json); "
        f"environment {settings.env!r}" + _access_note(settings),
        flush=True,
    )
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler it
    # found: ours makes that a clean exit (0), as `consume` does.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server(service).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        service.close()
        sock.close()
    return 0


def _access_note(settings: Settings) -> str:
    if settings.operator_token:
        return ""
    if settings.operator_read_token:
        return "; read-only: no operator token set"
    return (
        "; no operator or read token set: every read of dead letters, failures, outboxes, lag "
        "and views, and every change, is refused (set RHUMBATRON_OPERATOR_READ_TOKEN or "
        "RHUMBATRON_OPERATOR_TOKEN)"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="the operator HTTP API and web page (dead letters, outboxes, lag, views)"
    )
    p.add_argument(
        "--port",
        type=non_negative_int,
        metavar="N",
        help="listen on this port (default: operator_port; 0 picks a free one)",
    )
    p.set_defaults(handler=serve)
