"""``rhumbatron dead-letters retry|dismiss`` in bulk (``--filter``) and one letter at a time, as a
process over the real broker and Redis: a dry run lists what it would touch and changes nothing,
a real run touches exactly the filtered letters, each audited naming the login user or ``--who``;
a bad filter is one line and exit 2."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from router.settings import Settings
from tests.support.environment import cleanup_environment, make_settings, run_cli
from tests.support.letters import Mixed, write_mixed

pytestmark = pytest.mark.integration


@dataclass
class World:
    s: Settings
    letters: Mixed

    def shown(self, letter_id: str) -> dict[str, Any]:
        found: dict[str, Any] = orjson.loads(
            run_cli(self.s, "dead-letters", "show", letter_id, check=True).stdout
        )
        return found

    def statuses(self) -> dict[str, object]:
        listed = orjson.loads(run_cli(self.s, "dead-letters", "list", "--json", check=True).stdout)
        return {d["id"]: (d["status"], d["last_action"]) for d in listed}


@pytest.fixture
def world() -> Iterator[World]:
    s = make_settings()
    try:
        run_cli(s, "provision", check=True)
        yield World(s, write_mixed(s))
    finally:
        cleanup_environment(s)


def test_a_dry_run_lists_the_letters_and_changes_nothing(world: World) -> None:
    before = world.statuses()
    dry = run_cli(
        world.s, "dead-letters", "retry", "--filter", "subscription=ledger", "--dry-run", "--json",
        check=True,
    )  # fmt: skip
    found = orjson.loads(dry.stdout)
    assert found["dry_run"] and (found["matched"], found["acted"], found["skipped"]) == (3, 2, 1)
    assert [d["id"] for d in found["letters"] if d["outcome"] == "would retry"] == [
        world.letters.ledger_old,
        world.letters.ledger_new,
    ]
    text = run_cli(
        world.s, "dead-letters", "dismiss", "--filter", "kind=command", "--reason", "gone",
        "--dry-run", check=True,
    )  # fmt: skip
    assert world.letters.integration in text.stdout and world.letters.indexing in text.stdout
    assert "would dismiss" in text.stdout
    assert "2 would be dismissed" in text.stderr and "nothing was changed" in text.stderr
    assert world.statuses() == before


def test_a_real_run_touches_exactly_the_filtered_letters_audited_per_letter(
    world: World,
) -> None:
    before = world.statuses()
    done = run_cli(
        world.s, "dead-letters", "dismiss", "--filter",
        "subscription=ledger,kind=event-batch,since=2h", "--reason", "drill data",
        check=True,
    )  # fmt: skip
    assert world.letters.ledger_new in done.stdout and "dismissed" in done.stdout
    assert f"1 dismissed by {getpass.getuser()}" in done.stderr
    by_carol = run_cli(
        world.s, "dead-letters", "retry", "--filter", "queue=integration", "--who", "carol",
        "--json", check=True,
    )  # fmt: skip
    assert [(d["id"], d["outcome"]) for d in orjson.loads(by_carol.stdout)["letters"]] == [
        (world.letters.integration, "retried")
    ]
    after = world.statuses()
    changed = {i for i in after if after[i] != before[i]}
    assert changed == {world.letters.ledger_new, world.letters.integration}
    dismissed = world.shown(world.letters.ledger_new)["audit"]
    assert [(a["action"], a["who"], a["why"]) for a in dismissed] == [
        ("dismissed", getpass.getuser(), "drill data")
    ]
    retried = world.shown(world.letters.integration)["audit"]
    assert [(a["action"], a["who"]) for a in retried] == [
        ("retrying", "carol"),
        ("retried", "carol"),
    ]
    # One letter by its id, as before.
    one = run_cli(world.s, "dead-letters", "retry", world.letters.projector, check=True)
    assert "redelivered to subscription project-view-projector" in one.stdout


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["retry", "--filter", "colour=red"], "--filter key 'colour'"),
        (["retry", "--filter", "kind=batch"], "kind"),
        (["retry", "--filter", "since=yesterday"], "since"),
        (["retry", "--filter", "status=retried"], "status"),
        (["retry", "--filter", "kind"], "KEY=VALUE"),
        (["retry", "--filter", "kind=command,kind=poison"], "twice"),
        (["retry", "dl_x", "--filter", "kind=command"], "not both"),
        (["retry"], "letter ID"),
        (["retry", "dl_x", "--dry-run"], "--dry-run goes with --filter"),
        (["dismiss", "--filter", "kind=command"], "--reason"),
    ],
)
def test_a_bad_filter_is_one_line_and_exit_2(arguments: list[str], named: str) -> None:
    s = make_settings()
    refused = run_cli(s, "dead-letters", *arguments)
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert named in last and refused.stdout == ""
    if "--reason" not in named:
        assert last.startswith("rhumbatron: ") and len(refused.stderr.strip().splitlines()) == 1
