"""The command side of the invariants, from what a row left (``CommandEvidence``), each a list of
what is wrong (empty: it holds). No server is asked here: tests/chaos/matrix/commands.py gathers
the evidence, and the checks are tested on evidence made by hand (test_chaos_matrix.py).

The records, none shaped by the router's or the workers' own dedupe:

- ``decided``: what the rules decide, the router's processor run in the matrix over the events
  as they arrived (each once, in stream order, the events it dead-lettered left out);
- ``queued``, ``retried``, ``dead``: the router's queues, the retry topics and the dead-letter
  queue read back as a read-committed reader (an aborted transaction's records never count);
- ``journal``: every start, failure and completion the workers' handler appended
  (tests/chaos/matrix/command_worker.py).

I1 every command decided is on its queue and, unless it fails every attempt, its handler
completed; I2 no command id twice on its queue nor one the rules did not decide, no second
completion, no attempt started twice unless explained (a worker killed, or a worker's
transaction aborted: its commands are read again at the same attempt and their handlers run
again, by design — docs/queues.md — while the attempt is still counted once); I3 attempts exact:
each failing attempt sends exactly one retry, each retry runs at least the queue's delay after
the failure before it, those failing every attempt are on the dead-letter queue once with
``rh.retry.attempts = 1 + retries``; I4 each project's commands on a queue in the order the rules
decided them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from consumers.subscriptions.causal_router.commands import QUEUES
from streams.envelopes import Command
from tests.chaos.matrix.command_worker import ALWAYS, Entry, Failures

SHOWN = 5


@dataclass
class CommandEvidence:
    decided: list[Command]  # what the rules decide, in decision order
    queued: list[Command]  # on the router's queues, read committed, in partition order
    undecodable: int  # records on those queues that are not commands
    retried: Counter[tuple[str, int]]  # (command id, attempt) of each record on the retry topics
    dead: list[tuple[Command, int]]  # on the dead-letter queue, with rh.retry.attempts
    journal: list[Entry]
    aborted: set[str] = field(
        default_factory=set
    )  # queues whose workers logged an aborted transaction


@dataclass(frozen=True)
class Rules:
    """What the row made its workers do."""

    failures: Failures
    retries: int
    retry_delay_s: float
    dead_letter: frozenset[str]  # the queues with a dead-letter queue
    workers_killed: bool = False  # the row kills or freezes a worker


@dataclass
class Timeline:
    """One command's journal."""

    starts: Counter[int] = field(default_factory=Counter)  # attempt -> starts
    fails: dict[int, int] = field(default_factory=dict)  # attempt -> last failure's wall ms
    first_start: dict[int, int] = field(default_factory=dict)  # attempt -> first start's ms
    done: list[Entry] = field(default_factory=list)


def timelines(journal: Sequence[Entry]) -> dict[str, Timeline]:
    out: dict[str, Timeline] = defaultdict(Timeline)
    for entry in journal:
        if entry.what not in ("start", "fail", "done"):
            continue
        t = out[entry.command_id]
        if entry.what == "start":
            t.starts[entry.attempt] += 1
            t.first_start.setdefault(entry.attempt, entry.at_ms)
        elif entry.what == "fail":
            t.fails[entry.attempt] = entry.at_ms
        else:
            t.done.append(entry)
    return dict(out)


def _few(items: Sequence[object] | set[str]) -> str:
    shown = sorted(map(str, items))[:SHOWN]
    return ", ".join(shown) + (" …" if len(items) > SHOWN else "")


def _empty() -> dict[str, list[str]]:
    return {name: [] for name in ("I1", "I2", "I3", "I4")}


def queues(e: CommandEvidence) -> dict[str, list[str]]:
    """The router's queues against the rules' decisions: I1, I2 and I4."""
    found = _empty()
    want = {c.command_id for c in e.decided}
    got = Counter(c.command_id for c in e.queued)
    missing = want - set(got)
    if missing:
        found["I1"].append(
            f"{len(missing)} commands decided never reached their queue: {_few(missing)}"
        )
    twice = [i for i, n in got.items() if n > 1]
    if twice:
        found["I2"].append(
            f"{len(twice)} command ids on their queue more than once (read committed): "
            f"{_few(twice)}"
        )
    stray = set(got) - want
    if stray:
        found["I2"].append(
            f"{len(stray)} commands on the queues the rules never decided: {_few(stray)}"
        )
    if e.undecodable:
        found["I2"].append(f"{e.undecodable} records on the queues that are not commands")
    decided: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in e.decided:
        decided[(QUEUES[c.command_type], c.project_id)].append(c.command_id)
    arrived: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in e.queued:
        key = (QUEUES[c.command_type], c.project_id)
        if c.command_id in want and c.command_id not in arrived[key]:
            arrived[key].append(c.command_id)
    disordered = [
        f"{q}/{p}"
        for (q, p), ids in arrived.items()
        if ids != [i for i in decided[(q, p)] if i in ids]
    ]
    if disordered:
        found["I4"].append(
            f"{len(disordered)} projects' commands on a queue out of decision order: "
            f"{_few(disordered)}"
        )
    return found


def handlers(e: CommandEvidence, rules: Rules) -> tuple[dict[str, list[str]], dict[str, object]]:
    """The journal, the retry topics and the dead-letter queue against each command's rule:
    I1, I2 and I3; and the row's figures."""
    found = _empty()
    lines = timelines(e.journal)
    last_attempt = 1 + rules.retries
    delay_ms = int(rules.retry_delay_s * 1000)
    never_ran: list[str] = []
    completions: list[str] = []
    wrong: list[str] = []
    early: list[str] = []
    unexplained: list[str] = []
    again: list[str] = []
    reruns = 0
    gaps: list[int] = []
    retries_want: Counter[tuple[str, int]] = Counter()
    always: set[str] = set()
    for command in e.decided:
        cid, queue = command.command_id, QUEUES[command.command_type]
        fails = rules.failures.of(cid, dead_letter=queue in rules.dead_letter)
        last = last_attempt if fails == ALWAYS else fails + 1
        if fails == ALWAYS:
            always.add(cid)
        retries_want.update((cid, n) for n in range(2, last + 1))
        t = lines.get(cid)
        if t is None:
            never_ran.append(cid)
            continue
        if sorted(t.starts) != list(range(1, last + 1)):
            wrong.append(f"{cid} ran attempts {sorted(t.starts)}, not 1-{last}")
        if any(n > 1 for n in t.starts.values()):
            reruns += 1
            if not (rules.workers_killed or queue in e.aborted):
                unexplained.append(cid)
        firsts = sum(1 for d in t.done if d.first)
        if firsts != (0 if fails == ALWAYS else 1):
            completions.append(f"{cid} made its effect {firsts} times")
        if len(t.done) > firsts and not rules.workers_killed:
            # A completed command read again is skipped by the workers' ledger of completed
            # ids; only a worker dying between its handler and that record runs it again.
            again.append(cid)
        for attempt, failed_at in t.fails.items():
            started = t.first_start.get(attempt + 1)
            if started is not None:
                gaps.append(started - failed_at)
                if started - failed_at < delay_ms:
                    early.append(f"{cid} attempt {attempt + 1} {started - failed_at} ms after")
    if never_ran:
        found["I1"].append(f"{len(never_ran)} commands no worker ever started: {_few(never_ran)}")
    lost = [c for c in completions if " 0 times" in c]
    if lost:
        found["I1"].append(f"{len(lost)} commands whose handler never completed: {_few(lost)}")
    if len(completions) > len(lost):
        found["I2"].append(
            f"{len(completions) - len(lost)} commands with more than one effect: "
            f"{_few([c for c in completions if c not in lost])}"
        )
    if again:
        found["I2"].append(
            f"{len(again)} commands whose handler completed again after its effect: {_few(again)}"
        )
    if unexplained:
        found["I2"].append(
            f"{len(unexplained)} commands with an attempt started twice, no worker killed and no "
            f"transaction of their queue aborted: {_few(unexplained)}"
        )
    strays = set(lines) - {c.command_id for c in e.decided}
    if strays:
        found["I2"].append(f"{len(strays)} commands run the rules never decided: {_few(strays)}")
    if wrong:
        found["I3"].append(f"{len(wrong)} commands with wrong attempts: {_few(wrong)}")
    if early:
        found["I3"].append(
            f"{len(early)} retries ran before the queue's delay ({delay_ms} ms): {_few(early)}"
        )
    if e.retried != retries_want:
        extra = sorted(f"{c} attempt {n} x{k}" for (c, n), k in (e.retried - retries_want).items())
        short = sorted(f"{c} attempt {n}" for (c, n) in retries_want - e.retried)
        found["I3"].append(
            f"retry topics: {len(extra)} retries beyond one per failed attempt ({_few(extra)}), "
            f"{len(short)} missing ({_few(short)})"
        )
    letters = Counter(c.command_id for c, _ in e.dead)
    if set(letters) != always:
        found["I3"].append(
            f"dead-letter queue: {len(always - set(letters))} commands failing every attempt "
            f"missing ({_few(always - set(letters))}), {len(set(letters) - always)} others there "
            f"({_few(set(letters) - always)})"
        )
    doubled = [i for i, n in letters.items() if n > 1]
    if doubled:
        found["I3"].append(f"dead-letter queue: commands there more than once: {_few(doubled)}")
    off = [f"{c.command_id} after {n}" for c, n in e.dead if n != last_attempt]
    if off:
        found["I3"].append(
            f"dead-letter queue: {len(off)} letters not after 1 + retries = {last_attempt} "
            f"attempts: {_few(off)}"
        )
    figures: dict[str, object] = {
        "commands_decided": len(e.decided),
        "commands_queued": len(e.queued),
        "handler_starts": sum(sum(t.starts.values()) for t in lines.values()),
        "retries": sum(e.retried.values()),
        "dead_lettered": len(e.dead),
        "attempts_started_twice": reruns,
    }
    if gaps:
        figures["retry_gap_ms_min"] = min(gaps)
        figures["retry_gap_ms_max"] = max(gaps)
    return found, figures


def check(e: CommandEvidence, rules: Rules) -> tuple[dict[str, list[str]], dict[str, object]]:
    found = queues(e)
    more, figures = handlers(e, rules)
    for name, problems in more.items():
        found[name].extend(problems)
    return found, figures


def waited_through_a_move(journal: Sequence[Entry], queue: str) -> int:
    """Retries of ``queue`` whose delay (from the failure to the next attempt's start) held a
    change of what one of its workers holds: how many waited through a rebalance."""
    moves = [x.at_ms for x in journal if x.what == "assigned" and x.queue == queue]
    waited = 0
    for t in timelines([x for x in journal if x.queue == queue]).values():
        for attempt, failed_at in t.fails.items():
            started = t.first_start.get(attempt + 1)
            if started is not None and any(failed_at < m < started for m in moves):
                waited += 1
    return waited
