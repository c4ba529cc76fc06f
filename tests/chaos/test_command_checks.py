"""The chaos matrix's command-side checks (tests/chaos/matrix/command_checks.py) are not vacuous:
on evidence made by hand, a clean run passes, and a lost, doubled, stray or reordered command, a
second effect, an unexplained second start, an early retry, a retry too many and a dead letter
after the wrong attempts each fail the invariant they break."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta

from streams.envelopes import Command, build
from tests.chaos.matrix.command_checks import CommandEvidence, Rules, check, waited_through_a_move
from tests.chaos.matrix.command_worker import Entry, Failures

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DELAY_S = 2.0
RULES = Rules(
    failures=Failures(),
    retries=2,
    retry_delay_s=DELAY_S,
    dead_letter=frozenset({"agent-wakeups", "integration"}),
)


def _command(n: int, project: str = "p1", command_type: str = "change.dispatch") -> Command:
    return build(
        Command,
        command_id=f"cmd_{n}",
        command_type=command_type,
        project_id=project,
        change_id="c1",
        task_id=f"t{n}",
        created_at=NOW,
        deadline=NOW + timedelta(hours=1),
        payload={},
    )


def _ran(command: Command, *, fails: int = 0, at: int = 0, gap_ms: int = 2000) -> list[Entry]:
    """The journal of a command failing ``fails`` attempts, then completing."""
    queue = "integration" if command.command_type == "change.dispatch" else "agent-wakeups"
    out = []
    for attempt in range(1, fails + 2):
        start = at + (attempt - 1) * (gap_ms + 10)
        out.append(Entry("start", command.command_id, queue, attempt, start, 1))
        if attempt <= fails:
            out.append(Entry("fail", command.command_id, queue, attempt, start + 10, 1))
        else:
            out.append(Entry("done", command.command_id, queue, attempt, start + 10, 1, True))
    return out


def _clean() -> CommandEvidence:
    decided = [_command(1), _command(2), _command(3, "p2", "agent.wake")]
    journal = [entry for c in decided for entry in _ran(c)]
    return CommandEvidence(
        decided=decided,
        queued=list(decided),
        undecodable=0,
        retried=Counter(),
        dead=[],
        journal=journal,
    )


def _names(found: dict[str, list[str]]) -> set[str]:
    return {name for name, problems in found.items() if problems}


def test_a_clean_run_passes_and_counts_its_figures() -> None:
    found, figures = check(_clean(), RULES)
    assert _names(found) == set()
    assert figures["commands_decided"] == 3 and figures["handler_starts"] == 3


def test_the_queues_checks_see_a_lost_a_doubled_a_stray_and_a_reordered_command() -> None:
    e = _clean()
    lost = dataclasses.replace(e, queued=e.queued[1:])
    assert _names(check(lost, RULES)[0]) == {"I1"}
    doubled = dataclasses.replace(e, queued=[*e.queued, e.queued[0]])
    assert _names(check(doubled, RULES)[0]) == {"I2"}
    stray = dataclasses.replace(e, queued=[*e.queued, _command(9)])
    assert _names(check(stray, RULES)[0]) == {"I2"}
    swapped = dataclasses.replace(e, queued=[e.queued[1], e.queued[0], e.queued[2]])
    assert _names(check(swapped, RULES)[0]) == {"I4"}


def test_the_journal_checks_see_a_second_effect_a_second_start_and_a_handler_never_run() -> None:
    e = _clean()
    cid = e.decided[0].command_id
    second = Entry("done", cid, "integration", 1, 50, 2, True)
    assert _names(check(dataclasses.replace(e, journal=[*e.journal, second]), RULES)[0]) == {"I2"}
    again = Entry("done", cid, "integration", 1, 50, 2, False)
    rerun = [Entry("start", cid, "integration", 1, 40, 2), again]
    found = check(dataclasses.replace(e, journal=[*e.journal, *rerun]), RULES)[0]
    assert _names(found) == {"I2"} and len(found["I2"]) == 2
    # A transaction of its queue aborted: read again at the same attempt, its handler runs
    # again (by design), while a completed command is still never completed twice.
    only_start = [Entry("start", cid, "integration", 1, 40, 2)]
    explained = dataclasses.replace(e, journal=[*e.journal, *only_start], aborted={"integration"})
    assert _names(check(explained, RULES)[0]) == set()
    never = dataclasses.replace(e, journal=[x for x in e.journal if x.command_id != cid])
    assert _names(check(never, RULES)[0]) == {"I1"}


def test_the_attempt_checks_see_an_early_retry_a_retry_too_many_and_wrong_dead_letters() -> None:
    always = Failures(always=1.0)  # every command of a queue with a dead-letter queue
    rules = dataclasses.replace(RULES, failures=always)
    c = _command(1)
    journal = [
        entry
        for attempt in (1, 2, 3)
        for entry in (
            Entry("start", c.command_id, "integration", attempt, attempt * 3000, 1),
            Entry("fail", c.command_id, "integration", attempt, attempt * 3000 + 10, 1),
        )
    ]
    e = CommandEvidence(
        decided=[c],
        queued=[c],
        undecodable=0,
        retried=Counter({(c.command_id, 2): 1, (c.command_id, 3): 1}),
        dead=[(c, 3)],
        journal=journal,
    )
    found, figures = check(e, rules)
    assert _names(found) == set() and figures["retry_gap_ms_min"] == 2990
    early = dataclasses.replace(rules, retry_delay_s=3.0)
    assert _names(check(e, early)[0]) == {"I3"}
    extra = dataclasses.replace(e, retried=e.retried + Counter({(c.command_id, 2): 1}))
    assert _names(check(extra, rules)[0]) == {"I3"}
    for dead in ([], [(c, 3), (c, 3)], [(c, 2)]):
        assert _names(check(dataclasses.replace(e, dead=dead), rules)[0]) == {"I3"}, dead
    fewer = dataclasses.replace(e, journal=journal[:4])
    assert "I3" in _names(check(fewer, rules)[0])


def test_a_retry_waiting_through_a_rebalance_is_seen() -> None:
    c = _command(1)
    journal = _ran(c, fails=1, at=0, gap_ms=5000)
    assert waited_through_a_move(journal, "integration") == 0
    moved = Entry("assigned", "", "integration", 0, 2000, 7, partitions=["q[0]"])
    assert waited_through_a_move([*journal, moved], "integration") == 1
