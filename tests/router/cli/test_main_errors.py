"""What main() does with an error that escapes a command: Redis lost mid-run (the loops take
redis-py's errors as they are) is one ``rhumbatron: …`` line and exit 1, never a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

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


def test_an_argument_that_is_not_utf8_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bytes that were not UTF-8 (Python hands them over as surrogates) failed wherever a command
    first encoded them: the hash of a project, a feed's transactional id, a dead letter's key."""
    for argv in (["feed", "\udcff\udcfe"], ["dead-letters", "show", "\udcff\udcfe"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"rhumbatron: error: argument {len(argv)} is not UTF-8 text: b'\\xff\\xfe'"


def test_an_outbox_path_the_file_system_refuses_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["outbox", "stats", "--outbox", "x" * 3000]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rhumbatron: cannot open the outbox at xxx"), err
    assert err[0].endswith(": File name too long")


def _opens_a_directory(settings: Settings, args: argparse.Namespace) -> int:
    open("/", "rb")  # noqa: SIM115  (raises at once)
    return 0


def test_a_file_the_system_refuses_anywhere_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subscription_commands, "consume", _opens_a_directory)
    assert main(["consume", "--subscription", "ledger"]) == 2
    assert capsys.readouterr().err.splitlines() == ["rhumbatron: /: Is a directory"]
