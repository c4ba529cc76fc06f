"""The settings model: wrong limits are refused naming the setting, values derived in one place,
and every secret reaching a child process in clear through ``as_environment``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from router.settings import DAY_MS, QueuePolicy, Settings, load_settings, shown
from router.wiring.causal import router_outbox_path
from streams.errors import ConfigurationError
from tests.support.environment import ROOT, make_settings, run_cli, subprocess_env


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("flush_timeout_s", 0, "greater than 0"),
        ("outbox_postgres_pool_size", 0, "greater than or equal to 1"),
        ("outbox_postgres_keepalive_s", 0, "greater than 0"),
        ("outbox_postgres_listen_tick_s", -1, "greater than 0"),
        ("produce_flush_timeout_s", -1.0, "greater than 0"),
        ("demo_idle_s", 0, "greater than 0"),
        ("demo_max_wait_s", 0, "greater than 0"),
        ("group_join_timeout_s", 0, "greater than 0"),
        ("batch_failure_ttl_s", 59, "greater than or equal to 60"),
        ("claim_retention_margin_ms", -1, "greater than or equal to 0"),
        ("claim_buckets", 0, "greater than or equal to 1"),
        ("claim_buckets", 65_537, "less than or equal to 65536"),
        ("router_outbox_path", "", "at least 1 character"),
        ("command_error_max_bytes", 63, "greater than or equal to 64"),
        ("dead_letter_record_max_bytes", 16_383, "greater than or equal to 16384"),
        ("worker_transaction_max_commands", 0, "greater than or equal to 1"),
        ("worker_transaction_max_commands", 100_001, "less than or equal to 100000"),
        ("worker_transaction_max_ms", 0, "greater than or equal to 1"),
        ("worker_transaction_max_ms", 60_001, "less than or equal to 60000"),
        ("batch_size_behind", 0, "greater than or equal to 1"),
        ("batch_size_behind", 50_001, "less than or equal to 50000"),
        ("fleet_worker_processes", 0, "greater than or equal to 1"),
        ("fleet_restart_backoff_s", 0, "greater than 0"),
        ("fleet_restart_backoff_s", 60.0, "must be at most RHUMBATRON_FLEET_RESTART_BACKOFF_MAX_S"),
        ("fleet_max_restarts", -1, "greater than or equal to 0"),
        ("fleet_restart_window_s", 0, "greater than 0"),
        ("fleet_stop_timeout_s", 0, "greater than 0"),
        ("fleet_stop_timeout_s", 3601, "less than or equal to 3600"),
        ("fleet_metrics_port_base", 0, "greater than or equal to 1"),
        ("fleet_instance_prefix", "a host", "should match pattern"),
        ("fleet_instance_held_wait_s", 0, "greater than 0"),
        ("fleet_instance_held_wait_s", 601, "less than or equal to 600"),
        ("fleet_instance_held_max_s", 0, "greater than 0"),
        ("fleet_instance_held_max_s", 86_401, "less than or equal to 86400"),
        ("fleet_scale_lag", 0, "greater than or equal to 1"),
        ("probe_timeout_s", 0, "greater than 0"),
        ("probe_timeout_s", 61, "less than or equal to 60"),
        ("redis_wait_replicas", -1, "greater than or equal to 0"),
        ("redis_wait_replicas", 17, "less than or equal to 16"),
        ("redis_wait_timeout_ms", 0, "greater than 0"),
        ("redis_wait_timeout_ms", 60_001, "less than or equal to 60000"),
        ("group_instance_id", "", "at least 1 character"),
        ("process_name", "ledger/1", "should match pattern"),
        ("fold_cache_projects", 0, "greater than or equal to 1"),
        ("fold_cache_projects", 10_000_001, "less than or equal to 10000000"),
        ("fold_cache_kbytes", -1, "greater than or equal to 0"),
        ("fold_cache_kbytes", 16_777_217, "less than or equal to 16777216"),
        ("consumer_prefetch_kbytes", 63, "greater than or equal to 64"),
        ("consumer_prefetch_kbytes", 2_097_152, "less than or equal to 2097151"),
        ("consumer_fetch_backoff_ms", -1, "greater than or equal to 0"),
        ("consumer_fetch_backoff_ms", 300_001, "less than or equal to 300000"),
        ("gc_young_threshold", 99, "greater than or equal to 100"),
        ("gc_young_threshold", 10_000_001, "less than or equal to 10000000"),
        ("pump_page_size", 0, "greater than or equal to 1"),
        ("pump_batch_max_events", 10_001, "less than or equal to 10000"),
        ("pump_batch_max_bytes", 1000, "below RHUMBATRON_MAX_ENVELOPE_BYTES"),
        ("pump_page_max_bytes", 10, "greater than or equal to 1024"),
        ("pump_poll_interval_s", 0, "greater than 0"),
        ("pump_request_timeout_s", 0, "greater than 0"),
        ("pump_backoff_s", 100.0, "below RHUMBATRON_PUMP_BACKOFF_S"),
        ("flush_timeout_s", "soon", "valid number"),
    ],
)
def test_a_wrong_limit_is_refused_naming_the_setting_and_the_bound(
    name: str, value: object, says: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: value})  # type: ignore[arg-type]
    text = str(refused.value)
    assert name in text and says in text and repr(value).strip("'") in text


def test_a_wrong_limit_from_the_environment_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHUMBATRON_FLUSH_TIMEOUT_S", "-3")
    with pytest.raises(ValidationError, match=r"flush_timeout_s\n.*greater than 0"):
        Settings()


BAD_VALUES = [
    # (variable, value, what the line must also say)
    ("RHUMBATRON_BATCH_SIZE", "abc", "valid integer"),
    ("RHUMBATRON_BATCH_SIZE", "0", "greater than or equal to 1"),
    ("RHUMBATRON_REDIS_URL", "notaurl", "scheme redis, rediss, unix"),
    ("RHUMBATRON_REDIS_URL", "redis://", "expected a host"),
    ("RHUMBATRON_REDIS_URL", "redis://h:99999/0", "port of 0-65535"),
    ("RHUMBATRON_REDIS_URL", "unix://", "unix:///path"),
    ("RHUMBATRON_REDIS_CLUSTER", "127.0.0.1", "the cluster's seed nodes"),
    ("RHUMBATRON_REDIS_CLUSTER", "127.0.0.1:7000,:7001", "got ':7001'"),
    ("RHUMBATRON_REDIS_CLUSTER", "h:70000", "ports 1-65535"),
    ("RHUMBATRON_KAFKA_BOOTSTRAP", "broker", "host:port"),
    ("RHUMBATRON_KAFKA_BOOTSTRAP", "a:9092,b:0", "ports 1-65535"),
    ("RHUMBATRON_KAFKA_BOOTSTRAP", "a:9092,", "host:port"),
    ("RHUMBATRON_ENV", "no-hyphens", "letters, digits and underscores"),
    ("RHUMBATRON_SESSION_TIMEOUT_MS", "-5", "greater than or equal to 1000"),
    ("RHUMBATRON_SESSION_TIMEOUT_MS", "3600001", "less than or equal to 3600000"),
    ("RHUMBATRON_MAX_POLL_INTERVAL_MS", "0", "greater than or equal to 1"),
    ("RHUMBATRON_TRANSACTION_TIMEOUT_MS", "999", "greater than or equal to 1000"),
    ("RHUMBATRON_BATCH_RETRY_BACKOFF_S", "-10", "greater than 0"),
    ("RHUMBATRON_OUTBOX_BACKOFF_INITIAL_S", "0", "greater than 0"),
    ("RHUMBATRON_OUTBOX_POLL_INTERVAL_S", "0", "greater than 0"),
    ("RHUMBATRON_OUTBOX_LINGER_MS", "900001", "less than or equal to 900000"),
    ("RHUMBATRON_CONTROL_CHECK_INTERVAL_S", "-1", "greater than or equal to 0"),
    ("RHUMBATRON_MAINTENANCE_AT_UTC", "99:99", "HH:MM, 00:00 to 23:59"),
    ("RHUMBATRON_MAINTENANCE_AT_UTC", "24:00", "HH:MM, 00:00 to 23:59"),
    ("RHUMBATRON_MAINTENANCE_AT_UTC", "4:17", "HH:MM, 00:00 to 23:59"),
    ("RHUMBATRON_CLASSIFIER_THRESHOLD", "1.5", "less than or equal to 1"),
    ("RHUMBATRON_CLASSIFIER_CALLS_PER_DAY", "-1", "greater than or equal to 0"),
    ("RHUMBATRON_CLASSIFIER_URL", "ftp://model", "should match pattern"),
    ("RHUMBATRON_AGENTS_PER_CHANGE", "0", "greater than or equal to 1"),
    ("RHUMBATRON_COMMANDS_PER_CHANGE_PER_DAY", "0", "greater than or equal to 1"),
    ("RHUMBATRON_STREAM_RETENTION_MS", "-1", "greater than or equal to 1"),
    ("RHUMBATRON_MAX_STREAMS_PER_ENV", "101", "less than or equal to 100"),
    ("RHUMBATRON_MAX_ENVELOPE_BYTES", "1000000001", "less than or equal to 1000000000"),
    ("RHUMBATRON_ARCHIVE_PART_MAX_AGE_S", "0", "greater than 0"),
    ("RHUMBATRON_MAX_COMMAND_DELIVERIES", "0", "greater than or equal to 1"),
    ("RHUMBATRON_PUMP_BATCH_MAX_EVENTS", "0", "greater than or equal to 1"),
    ("RHUMBATRON_OPERATOR_PORT", "65536", "less than or equal to 65535"),
    ("RHUMBATRON_OPERATOR_PORT", "-1", "greater than or equal to 0"),
    ("RHUMBATRON_OPERATOR_OUTBOXES", '["a.sqlite"', "expected JSON"),
    # the queues: malformed JSON, a bad field, an unknown field, a name no queue can have
    ("RHUMBATRON_QUEUES", '{"integration": {"retries": 5}', "expected JSON"),
    ("RHUMBATRON_QUEUES", '["integration"]', "valid dictionary"),
    ("RHUMBATRON_QUEUES__INTEGRATION__RETRIES", "-1", "greater than or equal to 0"),
    ("RHUMBATRON_QUEUES__AGENT_WAKEUPS__BATCH", "0", "greater than or equal to 1"),
    ("RHUMBATRON_QUEUES__RELEASE__RETRY_DELAY_S", "soon", "valid number"),
    ("RHUMBATRON_QUEUES__INDEXING__DEAD_LETTER", '"nowhere"', "dead_letter must be a queue"),
    ("RHUMBATRON_QUEUES__INTEGRATION__RETRYS", "5", "Extra inputs are not permitted"),
    ("RHUMBATRON_QUEUES__INDEXING__DEAD_LETTER", "payments", "queue 'indexing': dead_letter"),
    ("RHUMBATRON_QUEUES__PAYMENTS_RETRY__RETRIES", "5", "queue name 'payments_retry'"),
]


@pytest.mark.parametrize(("variable", "value", "says"), BAD_VALUES)
def test_a_bad_value_is_one_line_naming_the_variable_the_value_and_the_expectation(
    variable: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"invalid setting: {variable}=")
    assert says in line and (value in line or repr(value) in line)


@pytest.mark.parametrize(
    "variable", ["RHUMBATRON_OPERATOR_TOKEN", "RHUMBATRON_OPERATOR_READ_TOKEN"]
)
def test_a_short_operator_token_is_refused_in_one_line_without_showing_it(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = "x" * 31
    monkeypatch.setenv(variable, short)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    line = str(refused.value)
    assert "\n" not in line and short not in line
    assert line.startswith(f"invalid setting: {variable}=(a secret, not shown): ")
    assert "at least 32 characters, got 31" in line
    monkeypatch.setenv(variable, "x" * 32)
    assert load_settings()


@pytest.mark.parametrize(
    ("variables", "first", "second"),
    [
        (
            {"RHUMBATRON_OUTBOX_BACKOFF_INITIAL_S": "400"},
            "RHUMBATRON_OUTBOX_BACKOFF_INITIAL_S=400.0",
            "RHUMBATRON_OUTBOX_BACKOFF_MAX_S=300.0",
        ),
        (
            {"RHUMBATRON_BATCH_RETRY_BACKOFF_S": "5", "RHUMBATRON_BATCH_RETRY_BACKOFF_MAX_S": "2"},
            "RHUMBATRON_BATCH_RETRY_BACKOFF_S=5.0",
            "RHUMBATRON_BATCH_RETRY_BACKOFF_MAX_S=2.0",
        ),
        (
            {"RHUMBATRON_SESSION_TIMEOUT_MS": "60000", "RHUMBATRON_MAX_POLL_INTERVAL_MS": "30000"},
            "RHUMBATRON_SESSION_TIMEOUT_MS=60000",
            "RHUMBATRON_MAX_POLL_INTERVAL_MS=30000",
        ),
        (
            {"RHUMBATRON_STREAMS": "30"},
            "RHUMBATRON_STREAMS=30",
            "RHUMBATRON_MAX_STREAMS_PER_ENV=20",
        ),
        (
            {"RHUMBATRON_BATCH_SIZE": "800", "RHUMBATRON_BATCH_SIZE_BEHIND": "600"},
            "RHUMBATRON_BATCH_SIZE=800",
            "RHUMBATRON_BATCH_SIZE_BEHIND=600",
        ),
        (
            {"RHUMBATRON_OUTBOX_POLL_MIN_INTERVAL_S": "5"},
            "RHUMBATRON_OUTBOX_POLL_MIN_INTERVAL_S=5.0",
            "RHUMBATRON_OUTBOX_POLL_INTERVAL_S=0.5",
        ),
    ],
)
def test_values_that_contradict_each_other_are_refused_naming_both(
    variables: dict[str, str], first: str, second: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    line = str(refused.value)
    assert "\n" not in line and f"{first} must be at most {second}" in line


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        (
            "RHUMBATRON_QUEUES",
            '{"integration": {"retries": -5}}',
            "RHUMBATRON_QUEUES (at integration.retries)=-5: Input should be greater than or equal",
        ),
        (
            "RHUMBATRON_FAILURE_POLICIES",
            '{"ledger": "skip"}',
            "RHUMBATRON_FAILURE_POLICIES (at ledger)='skip': Input should be 'dead-letter' or",
        ),
    ],
)
def test_a_bad_value_inside_a_json_variable_names_the_variable_and_the_place(
    variable: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    assert f"invalid setting: {says}" in str(refused.value)


def test_every_default_passes_its_own_bounds() -> None:
    # pydantic does not validate defaults on its own; given back as values, each one is.
    defaults = Settings()
    assert Settings.model_validate(defaults.model_dump()) == defaults


def _queues_but(settings: Settings, purpose: str) -> dict[str, object]:
    return {k: v for k, v in settings.queues.items() if k != purpose}


@pytest.mark.parametrize(
    ("variable", "purpose"),
    [
        ("RHUMBATRON_QUEUES__INTEGRATION__RETRIES", "integration"),
        ("RHUMBATRON_QUEUES__AGENT_WAKEUPS__RETRIES", "agent-wakeups"),
        ("RHUMBATRON_QUEUES__DEAD_LETTER__RETRIES", "dead-letter"),
    ],
)
def test_one_queue_field_changes_that_field_alone(
    variable: str, purpose: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = Settings()
    monkeypatch.setenv(variable, "9")
    s = load_settings()
    assert s.queues[purpose] == defaults.queues[purpose].model_copy(update={"retries": 9})
    assert _queues_but(s, purpose) == _queues_but(defaults, purpose)
    assert s.model_dump(exclude={"queues"}) == defaults.model_dump(exclude={"queues"})


def test_the_whole_queues_json_is_merged_onto_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = Settings()
    monkeypatch.setenv("RHUMBATRON_QUEUES", '{"agent-wakeups": {"retries": 7, "batch": 2}}')
    monkeypatch.setenv("RHUMBATRON_QUEUES__RELEASE__CONCURRENCY", "3")
    s = load_settings()
    assert s.queues["agent-wakeups"] == defaults.queues["agent-wakeups"].model_copy(
        update={"retries": 7, "batch": 2}
    )
    # The old name of max_in_flight is still read.
    assert s.queues["release"] == defaults.queues["release"].model_copy(update={"max_in_flight": 3})
    others = {k: v for k, v in s.queues.items() if k not in {"agent-wakeups", "release"}}
    assert others == {k: defaults.queues[k] for k in others} and len(others) == 4


def test_a_queue_name_no_queue_can_have_is_refused_naming_its_variables_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RHUMBATRON_QUEUES__INTEGRATION__RETRIES", "5")
    monkeypatch.setenv("RHUMBATRON_QUEUES__AGENT_WAKEUPS_RETRY__RETRIES", "5")
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    line = str(refused.value)
    assert line.startswith(
        "invalid setting: RHUMBATRON_QUEUES__AGENT_WAKEUPS_RETRY__RETRIES='5': queue name "
        "'agent_wakeups_retry' (queue 'agent-wakeups-retry') is not allowed: a name neither "
        "ends in -retry nor holds -retry-: rhumbatron-<queue>-retry-<env> and "
        "rhumbatron-<queue>-retry-<N>s-<env> are the retry topics of <queue>"
    )
    assert "RHUMBATRON_QUEUES__INTEGRATION__RETRIES" not in line


def test_a_queue_of_your_own_comes_from_its_variables_over_the_new_queue_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = Settings()
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS__RETRIES", "5")
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS_EU__DEAD_LETTER", "payments")
    monkeypatch.setenv("RHUMBATRON_QUEUES__INDEXING__DEAD_LETTER", "payments-eu")
    s = load_settings()
    # Laid over the new queue's default: batch 10, 3 retries 30 s apart, to dead-letter.
    assert s.queues["payments"] == QueuePolicy(batch=10, retries=5, retry_delay_s=30)
    assert s.queues["payments-eu"].dead_letter == "payments"  # _ in a variable is - in a name
    assert s.queues["indexing"].dead_letter == "payments-eu"
    # The built-in queues first, in their order, then the settings' own, sorted.
    assert s.topology.queues == (*defaults.topology.queues, "payments", "payments-eu")
    assert s.topology.queue_names()[-2:] == [
        f"rhumbatron-payments-{s.env}",
        f"rhumbatron-payments-eu-{s.env}",
    ]
    assert _queues_but(s, "indexing").keys() - {"payments", "payments-eu"} == set(
        _queues_but(defaults, "indexing")
    )


def test_a_queues_two_spellings_are_one_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHUMBATRON_QUEUES", '{"payments-eu": {"retries": 1, "batch": 2}}')
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS_EU__RETRIES", "4")
    s = load_settings()
    assert (s.queues["payments-eu"].retries, s.queues["payments-eu"].batch) == (4, 2)
    assert "payments_eu" not in s.queues and s.topology.queues.count("payments-eu") == 1


def test_a_dead_letter_naming_no_queue_is_refused_naming_the_queue_and_the_value() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(queues={"payments": {"dead_letter": "payment"}})
    message = str(refused.value)
    assert "queue 'payments': dead_letter must be a queue (agent-wakeups, " in message
    assert "dead-letter, payments) or null, got 'payment'" in message
    with pytest.raises(ValidationError, match="dead_letter: queue name 'Pay' is not allowed"):
        QueuePolicy(batch=1, retries=0, retry_delay_s=0, dead_letter="Pay")
    assert (
        Settings(queues={"payments": {"dead_letter": None}}).queues["payments"].dead_letter is None
    )


def test_a_parents_queues_reach_a_child_process_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(queues={"integration": {"retries": 6}})
    assert parent.queues["integration"].retries == 6 and len(parent.queues) == 6
    _read_back(parent.as_environment(), monkeypatch)
    assert load_settings() == parent


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RHUMBATRON_BATCH_SIZE", "abc"),
        ("RHUMBATRON_REDIS_URL", "notaurl"),
        ("RHUMBATRON_QUEUES", "{not json"),
        ("RHUMBATRON_QUEUES__INTEGRATION__RETRIES", "-5"),
    ],
)
def test_the_command_line_refuses_a_bad_value_in_one_line_with_exit_2(
    variable: str, value: str
) -> None:
    s = make_settings()
    result = run_cli(s, "topology", env=subprocess_env(s, **{variable: value}), timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rhumbatron: invalid setting: {variable}=")


def test_the_claim_ttl_is_the_stream_retention_plus_the_margin() -> None:
    s = Settings(stream_retention_ms=3 * DAY_MS, claim_retention_margin_ms=DAY_MS // 2)
    assert s.claim_ttl_ms == 3 * DAY_MS + DAY_MS // 2
    assert Settings().claim_ttl_ms == 8 * DAY_MS


def test_the_router_outbox_is_the_environments_unless_set() -> None:
    state = Path("/srv/rh")
    assert router_outbox_path(Settings(env="blue", state_dir=state)) == Path(
        "/srv/rh/outbox-blue.sqlite"
    )
    assert router_outbox_path(Settings(env="blue", router_outbox_path="/x/{env}/o.db")) == Path(
        "/x/blue/o.db"
    )
    assert router_outbox_path(Settings(router_outbox_path="/x/o.db")) == Path("/x/o.db")


def _holds_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_holds_secret(f.annotation) for f in annotation.model_fields.values())
    return any(_holds_secret(a) for a in typing.get_args(annotation))


def _secret_fields(model: type[BaseModel]) -> list[str]:
    return [n for n, f in model.model_fields.items() if _holds_secret(f.annotation)]


def _read_back(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)


def test_every_secret_reaches_a_child_process_in_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    names = _secret_fields(Settings)
    # The ones known today; a new SecretStr setting is covered by the loop below on its own.
    assert {
        "classifier_key",
        "operator_token",
        "archive_s3_access_key",
        "archive_s3_secret_key",
    } <= set(names)
    # A queue's HTTP handler secrets live in fleet_workers, as one field of a queue's target.
    nested = {"fleet_workers"}
    maps = [
        n
        for n in names
        if typing.get_origin(Settings.model_fields[n].annotation) is dict and n not in nested
    ]
    secrets = {
        name: f"s3cret-{name}-é-" + "0" * 32 for name in names if name not in {*maps, *nested}
    }
    # Standard Webhooks secrets have a form of their own: whsec_ and base64.
    webhook = "whsec_" + base64.b64encode(b"s3cret-" + b"0" * 32).decode()
    secrets["http_handler_secrets"] = webhook
    named = {name: {"alice": f"s3cret-{name}-" + "0" * 32} for name in maps if name != "kafka"}
    parent = Settings(
        **secrets,  # type: ignore[arg-type]
        **named,  # type: ignore[arg-type]
        # The Kafka secrets are only taken with the login that uses them.
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="OAUTHBEARER",
        kafka_oauth_token_url="https://idp.example/token",
        kafka_oauth_client_id="rhumbatron",
        kafka={"client.rack": "s3cret-rack"},
        fleet_workers={"release": {"http": "https://svc.example/c", "http_secrets": webhook}},
    )
    environment = parent.as_environment()
    assert "**********" not in "".join(environment.values())
    _read_back(environment, monkeypatch)
    child = Settings()
    for name, value in secrets.items():
        got = getattr(child, name)
        assert got is not None and got.get_secret_value() == value, name
    assert child.kafka_config()["client.rack"] == "s3cret-rack"
    target = child.fleet_workers["release"]
    assert not isinstance(target, str) and target.http_secrets is not None
    assert target.http_secrets.get_secret_value() == webhook
    for name, tokens in named.items():
        assert {k: v.get_secret_value() for k, v in getattr(child, name).items()} == tokens
    assert child == parent


class _Credentials(BaseModel):
    user: str
    password: SecretStr


class _WithNestedSecrets(Settings):
    vault: _Credentials | None = None
    mirrors: list[_Credentials] = []


def test_a_secret_inside_a_nested_or_optional_setting_reaches_the_child_in_clear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert {"vault", "mirrors"} <= set(_secret_fields(_WithNestedSecrets))
    parent = _WithNestedSecrets(
        vault=_Credentials(user="u", password=SecretStr("pw-1")),
        mirrors=[_Credentials(user="m", password=SecretStr("pw-2"))],
    )
    _read_back(parent.as_environment(), monkeypatch)
    child = _WithNestedSecrets()
    assert child.vault is not None and child.vault.password.get_secret_value() == "pw-1"
    assert child.mirrors[0].password.get_secret_value() == "pw-2"
    assert child == parent


def test_an_unset_secret_stays_unset_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    scalars = [  # a map of secrets is empty when unset
        n
        for n in _secret_fields(Settings)
        if typing.get_origin(Settings.model_fields[n].annotation) is not dict
    ]
    environment = Settings().as_environment()
    assert not {f"RHUMBATRON_{n.upper()}" for n in scalars} & set(environment)
    _read_back(environment, monkeypatch)
    assert all(getattr(Settings(), n) is None for n in scalars)
    assert Settings().kafka == {} and all(
        getattr(Settings(), n) == {} for n in _secret_fields(Settings) if n not in scalars
    )


def test_the_state_dir_does_not_depend_on_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RHUMBATRON_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    here = load_settings()
    monkeypatch.chdir(tmp_path)
    there = load_settings()
    assert here.state_dir == there.state_dir == tmp_path / "home/.local/state/rhumbatron"
    for s in (here, there):
        assert s.in_state_dir(s.archive_dir) == here.state_dir / "archive"
        assert router_outbox_path(s) == here.state_dir / "outbox-dev.sqlite"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert load_settings().state_dir == tmp_path / "xdg/rhumbatron"


def test_a_relative_state_dir_is_made_absolute_where_it_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", "state")
    settings = load_settings()
    assert settings.state_dir == tmp_path / "state"
    # A child process started elsewhere reads the same, absolute, directory.
    assert settings.as_environment()["RHUMBATRON_STATE_DIR"] == str(tmp_path / "state")
    assert settings.in_state_dir("/abs/archive") == Path("/abs/archive")


def test_the_progress_interval_keeps_its_old_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHUMBATRON_OUTBOX_PROGRESS_INTERVAL_S", "2")
    assert load_settings().progress_interval_s == 2
    monkeypatch.setenv("RHUMBATRON_PROGRESS_INTERVAL_S", "-1")
    with pytest.raises(ConfigurationError, match="RHUMBATRON_PROGRESS_INTERVAL_S='-1'"):
        load_settings()


PG_URL = "postgresql://app:hunter2-pg@db.internal:5432/orders"
PG_SHOWN = "postgresql://app:****@db.internal:5432/orders"


def test_outbox_urls_are_shown_without_their_password() -> None:
    s = Settings(router_outbox_path=PG_URL, operator_outboxes=[PG_URL, "b.sqlite"])
    for text in (repr(s), str(s)):
        assert "hunter2-pg" not in text and PG_SHOWN in text
    values = shown(s)
    assert values["router_outbox_path"] == PG_SHOWN
    assert values["operator_outboxes"] == [PG_SHOWN, "b.sqlite"]
    assert s.as_environment()["RHUMBATRON_ROUTER_OUTBOX_PATH"] == PG_URL  # children get it


def test_config_show_never_shows_an_outbox_password() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(
        RHUMBATRON_ROUTER_OUTBOX_PATH=PG_URL, RHUMBATRON_OPERATOR_OUTBOXES=json.dumps([PG_URL])
    )
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "router.cli", "config", "show", *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "hunter2-pg" not in result.stdout + result.stderr
        assert PG_SHOWN in result.stdout


def test_the_postgresql_outbox_options_come_from_the_settings() -> None:
    from router.wiring.outbox import postgres_options

    options = postgres_options(
        Settings(
            outbox_postgres_pool_size=3,
            outbox_postgres_keepalive_s=4.5,
            outbox_postgres_listen_tick_s=0.1,
        )
    )
    assert (options.pool_size, options.keepalive_s, options.listen_tick_s) == (3, 4.5, 0.1)
    defaults = postgres_options(Settings())
    assert (defaults.pool_size, defaults.keepalive_s, defaults.listen_tick_s) == (8, 10.0, 0.25)
