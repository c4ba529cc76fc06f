"""What main() does with an error that escapes a command: Redis lost mid-run (the loops take
redis-py's errors as they are) is one ``rhumbatron: …`` line and exit 1, never a traceback."""

from __future__ import annotations

import argparse

import pytest
import redis

from router.cli import subscription_commands
from router.cli.main import main
from router.settings import Settings


def _loses_redis(settings: Settings, args: argparse.Namespace) -> int:
    raise redis.ConnectionError("Connection closed by server.")


def test_redis_lost_mid_run_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subscription_commands, "consume", _loses_redis)
    assert main(["consume", "--subscription", "ledger"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "rhumbatron: Redis failed while running: ConnectionError: Connection closed by server.; "
        "what was not committed is done again on the next start"
    ]
