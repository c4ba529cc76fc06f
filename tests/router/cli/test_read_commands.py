"""What the read commands print: ``--version``; a table with headers (or an empty-state line)
without ``--json``; and a usage error naming the option for a negative count."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from consumers.redis_conn import connect
from consumers.runtime.layout import LAYOUT
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.types import TP
from router.cli.main import main
from router.settings import Settings
from streams.clock import SystemClock
from tests.support.environment import cleanup_environment, make_settings


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    s = make_settings()
    for name, value in s.as_environment().items():
        monkeypatch.setenv(name, value)
    yield s
    cleanup_environment(s)


def test_version_prints_the_installed_version_and_its_state_layout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    installed = importlib.metadata.version("rhumbatron")
    assert capsys.readouterr().out == f"rhumbatron {installed} (state layout {LAYOUT})\n"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["consume", "--subscription", "ledger", "--until-idle", "-1"], "--until-idle"),
        (
            ["worker", "--queue", "agent-wakeups", "--handler", "ok", "--until-idle", "-5"],
            "--until-idle",
        ),
        (["dead-letter-consumer", "--until-idle", "nan"], "--until-idle"),
        (["produce", "--projects", "0", "--events", "10"], "--projects"),
        (["produce", "--projects", "2", "--events", "-1"], "--events"),
        (["serve", "--port", "-80"], "--port"),
        (["dead-letters", "list", "--limit", "0"], "--limit"),
        (
            ["subscription", "skip-through", "--subscription", "ledger", "--topic", "t"]
            + ["--partition", "0", "--offset", "-3", "--reason", "r"],
            "--offset",
        ),
    ],
)
def test_a_negative_count_is_a_usage_error_naming_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    given = argv[argv.index(option) + 1]
    assert err[-1] == (
        f"rhumbatron {' '.join(a for a in argv[:2] if not a.startswith('-'))}: error: argument "
        f"{option}: must be a {'number' if option == '--until-idle' else 'whole number'} "
        f">= {1 if option in ('--projects', '--limit') else 0}, got {given!r}"
    )
    assert [line for line in err if "error" in line] == [err[-1]]


def _record(s: Settings, project: str, slots: list[int], counts: dict[str, int]) -> None:
    client = connect(s.redis_url, timeout=5)
    store = RedisStore(client, env=s.env, slug="ledger", clock=SystemClock(), claim_ttl_ms=60_000)
    tp = TP(s.topology.stream_names()[0], 0)
    client.rpush(store.key(tp, f"ledger:project:{project}"), *slots)
    client.hset(store.key(tp, "ledger:counts"), mapping=counts)  # type: ignore[arg-type]
    client.close()


def test_ledger_prints_a_table_with_headers(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    _record(env, "alpha", [1, 2, 3, 5], {"e1": 1, "e2": 2})
    _record(env, "beta", [1], {"e3": 1})
    assert main(["ledger"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "PROJECT  APPLIED  SLOTS",
        "alpha          4  1-3, 5",
        "beta           1  1",
        "5 events applied over 2 projects; 1 applied more than once",
    ]
    assert main(["ledger", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["projects"] == {"alpha": [1, 2, 3, 5], "beta": [1]}


def test_ledger_says_when_it_is_empty(env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger"]) == 0
    assert capsys.readouterr().out == (
        f"no ledger entries: the ledger subscription applied nothing in '{env.env}'\n"
    )


def test_dead_letters_list_says_when_there_are_none(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dead-letters", "list"]) == 0
    assert capsys.readouterr().out == "no dead letters\n"
    assert main(["dead-letters", "list", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == []


def test_outbox_stats_says_when_no_row_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "o.db"
    assert main(["produce", "--outbox", str(path), "--projects", "2", "--events", "4"]) == 0
    capsys.readouterr()
    assert main(["outbox", "stats", "--outbox", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"outbox {path}" and lines[-1] == "  no failed rows"


def test_archive_count_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_ENV", "tcli")
    monkeypatch.setenv("RHUMBATRON_ARCHIVE_DIR", str(tmp_path))
    assert main(["archive", "count", "--day", "2026-01-31", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"parts": 0, "day": "2026-01-31"}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["produce"], "produce needs --projects N and --events M (or --drill fail|garbage"),
        (["produce", "--projects", "3"], "produce needs --projects N and --events M"),
        (
            ["produce", "--drill", "fail", "--projects", "3"],
            "produce --drill writes one record straight to a stream: it takes neither",
        ),
        (["consume", "--subscription", "ledgr"], "unknown subscription 'ledgr'; known: "),
    ],
)
def test_produce_and_consume_refuse_what_does_not_go_together_before_any_broker_call(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RHUMBATRON_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing listens there
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rhumbatron: {says}"), line
