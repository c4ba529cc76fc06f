"""`rhumbatron acls`: what it prints is what docs/security.md shows, and its options."""

from __future__ import annotations

import argparse
import re
import shlex

import orjson
import pytest

from router.cli import acl_commands
from router.settings import Settings
from router.wiring.acls import PUBLISHER
from tests.support.environment import ROOT, run_cli

DOC = ROOT / "docs" / "security.md"
# <!-- generated: RHUMBATRON_STREAMS=2 rhumbatron acls --env prod … --> before each example.
_MARKER = re.compile(r"<!-- generated: (.+?) -->\n```[a-z]*\n(.*?)```", re.DOTALL)


def _cli(s: Settings, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser()
    acl_commands.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    assert args.handler(s, args) == 0
    return capsys.readouterr().out


def test_the_documents_examples_are_what_the_command_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = DOC.read_text()
    examples = _MARKER.findall(text)
    assert len(examples) >= 2, "docs/security.md lost its generated examples"
    for command, shown in examples:
        words = shlex.split(command)
        assignments = dict(w.split("=", 1) for w in words if "=" in w and w[0].isupper())
        argv = [w for w in words if w not in {f"{k}={v}" for k, v in assignments.items()}]
        assert argv[0] == "rhumbatron", command
        overrides = {k.removeprefix("RHUMBATRON_").lower(): v for k, v in assignments.items()}
        s = Settings(**overrides)  # type: ignore[arg-type]
        printed = _cli(s, argv[1:], capsys)
        assert shown == printed, (
            f"docs/security.md's example of `{command}` is not what it prints now; paste:\n"
            + printed
        )


def test_the_command_line_prints_one_role_as_json() -> None:
    s = Settings(env="t" + "0" * 10)
    result = run_cli(s, "acls", "--role", PUBLISHER, "--json", check=True)
    printed = orjson.loads(result.stdout)
    assert [r["role"] for r in printed["roles"]] == [PUBLISHER]
    assert printed["roles"][0]["principal"] == f"User:rhumbatron-publisher-{s.env}"
    refused = run_cli(s, "acls", "--principal", "User:someone")
    assert refused.returncode == 2 and "--role" in refused.stderr
