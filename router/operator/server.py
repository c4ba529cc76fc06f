"""The operator server: the HTTP API and page (router.operator.api) served by uvicorn on a socket
bound before it starts, so a taken port is one clear error."""

from __future__ import annotations

import socket

import uvicorn

from router.operator.api import create_app
from router.operator.service import OperatorService
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
