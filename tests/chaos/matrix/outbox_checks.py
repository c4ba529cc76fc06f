"""The matrix's checks of the outbox and of the streams it feeds, beside I1-I5's (invariants.py),
each a function returning what is wrong (empty: it holds), filed under the invariant it serves:

- the streams' order (I4): Kafka never holds slot N+1 of a project without slot N before it;
  a copy (a slot again, after the crash of a publisher that had sent it) is allowed, a gap is not;
- the outbox's slots (I1): every committed event is in the outbox once, with the slot its
  project's write order gives it; each project's slots are 1..n, dense, and its counter is n;
  no row is left failed;
- a publisher that did not crash sends nothing twice (I2): rows whose fault stops no publisher
  uncleanly expect no copy on the streams;
- an outage is never charged to the rows (I1), and the row's outage did outlast the backoff
  ladder it claims to (its fault).

They read the outbox's tables directly (outboxes.py) and the streams as read back by the matrix's
own reader: not the store and not the publisher under test.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from router.settings import Settings
from streams.envelopes import Draft, Event
from tests.chaos.matrix.invariants import SHOWN, slots
from tests.chaos.matrix.outboxes import StoredRow
from tests.chaos.matrix.scenarios import LongOutage, OutboxServerKill, Scenario, SecondPublisher


def _few(items: Sequence[object]) -> str:
    shown = [str(i) for i in items[:SHOWN]]
    return ", ".join(shown) + (" …" if len(items) > SHOWN else "")


def stream_order(arrived: Sequence[Event]) -> list[str]:
    """I4 on the streams: walking each project's records in partition order, no slot comes
    before every slot below it has come at least once."""
    highest: dict[str, int] = defaultdict(int)
    found: list[str] = []
    for event in arrived:
        if event.slot is None:
            continue  # entered by another door (the feed pump): no slot to keep in order
        if event.slot > highest[event.project_id] + 1:
            found.append(
                f"{event.project_id}: slot {event.slot} on the stream before slot "
                f"{highest[event.project_id] + 1}"
            )
        highest[event.project_id] = max(highest[event.project_id], event.slot)
    return found


def copies(arrived: Sequence[Event]) -> int:
    """Records on the streams beyond one per event."""
    return len(arrived) - len({e.event_id for e in arrived})


def outbox_slots(
    drafts: Sequence[Draft], rows: Sequence[StoredRow], counters: Mapping[str, int]
) -> list[str]:
    """I1 in the outbox: every committed event there once, with its slot; slots dense per
    project, the counter at the last one; nothing failed."""
    found: list[str] = []
    want = slots(drafts)
    held = Counter(r.event_id for r in rows)
    missing = [d.event_id for d in drafts if d.event_id not in held]
    if missing:
        found.append(f"{len(missing)} committed events are not in the outbox: {_few(missing)}")
    twice = [event_id for event_id, n in held.items() if n > 1]
    if twice:
        found.append(f"{len(twice)} events are in the outbox more than once: {_few(twice)}")
    stray = [r.event_id for r in rows if r.event_id not in want]
    if stray:
        found.append(f"{len(stray)} outbox rows of events never written: {_few(stray)}")
    moved = [
        f"{r.event_id} at slot {r.slot}, not {want[r.event_id]}"
        for r in rows
        if r.event_id in want and r.slot != want[r.event_id]
    ]
    if moved:
        found.append(f"{len(moved)} rows out of their write order: {_few(moved)}")
    by_project: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        by_project[r.project_id].append(r.slot)
    for project, taken in sorted(by_project.items()):
        ordered = sorted(taken)
        if ordered != list(range(1, len(ordered) + 1)):
            found.append(f"{project}: slots {_runs(ordered)} are not 1..{len(ordered)}")
        elif counters.get(project) != len(ordered):
            found.append(
                f"{project}: slot counter at {counters.get(project)}, its last slot {len(ordered)}"
            )
    failed = [f"{r.event_id} ({r.project_id} slot {r.slot})" for r in rows if r.state == "failed"]
    if failed:
        found.append(f"{len(failed)} rows ended failed: {_few(failed)}")
    return found


def _runs(values: Sequence[int]) -> str:
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def ladder_s(initial_s: float, cap_s: float) -> float:
    """The time the backoff takes to climb to its cap: the first wait, twice it, four times it …
    up to and including the first capped one."""
    total, wait = 0.0, initial_s
    while wait < cap_s:
        total += wait
        wait *= 2
    return total + cap_s


def outage_charged(
    rows: Sequence[StoredRow], *, max_row_attempts: int, down_s: float, ladder: float
) -> dict[str, list[str]]:
    """An outage is not the rows' fault: no row was charged an attempt (I1: charged enough, it
    would have failed). And the fault was what the row says: the outage lasted the ladder
    several times over, and it deferred some row more often than its attempts would have
    allowed (else an outage counted as attempts would have gone unseen)."""
    charged = [f"{r.event_id} ({r.attempts})" for r in rows if r.attempts]
    i1 = [f"{len(charged)} rows charged row-level attempts by an outage: {_few(charged)}"]
    fault = []
    if down_s < 3 * ladder:
        fault.append(
            f"the outage ({down_s:g}s) did not outlast the backoff ladder ({ladder:g}s) 3 times"
        )
    most = max((r.deferrals for r in rows), default=0)
    if most <= max_row_attempts:
        fault.append(
            f"no row was deferred more than outbox_max_row_attempts={max_row_attempts} times "
            f"(at most {most})"
        )
    return {"I1": i1 if charged else [], "fault": fault}


def check(
    scenario: Scenario,
    drafts: Sequence[Draft],
    arrived: Sequence[Event],
    rows: Sequence[StoredRow],
    counters: Mapping[str, int],
    s: Settings,
    *,
    write_retries: int,
) -> dict[str, list[str]]:
    """Every row's outbox and stream checks, and those its fault calls for."""
    found: dict[str, list[str]] = {
        "I1": outbox_slots(drafts, rows, counters),
        "I2": [],
        "I4": [f"stream order: {p}" for p in stream_order(arrived)[:SHOWN]],
        "fault": [],
    }
    fault = scenario.fault
    if isinstance(fault, OutboxServerKill):
        if not write_retries:
            found["fault"].append(
                "no writer's transaction was interrupted: the kill struck no write"
            )
        if not copies(arrived):
            # Its pass was acknowledged and never marked: it must go out again.
            found["fault"].append("the publisher's pass under way at the kill was not sent again")
    if isinstance(fault, SecondPublisher) and copies(arrived):
        found["I2"].append(
            f"{copies(arrived)} records on the streams are copies, though no publisher crashed"
        )
    if isinstance(fault, LongOutage):
        ladder = ladder_s(s.outbox_backoff_initial_s, s.outbox_backoff_max_s)
        for name, problems in outage_charged(
            rows, max_row_attempts=s.outbox_max_row_attempts, down_s=fault.down_s, ladder=ladder
        ).items():
            found[name].extend(problems)
    return found
