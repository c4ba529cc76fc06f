"""The one librdkafka config builder: its layers, in order, for every role."""

from __future__ import annotations

import pytest

from streams.kafka_config import GUARANTEED, client_config, listener_of

BASE = {"bootstrap.servers": "b:9092", "security.protocol": "PLAINTEXT"}


def test_a_pass_through_in_the_base_wins_over_a_tuning_default() -> None:
    config = client_config({**BASE, "linger.ms": "50"}, "producer")
    assert config["linger.ms"] == "50"
    assert client_config(BASE, "producer")["linger.ms"] == 5


def test_the_guarantees_win_over_the_base() -> None:
    base = {**BASE, "enable.idempotence": False, "enable.auto.commit": True, "acks": "1"}
    producer = client_config(base, "producer")
    assert producer["enable.idempotence"] is True and producer["acks"] == "all"
    consumer = client_config(base, "consumer", group_id="g")
    assert consumer["enable.auto.commit"] is False
    assert consumer["isolation.level"] == "read_committed"


def test_the_callers_extra_comes_last() -> None:
    config = client_config(BASE, "consumer", group_id="g", extra={"enable.partition.eof": True})
    assert config["enable.partition.eof"] is True


def test_each_guarantee_is_refusable_as_a_pass_through() -> None:
    for role, kwargs in (
        ("producer", {"transactional_id": "t", "gapless": True}),
        ("consumer", {"group_id": "g"}),
        ("reader", {}),
    ):
        config = client_config(BASE, role, **kwargs)  # type: ignore[arg-type]
        fixed = set(config) - set(BASE) - {"logger", "linger.ms", "compression.type"}
        fixed -= {"session.timeout.ms", "heartbeat.interval.ms"}  # owned by a setting instead
        assert fixed <= GUARANTEED, (role, fixed - GUARANTEED)


def test_the_group_protocols() -> None:
    classic = client_config(BASE, "consumer", group_id="g", session_timeout_ms=6000)
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert classic["heartbeat.interval.ms"] == 1200
    kip848 = client_config(BASE, "consumer", group_id="g", protocol="consumer")
    assert kip848["group.protocol"] == "consumer" and "session.timeout.ms" not in kip848
    with pytest.raises(ValueError, match="classic"):
        client_config(BASE, "consumer", group_id="g", protocol="eager")
    with pytest.raises(ValueError, match="group id"):
        client_config(BASE, "consumer")


def test_a_reader_gets_a_group_id_it_never_commits_with() -> None:
    a, b = client_config(BASE, "reader"), client_config(BASE, "reader")
    assert a["group.id"] != b["group.id"] and a["enable.auto.commit"] is False


def test_the_listener_names_how_it_logs_in_and_never_the_password() -> None:
    assert listener_of(BASE) == "b:9092"
    secured = {
        **BASE,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "rh-app",
        "sasl.password": "hunter2",
    }
    assert listener_of(secured) == "b:9092 (SASL_SSL, SCRAM-SHA-512, user rh-app)"
    assert listener_of({**BASE, "security.protocol": "SSL"}) == "b:9092 (SSL)"
