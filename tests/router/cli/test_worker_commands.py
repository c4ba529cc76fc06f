"""``rhumbatron worker``: what it refuses before it starts."""

from __future__ import annotations

import pytest

from router.cli.main import main


def test_the_worker_command_refuses_an_unknown_handler(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--queue", "agent-wakeups", "--handler", "nope"]) == 2
    err = capsys.readouterr().err
    assert "handler 'nope': no handler of that name is installed" in err
    assert "drill, flaky, ok" in err and len(err.strip().splitlines()) == 1
