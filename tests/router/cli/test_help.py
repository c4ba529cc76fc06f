"""The command line explains itself: the whole parser, walked subcommand by subcommand, has help
on every option and positional, no raw markup in what it prints, one spelling per option, and
``--json`` on every command that reads."""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Iterator

import pytest

from router.cli.main import build_parser

# Every command that only reads, by its path under `rhumbatron`.
READ_COMMANDS = {
    ("status",),
    ("topology",),
    ("view",),
    ("feed",),
    ("projects", "list"),
    ("dead-letters", "list"),
    ("dead-letters", "show"),
    ("subscription", "progress"),
    ("ledger",),
    ("worker-stats",),
    ("outbox", "stats"),
    ("analytics",),
    ("analytics-points",),
    ("archive", "count"),
    ("archive", "verify"),
    ("schema",),
    ("validate",),
}

# reStructuredText that reads as noise in a terminal: ``literals`` and :roles:.
MARKUP = re.compile(r"``|:[a-z]+:`")


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    return dict(walk(build_parser()))


def documented(action: argparse.Action) -> bool:
    return not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))


def test_every_option_and_positional_has_help() -> None:
    missing = [
        f"{' '.join(path) or 'rhumbatron'}: {'/'.join(a.option_strings) or a.dest}"
        for path, parser in commands().items()
        for a in parser._actions
        if documented(a) and not (a.help or "").strip()
    ]
    assert missing == []


def test_every_subcommand_has_help() -> None:
    # argparse keeps a help line only for the subcommands given one, so compare the names.
    missing = [
        " ".join((*path, name))
        for path, parser in commands().items()
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
        if name not in {c.dest for c in action._choices_actions if (c.help or "").strip()}
    ]
    assert missing == []


def test_no_raw_markup_in_help_or_descriptions() -> None:
    texts: list[tuple[str, str]] = []
    for path, parser in commands().items():
        where = " ".join(path) or "rhumbatron"
        texts.append((f"{where} (description)", parser.description or ""))
        texts.append((f"{where} (epilog)", parser.epilog or ""))
        for action in parser._actions:
            texts.append((f"{where} {'/'.join(action.option_strings)}", str(action.help or "")))
            for choice in getattr(action, "_choices_actions", []):
                texts.append((f"{where} {choice.dest}", str(choice.help or "")))
    assert [(where, text) for where, text in texts if MARKUP.search(text)] == []


def test_one_spelling_per_option() -> None:
    spellings: dict[str, set[str]] = defaultdict(set)
    for parser in commands().values():
        for action in parser._actions:
            for option in action.option_strings:
                spellings[option.lstrip("-").replace("_", "-").lower()].add(option)
    assert {name: sorted(s) for name, s in spellings.items() if len(s) > 1} == {}


def test_every_option_is_spelt_with_dashes() -> None:
    underscored = {
        option
        for parser in commands().values()
        for action in parser._actions
        for option in action.option_strings
        if "_" in option
    }
    assert underscored == set()


def test_the_read_commands_exist() -> None:
    assert READ_COMMANDS - set(commands()) == set()


@pytest.mark.parametrize("path", sorted(READ_COMMANDS), ids=" ".join)
def test_every_read_command_accepts_json(path: tuple[str, ...]) -> None:
    parser = commands()[path]
    assert "--json" in parser._option_string_actions


def test_consume_help_lists_the_subscriptions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["consume", "--help"])
    assert stopped.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in (
        "project-view-projector",
        "causal-router",
        "audit-archiver",
        "analytics-projector",
        "ledger",
    ):
        assert name in out


def test_produce_help_says_what_each_drill_record_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["produce", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "fail: an event the ledger subscription fails on every time" in out
    assert "garbage: bytes that are not an envelope" in out and "poison record" in out
