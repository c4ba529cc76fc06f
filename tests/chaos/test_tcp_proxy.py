"""The fault tests' TCP proxy (tests/support/tcp_proxy.py) against an echo server of the test's
own: it forwards both ways, and cut, reset, delay and heal do what the matrix's rows rely on;
and in front of a private broker's proxied listener, which clients cannot bypass."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.support.infra import PrivateServices
from tests.support.tcp_proxy import Mode, TcpProxy

TIMEOUT_S = 5.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield str(host), int(port)
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[TcpProxy]:
    with TcpProxy(echo) as p:
        yield p


def _connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT_S)


def _round_trip(conn: socket.socket, data: bytes = b"ping") -> bytes:
    conn.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = conn.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def test_it_forwards_both_ways(proxy: TcpProxy) -> None:
    with _connect(proxy) as conn:
        assert _round_trip(conn, b"x" * 200_000) == b"x" * 200_000
        assert _round_trip(conn) == b"ping"
    assert proxy.accepted == 1


def test_a_cut_refuses_new_connections_and_closes_open_ones_until_healed(
    proxy: TcpProxy,
) -> None:
    port = proxy.port
    conn = _connect(proxy)
    assert _round_trip(conn) == b"ping"
    proxy.cut()
    assert proxy.mode is Mode.CUT
    assert conn.recv(4096) == b"", "an open connection outlived the cut"
    conn.close()
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy)
    assert proxy.dropped == 1
    proxy.heal()
    assert proxy.port == port, "healed on another port: clients would not find it"
    with _connect(proxy) as again:
        assert _round_trip(again) == b"ping"


def test_a_reset_resets_open_connections_and_every_new_one(proxy: TcpProxy) -> None:
    conn = _connect(proxy)
    assert _round_trip(conn) == b"ping"
    proxy.reset()
    with pytest.raises(ConnectionResetError):
        _round_trip(conn)
    conn.close()
    with pytest.raises(ConnectionResetError), _connect(proxy) as fresh:  # reset in or after connect
        _round_trip(fresh)
    proxy.heal()
    with _connect(proxy) as again:
        assert _round_trip(again) == b"ping"


def test_a_delay_holds_each_direction_back(proxy: TcpProxy) -> None:
    """A lower bound only: bytes held 0.3 s each way cannot make the round trip in less than
    0.6 s, however loaded the machine is."""
    proxy.delay(0.3)
    with _connect(proxy) as conn:
        began = time.monotonic()
        assert _round_trip(conn) == b"ping"
        assert time.monotonic() - began >= 0.6
        proxy.heal()
        assert proxy.delay_s == 0
        assert _round_trip(conn, b"pong") == b"pong"  # the open link stays usable
    with pytest.raises(ValueError, match="at least 0 s"):
        proxy.delay(-1)


def test_a_connection_to_a_target_that_is_down_is_reset() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    # Nothing listens on ``dead`` once the probe is closed.
    with TcpProxy(dead) as p, pytest.raises(ConnectionResetError), _connect(p) as conn:
        _round_trip(conn)


@pytest.mark.integration
@pytest.mark.chaos
def test_a_client_of_the_proxied_listener_cannot_bypass_the_proxy() -> None:
    """A private broker's proxied listener advertises the proxy's address: a client bootstrapped
    through the proxy is sent back to it for every broker connection, so a cut proxy leaves it
    no way in, while the broker's own listener stays direct."""
    with PrivateServices(redis=False, kafka_proxy=True) as svc:
        assert svc.kafka_proxy is not None
        through = AdminClient({"bootstrap.servers": svc.proxied_bootstrap})
        brokers = through.list_topics(timeout=30).brokers.values()
        advertised = {(str(b.host), int(b.port)) for b in brokers}
        assert advertised == {("127.0.0.1", svc.kafka_proxy.port)}
        direct = AdminClient({"bootstrap.servers": svc.bootstrap})
        ports = {b.port for b in direct.list_topics(timeout=30).brokers.values()}
        assert ports == {svc.kafka_port}
        svc.kafka_proxy.cut()
        with pytest.raises(KafkaException):
            through.list_topics(timeout=3)
        assert direct.list_topics(timeout=30).brokers
        svc.kafka_proxy.heal()
        assert through.list_topics(timeout=30).brokers
