"""The settings model: wrong limits are refused naming the setting, values derived in one place,
and every secret reaching a child process in clear through ``as_environment``."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from router.settings import DAY_MS, Settings
from router.wiring.causal import router_outbox_path


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("flush_timeout_s", 0, "greater than 0"),
        ("produce_flush_timeout_s", -1.0, "greater than 0"),
        ("demo_idle_s", 0, "greater than 0"),
        ("demo_max_wait_s", 0, "greater than 0"),
        ("group_join_timeout_s", 0, "greater than 0"),
        ("batch_failure_ttl_s", 59, "greater than or equal to 60"),
        ("claim_retention_margin_ms", -1, "greater than or equal to 0"),
        ("router_outbox_path", "", "at least 1 character"),
        ("command_error_max_bytes", 63, "greater than or equal to 64"),
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


def test_the_claim_ttl_is_the_stream_retention_plus_the_margin() -> None:
    s = Settings(stream_retention_ms=3 * DAY_MS, claim_retention_margin_ms=DAY_MS // 2)
    assert s.claim_ttl_ms == 3 * DAY_MS + DAY_MS // 2
    assert Settings().claim_ttl_ms == 8 * DAY_MS


def test_the_router_outbox_is_the_environments_unless_set() -> None:
    assert router_outbox_path(Settings(env="blue")) == Path(".local/outbox-blue.sqlite")
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
    secrets = {name: f"s3cret-{name}-é" for name in names}
    parent = Settings(**secrets)  # type: ignore[arg-type]
    environment = parent.as_environment()
    assert "**********" not in "".join(environment.values())
    _read_back(environment, monkeypatch)
    child = Settings()
    for name, value in secrets.items():
        got = getattr(child, name)
        assert got is not None and got.get_secret_value() == value, name
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
    environment = Settings().as_environment()
    assert not {f"RHUMBATRON_{n.upper()}" for n in _secret_fields(Settings)} & set(environment)
    _read_back(environment, monkeypatch)
    assert all(getattr(Settings(), n) is None for n in _secret_fields(Settings))
