"""The operator server is safe by default: an address other machines can reach is refused unless
``--allow-remote`` (then a warning says to put TLS in front), and ``--tls-cert/--tls-key`` serve
real HTTPS, checked here with a CA of the test's own (trustme)."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from router.operator.server import bind, is_loopback, tls_files
from router.settings import Settings
from streams.errors import ConfigurationError
from tests.support.environment import ROOT, make_settings, subprocess_env

TOKEN = "server-test-token-0123456789abcdef"


def _serve(s: Settings, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--port", "0", *args],
        cwd=ROOT,
        env=subprocess_env(s, RHUMBATRON_OPERATOR_TOKEN=TOKEN, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def _address(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the socket is bound
    assert line.startswith("operator page at "), line + (proc.stderr.read() if proc.stderr else "")
    return line.split()[3]


@pytest.fixture
def settings() -> Settings:
    """An environment of its own; ``serve`` creates nothing on the servers, so nothing to clean."""
    return make_settings()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pem(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("tls")
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = folder / "cert.pem", folder / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    yield cert, key


# -- which addresses are loopback ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("192.168.1.5", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%lo", False),
    ],
)
def test_loopback_is_127_slash_8_and_colon_colon_1_only(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_a_name_is_resolved_before_it_is_judged() -> None:
    bind("localhost", 0).close()  # resolves to 127.0.0.1 or ::1
    with pytest.raises(ConfigurationError, match=r"operator_host 0\.0\.0\.0 is not a loopback"):
        bind("0.0.0.0", 0)
    bind("0.0.0.0", 0, allow_remote=True).close()


# -- the certificate and key ---------------------------------------------------------------------
def test_tls_files_are_both_or_neither_and_must_be_a_readable_pair(
    pem: tuple[Path, Path], tmp_path: Path, ca: trustme.CA
) -> None:
    cert, key = pem
    assert tls_files(None, None) is None
    assert tls_files(str(cert), str(key)) is not None
    with pytest.raises(ConfigurationError, match="--tls-cert without --tls-key"):
        tls_files(str(cert), None)
    with pytest.raises(ConfigurationError, match="--tls-key without --tls-cert"):
        tls_files(None, str(key))
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(ConfigurationError, match=f"cannot read --tls-key {missing}: No such file"):
        tls_files(str(cert), str(missing))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=f"--tls-cert {garbage} and --tls-key .* not a"):
        tls_files(str(garbage), str(key))
    other_key = tmp_path / "other.key"
    ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    with pytest.raises(ConfigurationError, match="not a PEM certificate and its"):
        tls_files(str(cert), str(other_key))


# -- the command ---------------------------------------------------------------------------------
def test_serve_with_a_certificate_answers_https_only(
    settings: Settings, pem: tuple[Path, Path], ca: trustme.CA
) -> None:
    cert, key = pem
    proc = _serve(settings, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        url = _address(proc)
        assert url.startswith("https://127.0.0.1:"), url
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        with httpx.Client(verify=trusted, timeout=30) as client:
            info = client.get(url + "api/info").json()
            assert info["env"] == settings.env and info["mutations_enabled"] is True
        with pytest.raises(httpx.ConnectError):  # a client that does not trust our CA
            httpx.get(url + "api/info", timeout=30)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the HTTPS port
            httpx.get(url.replace("https://", "http://") + "api/info", timeout=30)
    finally:
        err = _stop(proc)
    assert "without TLS" not in err


def test_serve_refuses_a_non_loopback_host_without_allow_remote(settings: Settings) -> None:
    proc = _serve(settings, RHUMBATRON_OPERATOR_HOST="0.0.0.0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("rhumbatron: operator_host 0.0.0.0 is not a loopback address"), line
    assert "--allow-remote" in line and "TLS" in line


def test_serve_with_allow_remote_serves_and_warns_to_put_tls_in_front(settings: Settings) -> None:
    proc = _serve(settings, "--allow-remote", RHUMBATRON_OPERATOR_HOST="0.0.0.0")
    try:
        url = _address(proc)
        assert url.startswith("http://0.0.0.0:"), url
        port = url.rsplit(":", 1)[1].rstrip("/")
        info = httpx.get(f"http://127.0.0.1:{port}/api/info", timeout=30).json()
        assert info["env"] == settings.env
    finally:
        err = _stop(proc)
    assert "warning: the operator API listens on 0.0.0.0 without TLS" in err
    assert "--tls-cert" in err


def test_serve_with_allow_remote_and_a_certificate_does_not_warn(
    settings: Settings, pem: tuple[Path, Path], ca: trustme.CA
) -> None:
    cert, key = pem
    proc = _serve(
        settings,
        "--allow-remote",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        RHUMBATRON_OPERATOR_HOST="0.0.0.0",
    )
    try:
        port = _address(proc).rsplit(":", 1)[1].rstrip("/")
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        info = httpx.get(f"https://127.0.0.1:{port}/api/info", verify=trusted, timeout=30)
        assert info.json()["env"] == settings.env
    finally:
        err = _stop(proc)
    assert "without TLS" not in err


def test_serve_with_half_a_tls_pair_is_one_line(settings: Settings, pem: tuple[Path, Path]) -> None:
    proc = _serve(settings, "--tls-cert", str(pem[0]))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.splitlines() == [
        "rhumbatron: --tls-cert without --tls-key: give both PEM files (certificate and private "
        "key) for HTTPS, or neither"
    ]
