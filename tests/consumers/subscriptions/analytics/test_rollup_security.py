"""The rollup logs in as the librdkafka clients do: its faust credentials come from the same
librdkafka configuration (protocol, SASL login, CA, client certificate, endpoint identification);
OAUTHBEARER and what aiokafka cannot do are refused in one line."""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest
import trustme

from consumers.subscriptions.analytics.rollup import (
    RollupSecurity,
    broker_credentials,
    rollup_security,
)
from streams.errors import ConfigurationError


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)


def test_plaintext_has_no_credentials() -> None:
    security = rollup_security({"bootstrap.servers": "127.0.0.1:9092"})
    assert security == RollupSecurity()
    assert broker_credentials(security) is None


def test_sasl_ssl_takes_the_login_and_a_context_trusting_the_ca(ca_file: str) -> None:
    security = rollup_security(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "rh-app",
            "sasl.password": "s3cret",
            "ssl.ca.location": ca_file,
            "ssl.endpoint.identification.algorithm": "https",
        }
    )
    assert "s3cret" not in repr(security)
    credentials = broker_credentials(security)
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    assert (credentials.username, credentials.password) == ("rh-app", "s3cret")
    context = credentials.ssl_context
    assert context is not None and context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()] == [
        c["subject"] for c in _context_of(ca_file).get_ca_certs()
    ]


def test_endpoint_identification_off_stops_the_name_check_not_the_chain(ca_file: str) -> None:
    security = rollup_security(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": ca_file,
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    credentials = broker_credentials(security)
    assert isinstance(credentials, faust.SSLCredentials)
    assert credentials.protocol.value == "SSL"
    assert not credentials.context.check_hostname
    assert credentials.context.verify_mode == ssl.CERT_REQUIRED


def test_sasl_plaintext_has_no_tls() -> None:
    credentials = broker_credentials(
        rollup_security(
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": "p",
            }
        )
    )
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_PLAINTEXT"
    assert credentials.ssl_context is None


def test_a_client_certificate_is_loaded(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("rhumbatron-client")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    security = rollup_security(
        {"security.protocol": "SSL", "ssl.certificate.location": str(cert)}
        | {"ssl.key.location": str(key)}
    )
    assert broker_credentials(security) is not None
    broken = RollupSecurity(protocol="SSL", cert_file=str(cert), key_file=str(tmp_path / "no"))
    with pytest.raises(ConfigurationError, match="cannot load its TLS files"):
        broker_credentials(broken)


def test_oauthbearer_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigurationError) as refused:
        rollup_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    message = str(refused.value)
    assert "\n" not in message
    assert "OAUTHBEARER" in message and "token provider" in message


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "GSSAPI"),
        ({"security.protocol": "SASL_SSL"}, "GSSAPI"),  # librdkafka's default mechanism
        ({"security.protocol": "TLS"}, "'TLS'"),
    ],
)
def test_what_aiokafka_cannot_do_is_refused(config: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        rollup_security(config)


def _context_of(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)
