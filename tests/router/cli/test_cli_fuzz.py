"""Every command of ``rhumbatron`` given arbitrary argument lists: its own options with values of
every kind (empty, negative, NaN, huge, not UTF-8, control characters, option-like), options of
other commands, stray words. None ends in a traceback: argparse refuses with exit 2 and a line
``rhumbatron …: error: …``, or the command runs.

Parsing is tested for every command (no servers). Running is tested for the commands that end
on their own — the read commands, the operator's moves, the outbox's, the pump's — against a
test environment on the shared servers, in this process: each exits 0, or non-zero with one line
``rhumbatron: …``. The long-running ones (consume, publish without --until-empty, serve, worker,
dead-letter-consumer, analytics-rollup, feed-server, demo, bench, produce) are parsed only.

``RHUMBATRON_PROPERTY_EXAMPLES`` sets the examples in `make test`; the ``slow`` variants run
``RHUMBATRON_SOAK_EXAMPLES``.
"""

from __future__ import annotations

import argparse
import io
import os
import re
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from router.cli.main import build_parser, main
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from tests.router.cli.test_help import commands
from tests.support.environment import cleanup_environment, make_settings

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30"))
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "5000"))
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


def _subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


PARSER = build_parser()  # parsing leaves it as it was: one serves every example
LEAVES = {path: parser for path, parser in commands().items() if path and not _subcommands(parser)}
# Commands that run until stopped (or for long): parsed, not run.
LONG_RUNNING = {
    ("consume",),
    ("publish",),
    ("serve",),
    ("worker",),
    ("dead-letter-consumer",),
    ("analytics-rollup",),
    ("feed-server",),
    ("demo",),
    ("bench",),
    ("produce",),
}
RUN = sorted(path for path in LEAVES if path not in LONG_RUNNING)

# Values an option or positional may be given.
WORDS = [
    "",
    " ",
    "-",
    "--",
    "-1",
    "0",
    "1",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "99999999999999999999999999",
    "0x10",
    "1_000",
    "\udcff\udcfe",  # bytes that were not UTF-8, as Python hands argv over
    "a\x01b",
    "é",
    "x" * 3000,
    "evt_" + "0" * 32,
    "dl_" + "0" * 24,
    "rhumbatron_events_00_x",
    "project-view-projector",
    "ledger",
    "open",
    "7d",
    "0s",
    "2026-01-01T00:00:00Z",
    "../../etc/passwd",
    "--json",
    "--help-not",
]
values = st.one_of(st.sampled_from(WORDS), st.text(max_size=12).filter(lambda t: "\x00" not in t))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(
            a, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
        )
    ]


@st.composite
def argv(draw: st.DrawFn, paths: list[tuple[str, ...]]) -> list[str]:
    """A command, then each of its required options and positionals and some others, with drawn
    values, and now and then a stray word."""
    path = draw(st.sampled_from(paths))
    parser = LEAVES[path]
    out = list(path)
    acts = options(parser)
    flags = [a for a in acts if a.option_strings]
    chosen = [a for a in flags if a.required]
    chosen += draw(st.lists(st.sampled_from(flags), max_size=4)) if flags else []
    for action in draw(st.permutations(chosen)):
        if draw(st.integers(0, 9)) == 0:
            out.append(draw(values))
        out.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            out.append(draw(value_for(action)))
    for action in (a for a in acts if not a.option_strings):  # positionals, in order
        if action.nargs in ("?", "*") and draw(st.booleans()):
            continue
        out.append(draw(value_for(action)))
    return out


def value_for(action: argparse.Action) -> st.SearchStrategy[str]:
    if action.choices is not None:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), values)
    if action.type is not None and action.type is not str:
        return st.one_of(st.sampled_from(["0", "1", "7", "3600", "99999999999"]), values)
    return values


def parsed(args: list[str]) -> tuple[argparse.Namespace | None, int | None, str]:
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            namespace = PARSER.parse_args(args)
    except SystemExit as exc:
        return None, exc.code if isinstance(exc.code, int) else 1, err.getvalue()
    return namespace, None, err.getvalue()


def check_parse(args: list[str]) -> None:
    note(f"argv: {args!r}")
    namespace, code, err = parsed(args)
    if namespace is not None:
        return
    assert code == 2, (code, err)
    assert "Traceback" not in err
    # After the usage, the error's line (argparse echoes a word as it came, line breaks included).
    assert re.search(r"^rhumbatron[^\n]*: error: ", err, re.MULTILINE), err


@settings(max_examples=EXAMPLES * 10, deadline=None, suppress_health_check=HEALTH)
@given(argv(sorted(LEAVES)))
def test_every_command_parses_arbitrary_arguments_or_refuses_them_in_one_line(
    args: list[str],
) -> None:
    check_parse(args)


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=HEALTH)
@given(st.lists(values, max_size=6))
def test_arbitrary_words_are_parsed_or_refused(args: list[str]) -> None:
    check_parse(args)


@pytest.mark.slow
@settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
@given(argv(sorted(LEAVES)))
def test_parsing_soak(args: list[str]) -> None:
    check_parse(args)


# -- running the commands that end on their own --------------------------------------------------
@pytest.fixture(scope="module")
def env() -> Iterator[Settings]:
    s = make_settings()
    provision_environment(s)
    yield s
    cleanup_environment(s)


def run(s: Settings, args: list[str], folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    note(f"argv: {args!r}")
    _, code, _ = parsed(args)
    if code is not None:
        event("refused by argparse")
        return  # the parse test's case
    event(f"ran {args[0]}")
    with monkeypatch.context() as m:
        for name in list(os.environ):
            if name.startswith("RHUMBATRON_") and not name.startswith("RHUMBATRON_TEST_"):
                m.delenv(name)
        for name, value in s.as_environment().items():
            m.setenv(name, value)
        m.chdir(folder)  # a relative --outbox or file lands in the test's folder
        err = io.StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                code = main(args)
        except SystemExit as exc:  # --help of a subcommand after all, and the like
            code = exc.code if isinstance(exc.code, int) else 1
    said = err.getvalue()
    assert "Traceback" not in said, said
    if code != 0:
        last = said.strip().split("\n")[-1] if said.strip() else ""
        assert last.startswith("rhumbatron"), (code, said[-2000:])


def _safe(args: list[str]) -> bool:
    # An absolute path the fuzz made up must not reach the machine's own files.
    return not any(a.startswith("/") or a.startswith("..") for a in args[1:])


@pytest.mark.integration
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
@given(argv(RUN).filter(_safe))
def test_the_commands_that_end_run_or_refuse_in_one_line(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    run(env, args, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.integration
@settings(max_examples=SOAK_EXAMPLES // 10, deadline=None, suppress_health_check=HEALTH)
@given(argv(RUN).filter(_safe))
def test_running_soak(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    run(env, args, tmp_path, monkeypatch)
