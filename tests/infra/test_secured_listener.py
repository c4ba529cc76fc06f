"""The local broker's secured listener (infra/local.sh): SASL_SSL with SCRAM-SHA-512, SCRAM-SHA-256
and PLAIN behind a certificate of the CA it made, which a client checking the broker's name
accepts; a wrong password or a CA it was not signed by is refused; the material is kept across a
restart, and made anew (users included) when its folder is deleted."""

from __future__ import annotations

import secrets
import stat
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from tests.support.infra import PrivateServices
from tests.support.secured import ADMIN, APP, SecuredListener, read_client_env, secured_listener
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def _metadata(config: dict[str, Any], timeout: float = 10) -> Any:
    return AdminClient(config).list_topics(timeout=timeout)


def _refusals(config: dict[str, Any]) -> list[KafkaError]:
    """The errors librdkafka reports for a client that cannot log in (its list_topics fails)."""
    errors: list[KafkaError] = []
    with_callback: dict[str, Any] = {**config, "error_cb": errors.append}
    admin = AdminClient(with_callback)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0)  # serves the error callbacks
    return errors


@pytest.fixture(scope="module")
def listener() -> SecuredListener:
    return secured_listener()


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("user", [ADMIN, APP])
def test_each_mechanism_logs_in_and_gets_the_secured_listeners_address(
    listener: SecuredListener, mechanism: str, user: str
) -> None:
    metadata = _metadata(listener.client_config(mechanism, user))
    # The broker advertises the listener a client came in on: every address is the secured one.
    assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [listener.bootstrap]


def test_the_admin_user_is_a_super_user(listener: SecuredListener) -> None:
    config = listener.client_config("SCRAM-SHA-512", ADMIN)
    admin = AdminClient(config)
    name = f"secured-listener-probe-{secrets.token_hex(5)}"
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=10)[name].result(timeout=15)
    try:
        # A created topic reaches the broker's metadata a moment after the controller answers.
        wait_until(lambda: name in _metadata(config).topics, 15, f"{name} in the metadata")
    finally:
        admin.delete_topics([name], operation_timeout=10)[name].result(timeout=15)


def test_the_broker_name_is_checked_under_both_names_and_passes(
    listener: SecuredListener,
) -> None:
    port = listener.bootstrap.rsplit(":", 1)[1]
    for host in ("127.0.0.1", "localhost"):
        config = listener.client_config("SCRAM-SHA-512") | {"bootstrap.servers": f"{host}:{port}"}
        assert config["ssl.endpoint.identification.algorithm"] == "https"
        assert _metadata(config).brokers


def test_a_ca_the_broker_was_not_signed_by_is_refused(
    listener: SecuredListener, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    errors = _refusals(listener.client_config("SCRAM-SHA-512") | {"ssl.ca.location": str(other)})
    assert any(e.code() == KafkaError._SSL for e in errors), errors


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_is_refused(listener: SecuredListener, mechanism: str) -> None:
    errors = _refusals(listener.client_config(mechanism, APP, password="not-the-password"))
    refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert refused, errors
    assert "Authentication failed" in refused[0].str()


def test_the_folder_and_its_secrets_are_private_and_client_env_names_the_listener(
    listener: SecuredListener,
) -> None:
    folder = listener.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("ca.key", "broker.key", "keystore.password", f"{ADMIN}.password", "client.env"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    env = read_client_env(folder)
    assert env == {
        "RHUMBATRON_KAFKA_BOOTSTRAP": listener.bootstrap,
        "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RHUMBATRON_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "RHUMBATRON_KAFKA_SASL_USERNAME": ADMIN,
        "RHUMBATRON_KAFKA_SASL_PASSWORD": listener.password(ADMIN),
        "RHUMBATRON_KAFKA_SSL_CA_FILE": str(listener.ca_file),
    }
    properties = (folder / "client.properties").read_text()
    assert f'password="{listener.password(ADMIN)}"' in properties
    assert f"ssl.truststore.location={listener.ca_file}" in properties


@pytest.mark.chaos
@pytest.mark.slow  # 86 s: two broker restarts
def test_a_restart_keeps_the_material_and_new_material_gets_its_users_on_the_running_broker() -> (
    None
):
    with PrivateServices(redis=False) as svc:
        listener = SecuredListener(svc.secured_dir, svc.secured_bootstrap)
        assert f"SASL_SSL {svc.secured_bootstrap}" in svc.run("status")
        ca = listener.ca_file.read_bytes()
        password = listener.password(APP)
        svc.kafka_stop()
        svc.kafka_start()
        assert listener.ca_file.read_bytes() == ca
        assert listener.password(APP) == password
        assert _metadata(listener.client_config("SCRAM-SHA-512", APP)).brokers

        # A broker restarted from its metadata snapshot can lose one SCRAM mechanism of a user
        # (Kafka 4.4 keeps one per user there): the start finds it missing and makes it again.
        admin = AdminClient({"bootstrap.servers": svc.bootstrap})
        [lost] = admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion(APP, ScramMechanism.SCRAM_SHA_512)]
        ).values()
        lost.result(timeout=30)
        svc.kafka_stop()
        out = svc.run("kafka-start")
        assert f"made again: {APP}/SCRAM-SHA-512" in out
        assert _metadata(listener.client_config("SCRAM-SHA-512", APP)).brokers

        # Deleting the folder makes a new CA and new passwords; the storage keeps its users
        # (with the old passwords) until the start sets the new ones with ConfigCommand.
        svc.kafka_stop()
        for path in sorted(svc.secured_dir.iterdir()):
            path.unlink()
        svc.secured_dir.rmdir()
        out = svc.run("kafka-start")
        assert "created on the running broker" in out
        assert listener.ca_file.read_bytes() != ca
        assert listener.password(APP) != password
        for mechanism in MECHANISMS:
            assert _metadata(listener.client_config(mechanism, APP)).brokers, mechanism
        refused = _refusals(listener.client_config("SCRAM-SHA-512", APP, password=password))
        assert any(e.code() == KafkaError._AUTHENTICATION for e in refused), refused
