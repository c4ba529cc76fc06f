"""``rhumbatron serve [--port N] [--allow-remote] [--tls-cert PEM --tls-key PEM] [--pid-file
PATH]``: the operator HTTP API and web page in one process, bound to ``operator_host``
(127.0.0.1 by default) and ``operator_port`` (or ``--port``).

An ``operator_host`` other machines can reach is refused unless ``--allow-remote``; allowed
without ``--tls-cert/--tls-key``, a warning says to put TLS in front. The server code is in
router/operator/server.py, the pid file in router/operator/pid_file.py."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING

from router.cli.common import non_negative_int
from router.cli.observed import observed
from router.operator.metrics import FleetCollector
from router.operator.pid_file import PidFile
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.probes import ProcessHealth
from streams.errors import ConfigurationError

if TYPE_CHECKING:  # the web stack is imported by `serve` alone, not by every command
    import uvicorn

    from router.operator.server import Tls


def serve(settings: Settings, args: argparse.Namespace) -> int:
    port = settings.operator_port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"port {port} is out of range 0..65535 (0: any free port)")
    from router.operator.server import bind, tls_files

    tls = tls_files(args.tls_cert, args.tls_key)
    stop = _Stop()
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        pid_file = None if args.pid_file is None else PidFile.acquire(args.pid_file)
        try:
            sock = bind(settings.operator_host, port, allow_remote=args.allow_remote)
            try:
                service = OperatorService(settings)
                try:
                    # The fleet-wide gauges on the process's /metrics too: where a cluster's
                    # Prometheus scrapes every pod (the operator port's /metrics checks Host).
                    fleet = FleetCollector(service)
                    with observed(settings, "operator", collectors=[fleet]) as health:
                        return _serve_on(settings, service, sock, tls, stop, health)
                finally:
                    service.close()
            finally:
                sock.close()
        finally:
            if pid_file is not None:
                pid_file.release()
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Stop:
    """The SIGTERM handler until uvicorn takes the signal over, and again once it hands it back
    (it shuts down gracefully, then raises the signal again for the handler it found): a stop
    asked for before the server runs stops it as soon as it starts (a clean exit, 0, as
    `consume` does), instead of being lost."""

    def __init__(self) -> None:
        self.requested = False
        self.server: uvicorn.Server | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True


def _serve_on(
    settings: Settings,
    service: OperatorService,
    sock: socket.socket,
    tls: Tls | None,
    stop: _Stop,
    health: ProcessHealth,
) -> int:
    from router.operator.server import address_of, listens_remotely, server

    print(
        f"operator page at {address_of(sock, tls)} (API under /api, OpenAPI at "
        f"/openapi.json); environment {settings.env!r}" + _access_note(settings),
        flush=True,
    )
    if tls is None and listens_remotely(sock):
        print(
            f"rhumbatron: warning: the operator API listens on {settings.operator_host} "
            "without TLS, so its tokens and dead letters cross the network in clear: put a "
            "TLS-terminating proxy in front, or pass --tls-cert and --tls-key",
            file=sys.stderr,
            flush=True,
        )
    stop.server = server(service, tls)
    stop.server.should_exit = stop.requested
    _beat_on_ticks(stop.server, health)
    stop.server.run(sockets=[sock])
    return 0


def _beat_on_ticks(running: uvicorn.Server, health: ProcessHealth) -> None:
    """The health beat from the server's own loop: uvicorn calls ``on_tick`` every tenth of a
    second from its event loop, so a loop that hangs stops the beats; ready once it listens."""
    ticked = running.on_tick

    async def on_tick(counter: int) -> bool:
        health.beat()
        health.ready = running.started
        return await ticked(counter)

    running.on_tick = on_tick  # type: ignore[method-assign]


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
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow an operator_host other machines can reach (not 127.0.0.0/8 or ::1); put "
        "TLS in front of it, or give --tls-cert/--tls-key",
    )
    p.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain) file; needs --tls-key",
    )
    p.add_argument(
        "--tls-key",
        metavar="PEM",
        help="the private key (unencrypted PEM) of --tls-cert",
    )
    p.add_argument(
        "--pid-file",
        metavar="PATH",
        help="write this server's pid there (0600) while it runs, removed at a clean exit; "
        "refused while a running server holds the file, a stale one is replaced",
    )
    p.set_defaults(handler=serve)
