"""The optional config file (RHUMBATRON_CONFIG or --config): TOML keyed by the settings' names,
below the environment; read strictly; and `config show`, which says where each value came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.settings import CONFIG_VARIABLE, Settings, load_settings, sources
from streams.errors import ConfigurationError
from tests.support.environment import ROOT

FILE = """
env = "filed"
batch_size = 250
operator_token = "file-token-000000000000000000000000000"
[queues.integration]
retries = 6
[kafka]
"socket.keepalive.enable" = true
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "rhumbatron.toml"
    path.write_text(FILE)
    for name in list(os.environ):
        if name.startswith("RHUMBATRON_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(CONFIG_VARIABLE, str(path))
    return path


def test_the_file_sets_what_the_environment_does_not(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RHUMBATRON_BATCH_SIZE", "7")
    monkeypatch.setenv("RHUMBATRON_QUEUES__INTEGRATION__BATCH", "3")
    settings = load_settings()
    assert settings.env == "filed"
    assert settings.batch_size == 7  # the environment wins
    # A queue's fields merge across both, over the defaults.
    integration = settings.queues["integration"]
    assert (integration.retries, integration.batch, integration.retry_delay_s) == (6, 3, 30)
    assert settings.queues["agent-wakeups"] == Settings().queues["agent-wakeups"]
    assert settings.kafka_config()["socket.keepalive.enable"] == "true"
    origin = sources(settings)
    assert origin["env"] == str(config)
    assert origin["batch_size"] == f"RHUMBATRON_BATCH_SIZE over {config}"
    assert origin["queues"] == f"RHUMBATRON_QUEUES__INTEGRATION__BATCH over {config}"
    assert origin["partitions"] == "default"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("batch_sise = 3", "no such setting: 'batch_sise' (did you mean 'batch_size'?)"),
        ("batch_size = ", "not a readable TOML file: Invalid value"),
        ('batch_size = "many"', "(at batch_size)='many': Input should be a valid integer"),
        ("session_timeout_ms = -5", "(at session_timeout_ms)=-5: Input should be greater than"),
        ("[queues.integration-retry]\nretries = 1", "queue name 'integration-retry' is not"),
        ('[queues.indexing]\ndead_letter = "integraton"', "dead_letter must be a queue"),
    ],
)
def test_a_wrong_file_is_one_line_naming_it(config: Path, text: str, expected: str) -> None:
    config.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert str(config) in message or "integraton" in message


def test_a_queue_of_your_own_is_a_table_of_the_file(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config.write_text(
        FILE + "[queues.payments]\nretries = 5\nmax_in_flight = 4\n"
        '[queues.refunds]\ndead_letter = "payments"\n'
    )
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS__BATCH", "2")
    settings = load_settings()
    payments = settings.queues["payments"]
    assert (payments.batch, payments.retries, payments.retry_delay_s) == (2, 5, 30)
    assert (payments.max_in_flight, payments.dead_letter) == (4, "dead-letter")
    assert settings.queues["refunds"].dead_letter == "payments"
    assert settings.topology.queues[-2:] == ("payments", "refunds")
    assert settings.queues["integration"].retries == 6  # the file's other tables still count


def test_a_missing_file_is_refused(config: Path) -> None:
    config.unlink()
    with pytest.raises(ConfigurationError, match=f"{CONFIG_VARIABLE}={config}: no such file"):
        load_settings()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    return {**env, **extra}


def test_config_show_masks_secrets_and_names_each_source(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FILE)
    env = _clean_env(RHUMBATRON_REDIS_URL="redis://ops:hunter2@cache.internal:6380/1")
    result = _cli("--config", str(path), "config", "show", "--json", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["config_file"] == str(path)
    values = shown["settings"]
    assert values["env"] == {"value": "filed", "source": str(path)}
    assert values["redis_url"] == {
        "value": "redis://ops:****@cache.internal:6380/1",
        "source": "RHUMBATRON_REDIS_URL",
    }
    assert values["operator_token"]["value"] == "**********"
    assert values["partitions"]["source"] == "default"
    for secret in ("hunter2", "file-token-0000"):
        assert secret not in result.stdout and secret not in result.stderr
    table = _cli("--config", str(path), "config", "show", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"config file: {path}"
    assert lines[1].split() == ["SETTING", "VALUE", "SOURCE"]
    assert any(line.split() == ["batch_size", "250", str(path)] for line in lines)


def test_a_bad_config_file_exits_2_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("partitons = 4\n")
    result = _cli("--config", str(path), "config", "show", env=_clean_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"rhumbatron: {CONFIG_VARIABLE}={path}: no such setting: 'partitons' (did you mean "
        "'partitions'?); its keys are the settings' names (rhumbatron config show lists them)"
    ]
