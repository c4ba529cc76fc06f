"""Kafka's security settings and the librdkafka pass-through: what reaches librdkafka, and a wrong
or contradictory value refused in one line naming its variable, never showing a secret."""

from __future__ import annotations

import pytest

from router.settings import Settings, load_settings
from streams.errors import ConfigurationError

SCRAM = {
    "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "RHUMBATRON_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "RHUMBATRON_KAFKA_SASL_USERNAME": "rh-app",
    "RHUMBATRON_KAFKA_SASL_PASSWORD": "pa55-w0rd-never-shown",
}


def _load(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Settings:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return load_settings()


def _refusal(monkeypatch: pytest.MonkeyPatch, **variables: str) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _load(monkeypatch, **variables)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_sasl_ssl_login_reaches_librdkafka_by_its_own_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _load(monkeypatch, **{**SCRAM, "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "sasl_ssl"})
    config = settings.kafka_config()
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (config["sasl.username"], config["sasl.password"]) == ("rh-app", "pa55-w0rd-never-shown")
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    assert "pa55-w0rd" not in repr(settings) and "pa55-w0rd" not in str(settings)


def test_endpoint_identification_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(monkeypatch, **SCRAM, RHUMBATRON_KAFKA_SSL_ENDPOINT_IDENTIFICATION="false")
    assert settings.kafka_config()["ssl.endpoint.identification.algorithm"] == "none"


def test_plaintext_sets_no_login_and_no_tls() -> None:
    config = Settings().kafka_config()
    assert config["security.protocol"] == "PLAINTEXT"
    assert not any(k.startswith(("sasl.", "ssl.")) for k in config)


def test_oauthbearer_is_configuration_for_oidc(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(
        monkeypatch,
        RHUMBATRON_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        RHUMBATRON_KAFKA_SASL_MECHANISM="OAUTHBEARER",
        RHUMBATRON_KAFKA_OAUTH_TOKEN_URL="https://idp.example/oauth2/token",
        RHUMBATRON_KAFKA_OAUTH_CLIENT_ID="rhumbatron",
        RHUMBATRON_KAFKA_OAUTH_CLIENT_SECRET="client-secret-never-shown",
    )
    config = settings.kafka_config()
    assert config["sasl.oauthbearer.method"] == "oidc"
    assert config["sasl.oauthbearer.client.secret"] == "client-secret-never-shown"
    assert "client-secret-never-shown" not in repr(settings)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (
            {"RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
            "needs RHUMBATRON_KAFKA_SASL_MECHANISM",
        ),
        (
            {k: v for k, v in SCRAM.items() if k != "RHUMBATRON_KAFKA_SASL_PASSWORD"},
            "SCRAM-SHA-512 needs RHUMBATRON_KAFKA_SASL_PASSWORD",
        ),
        ({"RHUMBATRON_KAFKA_SASL_USERNAME": "u"}, "apply to SASL only"),
        ({"RHUMBATRON_KAFKA_SSL_KEY_PASSWORD": "k"}, "apply to TLS only"),
        (
            {**SCRAM, "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SSL"},
            "apply to SASL only",
        ),
        (
            {"RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SSL", "RHUMBATRON_KAFKA_SSL_CA_FILE": "/nope"},
            "RHUMBATRON_KAFKA_SSL_CA_FILE='/nope': no such file",
        ),
        ({"RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "TLS"}, "RHUMBATRON_KAFKA_SECURITY_PROTOCOL='TLS'"),
        (
            {
                "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "RHUMBATRON_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            },
            "OAUTHBEARER (OIDC) needs RHUMBATRON_KAFKA_OAUTH_TOKEN_URL",
        ),
    ],
)
def test_a_contradictory_login_is_refused_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    message = _refusal(monkeypatch, **variables)
    assert expected in message
    assert "pa55-w0rd" not in message


def test_a_pass_through_property_reaches_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(
        monkeypatch,
        RHUMBATRON_KAFKA__SOCKET__KEEPALIVE__ENABLE="true",
        RHUMBATRON_KAFKA__LINGER__MS="25",
    )
    config = settings.kafka_config()
    assert config["socket.keepalive.enable"] == "true" and config["linger.ms"] == "25"
    assert "25" not in repr(settings.kafka)  # values are kept as secrets


def test_a_pass_through_can_be_one_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _load(monkeypatch, RHUMBATRON_KAFKA='{"client.rack": "eu-west-1a"}')
    assert settings.kafka_config()["client.rack"] == "eu-west-1a"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "RHUMBATRON_KAFKA__FOO__BAR",
            "1",
            "RHUMBATRON_KAFKA__FOO__BAR=(a secret, not shown): "
            "'foo.bar': librdkafka refuses it: No such configuration property",
        ),
        ("RHUMBATRON_KAFKA__LINGER_MS", "1", "a dot in the name is __ in the variable"),
        ("RHUMBATRON_KAFKA__LINGER__MS", "soon", "Invalid value"),
        ("RHUMBATRON_KAFKA__ENABLE__IDEMPOTENCE", "false", "enable.idempotence is fixed"),
        ("RHUMBATRON_KAFKA__ISOLATION__LEVEL", "read_uncommitted", "isolation.level is fixed"),
        ("RHUMBATRON_KAFKA__TRANSACTIONAL__ID", "x", "transactional.id is fixed"),
        ("RHUMBATRON_KAFKA__SASL__PASSWORD", "p", "set by RHUMBATRON_KAFKA_SASL_PASSWORD"),
        ("RHUMBATRON_KAFKA__BOOTSTRAP__SERVERS", "h:1", "set by RHUMBATRON_KAFKA_BOOTSTRAP"),
        ("RHUMBATRON_KAFKA__SESSION__TIMEOUT__MS", "9", "set by RHUMBATRON_SESSION_TIMEOUT_MS"),
    ],
)
def test_a_wrong_pass_through_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    message = _refusal(monkeypatch, **{variable: value})
    assert expected in message, message
    assert variable in message
