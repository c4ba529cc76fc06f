"""``rhumbatron serve [--port N]``: the operator HTTP API and web page in one process, bound to
``operator_host`` (127.0.0.1 by default) and ``operator_port`` (or ``--port``)."""

from __future__ import annotations

import argparse
import signal
import socket

import uvicorn

from router.operator.api import create_app
from router.operator.service import OperatorService
from router.settings import Settings
from streams.errors import ConfigurationError


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts so a taken port is one clear error
    (port 0: any free port; read it back with ``getsockname``)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(f"operator_host {host!r} does not resolve: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another port with --port "
            "or RHUMBATRON_OPERATOR_PORT"
        ) from exc
    sock.listen(128)
    return sock


def server(service: OperatorService) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(service), log_level="warning", access_log=False, lifespan="off"
    )
    return uvicorn.Server(config)


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(settings: Settings, args: argparse.Namespace) -> int:
    port = settings.operator_port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"port {port} is out of range 0..65535 (0: any free port)")
    sock = bind(settings.operator_host, port)
    service = OperatorService(settings)
    print(
        f"operator page at {address_of(sock)} (API under /api, OpenAPI at /openapi.json); "
        f"environment {settings.env!r}"
        + ("" if service.info().mutations_enabled else "; read-only: no operator token set"),
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="the operator HTTP API and web page (dead letters, outboxes, lag, views)"
    )
    p.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="listen on this port (default: operator_port; 0 picks a free one)",
    )
    p.set_defaults(handler=serve)
