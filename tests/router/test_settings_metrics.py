"""The settings of a process's metrics and health endpoint: a wrong value is refused in one line
naming the variable, the value and what is expected."""

from __future__ import annotations

import pytest

from router.settings import Settings, load_settings
from streams.errors import ConfigurationError


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("RHUMBATRON_METRICS_PORT", "-1", "greater than or equal to 0"),
        ("RHUMBATRON_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("RHUMBATRON_METRICS_PORT", "x", "valid integer"),
        ("RHUMBATRON_METRICS_HOST", "", "at least 1 character"),
        ("RHUMBATRON_METRICS_HOST", "http://0.0.0.0", "should match pattern"),
        ("RHUMBATRON_METRICS_HOST", "a host", "should match pattern"),
        ("RHUMBATRON_HEALTH_STALE_S", "0", "greater than 0"),
        ("RHUMBATRON_HEALTH_STALE_S", "-5", "greater than 0"),
        ("RHUMBATRON_HEALTH_STALE_S", "soon", "valid number"),
    ],
)
def test_a_wrong_endpoint_setting_is_one_line_naming_the_variable(
    variable: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings()
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"invalid setting: {variable}=")
    assert says in line and (value in line or repr(value) in line)


def test_the_endpoint_is_off_by_default_and_takes_any_host_or_ip() -> None:
    s = Settings()
    assert (s.metrics_port, s.metrics_host, s.health_stale_s) == (None, "127.0.0.1", 60.0)
    for host in ("0.0.0.0", "::1", "metrics.internal", "localhost"):
        assert Settings(metrics_host=host, metrics_port=0).metrics_host == host
