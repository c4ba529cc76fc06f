"""``rhumbatron worker``, ``command send``, ``dead-letters list`` and ``acls``: what they refuse
before they start, the queues and roles of the settings among them."""

from __future__ import annotations

import orjson
import pytest

from router.cli.main import main


def test_the_worker_command_refuses_an_unknown_handler(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--queue", "agent-wakeups", "--handler", "nope"]) == 2
    err = capsys.readouterr().err
    assert "handler 'nope': no handler of that name is installed" in err
    assert "drill, flaky, ok" in err and len(err.strip().splitlines()) == 1


def test_a_queues_own_http_secrets_are_used_for_its_url() -> None:
    import argparse

    from router.cli.worker_commands import queue_secrets
    from router.settings import Settings

    own = "whsec_" + "A" * 43 + "="
    s = Settings(fleet_workers={"release": {"http": "https://a.example/c", "http_secrets": own}})
    for queue, url, want in (
        ("release", "https://a.example/c", own),
        ("release", "https://other.example/c", None),  # another URL: the global secrets
        ("indexing", "https://a.example/c", None),
    ):
        got = queue_secrets(s, argparse.Namespace(queue=queue, http=url))
        assert (got.get_secret_value() if got else None) == want


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--queue", "paymnts", "--handler", "ok"],
        ["command", "send", "--type", "index.build", "--project", "p1", "--queue", "paymnts"],
        ["dead-letters", "list", "--queue", "paymnts"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_queue_the_settings_do_not_have_is_one_line_naming_those_they_do(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS__RETRIES", "5")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rhumbatron: --queue: unknown queue 'paymnts'; known: agent-wakeups, ")
    assert "dead-letter, payments (a queue of your own is [queues.<name>]" in err
    assert len(err.strip().splitlines()) == 1


def test_the_help_of_queue_says_where_queues_come_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--queue QUEUE the queue: agent-wakeups, integration, indexing" in out
    assert "or a queue of the settings' own ([queues.<name>], docs/queues.md)" in out


def test_acls_names_the_role_of_a_queue_of_your_own(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_QUEUES__PAYMENTS__RETRIES", "5")
    assert main(["acls", "--env", "prod", "--role", "worker-payments", "--json"]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert [r["role"] for r in printed["roles"]] == ["worker-payments"]
    monkeypatch.delenv("RHUMBATRON_QUEUES__PAYMENTS__RETRIES")
    assert main(["acls", "--role", "worker-payments"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rhumbatron: --role: unknown role 'worker-payments'; known: ")
