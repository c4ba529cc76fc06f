"""``rhumbatron worker``: what it refuses before it starts."""

from __future__ import annotations

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
