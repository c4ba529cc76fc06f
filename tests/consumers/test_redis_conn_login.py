"""``connect`` against a private redis-server of this module's own that asks for a login (a
password, and an ACL user), and one that speaks only TLS with a CA of the test's own (trustme)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from consumers.redis_conn import connect
from streams.errors import Unreachable
from tests.support.infra import _pick_port

pytestmark = pytest.mark.integration

PASSWORD = "hunter2-default"
USER, USER_PASSWORD = "router", "hunter2-acl"


def _serve(*args: str) -> Iterator[int]:
    """A redis-server on a free port, without persistence, stopped at the end."""
    port = _pick_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            *args,
            *(("--port", str(port)) if "--tls-port" not in args else ()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def _listening(port: int) -> None:
    for _ in range(100):  # the server is up when it accepts, however long that takes
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server on port {port} never listened")


@pytest.fixture(scope="module")
def login_port() -> Iterator[int]:
    for port in _serve(
        "--requirepass", PASSWORD, "--user", USER, "on", f">{USER_PASSWORD}", "~*", "&*", "+@all"
    ):
        _listening(port)
        yield port


def test_the_password_in_the_url_logs_in(login_port: int) -> None:
    client = connect(f"redis://:{PASSWORD}@127.0.0.1:{login_port}/0", timeout=5)
    assert client.ping()


def test_an_acl_user_in_the_url_logs_in(login_port: int) -> None:
    client = connect(f"redis://{USER}:{USER_PASSWORD}@127.0.0.1:{login_port}/0", timeout=5)
    assert client.acl_whoami() == USER


def test_the_separate_fields_log_in_and_win_over_the_url(login_port: int) -> None:
    url = f"redis://nobody:wrong@127.0.0.1:{login_port}/0"
    client = connect(url, timeout=5, username=USER, password=USER_PASSWORD)
    assert client.acl_whoami() == USER
    assert connect(f"redis://127.0.0.1:{login_port}/0", timeout=5, password=PASSWORD).ping()


@pytest.mark.parametrize(
    "url",
    ["redis://:wrong-pass@127.0.0.1:{port}/0", "redis://{user}:wrong-pass@127.0.0.1:{port}/0"],
)
def test_a_wrong_password_is_one_error_naming_the_address_not_the_password(
    login_port: int, url: str
) -> None:
    with pytest.raises(Unreachable) as caught:
        connect(url.format(port=login_port, user=USER), timeout=5)
    message = str(caught.value)
    assert f"127.0.0.1:{login_port}" in message
    assert "wrong-pass" not in message
    assert "login" in message


def test_no_password_where_one_is_asked_for_says_so(login_port: int) -> None:
    with pytest.raises(Unreachable, match="login") as caught:
        connect(f"redis://127.0.0.1:{login_port}/0", timeout=5)
    assert f"127.0.0.1:{login_port}" in str(caught.value)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path, Path]]:
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("router@rhumbatron.test")
    ca_file, server_pem, client_cert, client_key = (
        folder / name for name in ("ca.pem", "server.pem", "client.pem", "client.key")
    )
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    port = _pick_port()
    for _ in _serve(
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(server_pem),
        "--tls-key-file",
        str(server_pem),
        "--tls-ca-cert-file",
        str(ca_file),
        "--tls-auth-clients",
        "yes",
    ):
        _listening(port)
        yield port, ca_file, client_cert, client_key


def test_rediss_with_the_ca_and_a_client_certificate_connects(
    tls: tuple[int, Path, Path, Path],
) -> None:
    port, ca_file, cert, key = tls
    client = connect(
        f"rediss://127.0.0.1:{port}/0",
        timeout=5,
        ssl_ca_file=str(ca_file),
        ssl_cert_file=str(cert),
        ssl_key_file=str(key),
    )
    assert client.set("tls", "yes") and client.get("tls") == b"yes"


def test_rediss_without_the_ca_is_refused_naming_the_address(
    tls: tuple[int, Path, Path, Path],
) -> None:
    port, _, cert, key = tls
    with pytest.raises(Unreachable, match=f"127.0.0.1:{port}"):
        connect(
            f"rediss://127.0.0.1:{port}/0",
            timeout=5,
            ssl_cert_file=str(cert),
            ssl_key_file=str(key),
        )


def test_the_settings_login_reaches_the_client(login_port: int) -> None:
    from router.wiring.subscription import redis_client
    from tests.support.environment import make_settings

    s = make_settings(
        redis_url=f"redis://127.0.0.1:{login_port}/0",
        redis_username=USER,
        redis_password=USER_PASSWORD,
    )
    assert redis_client(s).acl_whoami() == USER
