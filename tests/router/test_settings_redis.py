"""The Redis login and TLS settings, and the URLs shown without their password."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.redis_conn import connect
from router.settings import Settings
from streams.errors import Unreachable
from streams.urls import masked
from tests.support.infra import _pick_port


def test_repr_and_str_show_the_urls_without_their_password() -> None:
    s = Settings(redis_url="redis://u:hunter2@h:1/0", classifier_url="https://k:hunter2@c.io/x")
    for shown in (repr(s), str(s)):
        assert "hunter2" not in shown
        assert "redis://u:****@h:1/0" in shown
        assert "https://k:****@c.io/x" in shown


def test_children_still_get_the_urls_and_the_password_in_clear() -> None:
    s = Settings(redis_url="redis://u:hunter2@h:1/0", redis_password="pw2")
    env = s.as_environment()
    assert env["RHUMBATRON_REDIS_URL"] == "redis://u:hunter2@h:1/0"
    assert env["RHUMBATRON_REDIS_PASSWORD"] == "pw2"


def test_masked_keeps_user_host_and_path() -> None:
    assert masked("redis://u:p%40ss@h:6379/2") == "redis://u:****@h:6379/2"
    assert masked("redis://:pw@h/0") == "redis://:****@h/0"
    assert masked("redis://h:6379/0") == "redis://h:6379/0"
    assert masked("redis://u:pw@[::1/0") == "redis://u:****@[::1/0"  # unparsable still masked


def test_unreachable_names_the_address_not_the_password() -> None:
    port = _pick_port()  # nobody listens there
    with pytest.raises(Unreachable) as caught:
        connect(f"redis://u:hunter2@127.0.0.1:{port}/0", timeout=1)
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_refused_url_is_shown_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.settings import load_settings
    from streams.errors import ConfigurationError

    monkeypatch.setenv("RHUMBATRON_REDIS_URL", "http://u:hunter2@h:1/0")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "RHUMBATRON_REDIS_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_tls_files_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        Settings(redis_url="rediss://h:1/0", redis_ssl_ca_file=str(tmp_path / "absent.pem"))


def test_tls_files_with_a_plain_url_are_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(ValueError, match="not rediss://"):
        Settings(redis_url="redis://u:hunter2@h:1/0", redis_ssl_ca_file=str(ca))


def test_a_key_without_its_certificate_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("x")
    with pytest.raises(ValueError, match="without RHUMBATRON_REDIS_SSL_CERT_FILE"):
        Settings(redis_url="rediss://h:1/0", redis_ssl_key_file=str(key))
