"""The example's own tests: its handlers called as the worker calls them, through
rhumbatron.testing (no broker needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acme_handlers.integration import handlers
from acme_handlers.wakeups import wake

from rhumbatron import Fail, Retry
from rhumbatron.testing import command, context, handle


@pytest.fixture(autouse=True)
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "journal.ndjson"
    monkeypatch.setenv("ACME_JOURNAL", str(path))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dispatch_is_done_at_once(journal: Path) -> None:
    c = command("change.dispatch", command_id="cmd_d1")
    handle(handlers, c, context(c, queue="integration"))
    assert lines(journal) == [
        {"attempt": 1, "command": "cmd_d1", "queue": "integration", "type": "change.dispatch"}
    ]


def test_a_candidate_waits_for_its_change_then_is_created(journal: Path) -> None:
    c = command("candidate.create", command_id="cmd_c1", payload={"wait_first": True})
    with pytest.raises(Retry) as retry:
        handle(handlers, c, context(c, queue="integration", attempt=1))
    assert retry.value.delay_s == 1
    handle(handlers, c, context(c, queue="integration", attempt=2))
    assert [line["attempt"] for line in lines(journal)] == [2]


def test_an_impossible_candidate_fails_for_good() -> None:
    c = command("candidate.create", payload={"impossible": True})
    with pytest.raises(Fail, match="cannot be composed"):
        handle(handlers, c, context(c, queue="integration"))


def test_a_command_type_without_a_handler_fails() -> None:
    c = command("release.start")
    with pytest.raises(Fail, match=r"no_handler: release\.start"):
        handle(handlers, c, context(c, queue="integration"))


def test_the_async_wake_handler(journal: Path) -> None:
    c = command("agent.wake", command_id="cmd_w1")
    handle(wake, c, context(c, queue="agent-wakeups"))
    assert lines(journal)[0]["command"] == "cmd_w1"
