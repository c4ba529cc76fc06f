"""The operator server: the HTTP API and page (router.operator.api) served by uvicorn on a socket
bound before it starts, so a taken port is one clear error.

Safe by default: the socket is refused on an address other machines can reach (anything but
127.0.0.0/8 and ::1) unless the caller allows it, and HTTPS is served when a certificate and key
are given (otherwise the tokens travel in clear, which is only fine on loopback or behind a
TLS-terminating proxy).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from router.operator.api import create_app
from router.operator.service import OperatorService
from streams.errors import ConfigurationError

LISTEN_BACKLOG = 128  # connections the kernel queues before uvicorn accepts them


@dataclass(frozen=True, slots=True)
class Tls:
    """The PEM files uvicorn serves HTTPS with."""

    cert: Path
    key: Path


def is_loopback(address: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, ::ffff:127.x.y.z)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) aside
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def bind(host: str, port: int, *, allow_remote: bool = False) -> socket.socket:
    """The listening socket, bound before the server starts so a taken port is one clear error
    (port 0: any free port; read it back with ``getsockname``). ``host`` is resolved first: an
    address that is not loopback is refused unless ``allow_remote``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(f"operator_host {host!r} does not resolve: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    if not allow_remote and not is_loopback(str(address[0])):
        shown = host if host == address[0] else f"{host} ({address[0]})"
        raise ConfigurationError(
            f"operator_host {shown} is not a loopback address, so other machines could reach the "
            "operator API: serve on 127.0.0.1 (the default), or pass --allow-remote and put TLS "
            "in front (a TLS-terminating proxy, or --tls-cert/--tls-key)"
        )
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
    sock.listen(LISTEN_BACKLOG)
    return sock


def tls_files(cert: str | None, key: str | None) -> Tls | None:
    """The certificate and key to serve HTTPS with (both or neither), checked now so a missing,
    unreadable or mismatched file is one clear error rather than a traceback from uvicorn."""
    if (cert is None) != (key is None):
        given = "--tls-cert" if cert is not None else "--tls-key"
        raise ConfigurationError(
            f"{given} without {'--tls-key' if cert is not None else '--tls-cert'}: give both "
            "PEM files (certificate and private key) for HTTPS, or neither"
        )
    if cert is None or key is None:
        return None
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {option} {path}: {exc.strerror}") from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # An empty password: an encrypted key fails here instead of prompting on the terminal.
        context.load_cert_chain(cert, key, password=b"")
    except ssl.SSLError as exc:
        raise ConfigurationError(
            f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate and its "
            f"unencrypted private key: {exc.reason or exc}"
        ) from exc
    return Tls(Path(cert), Path(key))


def server(service: OperatorService, tls: Tls | None = None) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(service),
        log_level="warning",
        access_log=False,
        lifespan="off",
        ssl_certfile=None if tls is None else str(tls.cert),
        ssl_keyfile=None if tls is None else str(tls.key),
    )
    return uvicorn.Server(config)


def address_of(sock: socket.socket, tls: Tls | None = None) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def listens_remotely(sock: socket.socket) -> bool:
    return not is_loopback(str(sock.getsockname()[0]))
