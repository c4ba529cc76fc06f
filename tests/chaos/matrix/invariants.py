"""The matrix's invariants, each a function returning what is wrong (empty: it holds).

The record they read is not the one the runtime dedupes with. The runtime decides "already
applied" from its claim table; these checks read the effects themselves:

- the ledger subscription's effects (consumers/subscriptions/ledger.py): per project an
  append-only list of the slots applied (``RPUSH``: no unique key, a second application shows as
  a repeated slot, a reordering as slots out of order) and per event a counter (``HINCRBY``: a
  second application shows as 2). Both are written by the effect, not by the claim logic, so a
  claim that failed to stop a duplicate leaves the duplicate visible here.
- the project-view-projector's views against tests/support/projector_oracle.py, a plain replay
  of what reached the streams (read back from Kafka with a reader of our own).
- the outbox's rows, the streams' records (read committed), the dead-letter index, each
  partition's stored progress and each group's lag.

I1 nothing lost, I2 no duplicate effect, I3 dead letters exact, I4 project order, I5 clean end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.lag import group_lag
from consumers.runtime.dead_letters import DeadLetter, LetterKind
from consumers.runtime.types import TP
from consumers.subscriptions.ledger import read_ledger
from consumers.subscriptions.projector.view import read_view
from router.settings import Settings
from router.wiring.subscription import dead_letters, redis_client, store
from streams.admin import admin_client
from streams.clock import SystemClock
from streams.envelopes import Draft, Event
from streams.errors import ViewNotFound
from streams.outbox.store import OutboxStore, RowState
from tests.chaos.matrix import moves
from tests.chaos.matrix.scenarios import LEDGER, PROJECTOR, SUBSCRIPTIONS
from tests.support.hostile import Hostile
from tests.support.projector_oracle import expected_view

NAMES = ("I1", "I2", "I3", "I4", "I5")
SHOWN = 5  # examples named in a problem; the counts say how many in all


@dataclass(frozen=True)
class Evidence:
    """What a row's run left, gathered once the pipeline stopped."""

    drafts: Sequence[Draft]  # every event committed to the outbox, in write order
    poison: Sequence[str]  # the ids the row made fail for the ledger
    arrived: Sequence[Event]  # every record on the streams, in partition order, copies included
    drains: Mapping[str, int]  # each subscription's final `consume --until-idle` exit code
    drained_in_s: float | None  # from the last wave written to lag 0 (None: never)
    drain_bound_s: float
    logs: Path | None = None  # the members' logs: each failed try of an event is a line there
    # Records put straight onto the streams that are no event (row 9), by where they landed
    # (topic, partition, offset): every subscription must dead-letter each as poison, once.
    garbage: Mapping[tuple[str, int, int], Hostile] = field(default_factory=dict)
    # Every record's place on the streams (topic, partition, offset) and its event id: what the
    # offsets of an operator's audited moves (row 22) mean in events.
    where: Mapping[tuple[str, int, int], str] = field(default_factory=dict)
    # Which subscription dead-letters which poison events; None: the ledger, ``poison``.
    poisoned: Mapping[str, Sequence[str]] | None = None

    def dead_by(self) -> dict[str, list[str]]:
        if self.poisoned is not None:
            return {sub: sorted(ids) for sub, ids in self.poisoned.items() if ids}
        return {LEDGER: sorted(self.poison)} if self.poison else {}


def _few(items: Sequence[object] | set[str]) -> str:
    shown = sorted(map(str, items))[:SHOWN]
    return ", ".join(shown) + (" …" if len(items) > SHOWN else "")


def slots(drafts: Sequence[Draft]) -> dict[str, int]:
    """Each event's slot, as the outbox gives them: 1, 2, 3 … per project in write order."""
    out: dict[str, int] = {}
    count: dict[str, int] = defaultdict(int)
    for d in drafts:
        count[d.project_id] += 1
        out[d.event_id] = count[d.project_id]
    return out


def check(s: Settings, outbox: OutboxStore, e: Evidence) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {name: [] for name in NAMES}
    for name, problems in (
        *published(outbox, e).items(),
        *ledger_effects(s, e).items(),
        *projector_views(s, e).items(),
        *letters(s, e).items(),
        *clean_end(s, e).items(),
    ):
        found[name].extend(problems)
    return found


def published(outbox: OutboxStore, e: Evidence) -> dict[str, list[str]]:
    """I1 at the publisher: every committed row published, every event on the streams."""
    problems = []
    counts = outbox.counts()
    if counts.get(RowState.PUBLISHED, 0) != len(e.drafts):
        problems.append(f"outbox rows {dict(counts)}: not all {len(e.drafts)} published")
    missing = {d.event_id for d in e.drafts} - {a.event_id for a in e.arrived}
    if missing:
        problems.append(
            f"{len(missing)} committed events never reached the streams: {_few(missing)}"
        )
    return {"I1": problems}


def ledger_effects(s: Settings, e: Evidence) -> dict[str, list[str]]:
    """I1, I2 and I4 from the ledger's own records, and the audit log of operators' moves: an
    event an audited skip-through covered is accounted for, not lost; an event an audited
    reprocess_from re-ran is applied once more, at the revision it names, and only then."""
    return judge_ledger(read_ledger(redis_client(s), s.env), moves.audited(s, LEDGER, e.where), e)


def judge_ledger(
    ledger: Mapping[str, Any], moved: moves.Audited, e: Evidence
) -> dict[str, list[str]]:
    """:func:`ledger_effects` of a ledger's record (read_ledger) and the audited moves."""
    counts: dict[str, int] = ledger["counts"]
    revisions: dict[str, dict[int, int]] = ledger.get("revisions", {})
    owed = [d for d in e.drafts if d.event_id not in set(e.poison)]
    owed_ids = {d.event_id for d in owed}
    lost = owed_ids - set(counts) - moved.skipped
    # One application per (event, cursor revision): counts holds them all, revisions those at a
    # revision above 0.
    twice = {
        event_id: n
        for event_id, n in counts.items()
        if n - sum(revisions.get(event_id, {}).values()) > 1
        or any(k > 1 for k in revisions.get(event_id, {}).values())
    }
    stray = set(counts) - owed_ids
    not_rerun = {
        i for i, r in moved.rerun.items() if i in owed_ids and revisions.get(i, {}).get(r) != 1
    }
    unasked = {i for i, revs in revisions.items() if set(revs) - {moved.rerun.get(i)}}
    slot_of = slots(e.drafts)
    order: dict[str, list[int]] = defaultdict(list)
    again: dict[str, list[int]] = defaultdict(list)
    for d in owed:
        if d.event_id in counts or d.event_id not in moved.skipped:
            order[d.project_id].append(slot_of[d.event_id])
        if d.event_id in moved.rerun:
            again[d.project_id].append(slot_of[d.event_id])
    out_of_order = [
        p
        for p, applied in ledger["projects"].items()
        if p in order and not _in_order(applied, order[p], again[p])
    ]
    i1 = [f"ledger: {len(lost)} events never applied: {_few(lost)}"] if lost else []
    i2 = (
        [f"ledger: {len(twice)} events applied more than once a revision: {_few(list(twice))}"]
        if twice
        else []
    )
    if stray:
        i2.append(f"ledger: {len(stray)} effects of events it owed none: {_few(stray)}")
    if not_rerun:
        i1.append(
            f"ledger: {len(not_rerun)} events an audited reprocess_from re-ran not applied once "
            f"at its revision: {_few(not_rerun)}"
        )
    if unasked:
        i2.append(
            f"ledger: {len(unasked)} events applied at a revision no audited move re-ran them "
            f"at: {_few(unasked)}"
        )
    i4 = []
    for p in out_of_order[:SHOWN]:
        i4.append(f"ledger: project {p} applied slots {_ranges(ledger['projects'][p])}")
    return {"I1": i1, "I2": i2, "I4": i4}


def _in_order(applied: Sequence[int], slots_in_order: list[int], rerun: list[int]) -> bool:
    """The project's slots in order; after a reprocess_from, its slots in order up to some
    point at or past the first re-run one, then the re-run slots in order."""
    first = len(slots_in_order) - len(rerun)
    return any(
        list(applied) == slots_in_order[:m] + rerun for m in range(first, len(slots_in_order) + 1)
    )


def _ranges(values: Sequence[int]) -> str:
    """``1-40, 38-60``: a list of slots as the runs it is made of."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def projector_views(s: Settings, e: Evidence) -> dict[str, list[str]]:
    """Every project's view equals the plain replay's: fewer events in it is I1, more is I2, the
    same events but another state is I4 (the latest fact won out of slot order)."""
    client = redis_client(s)
    found: dict[str, list[str]] = {"I1": [], "I2": [], "I4": []}
    projects = sorted({d.project_id for d in e.drafts})
    for project in projects:
        tp = TP(*s.topology.partition_of(project))
        want = expected_view(project, tp, list(e.arrived))
        try:
            got = read_view(client, s.env, tp, project)
        except ViewNotFound:
            found["I1"].append(f"{PROJECTOR}: project {project} has no view")
            continue
        if got == want:
            continue
        if got["events"] != want["events"]:
            name = "I1" if got["events"] < want["events"] else "I2"
            found[name].append(
                f"{PROJECTOR}: project {project} counts {got['events']} events, not {want['events']}"
            )
        else:
            differ = sorted(k for k in want if got.get(k) != want[k])
            found["I4"].append(f"{PROJECTOR}: project {project}'s view differs in {differ}")
    return found


def letters(s: Settings, e: Evidence) -> dict[str, list[str]]:
    """I3: exactly the poison events dead-lettered, by the subscriptions that fail on them
    (the ledger's drill event: the ledger only), each after exactly max_batch_failures
    attempts: as the letter says, and as the failed tries logged count (a drill event an
    operator skipped through, audited, owes no letter); and exactly the garbage records, by
    every subscription, each as poison after one attempt."""
    found = dead_letters(s, redis_client(s)).list()
    problems = garbage_letters(e, [d for d in found if d.kind == LetterKind.POISON])
    # A drill event an operator skipped through (audited) is handled without a dead letter.
    skipped = moves.audited(s, LEDGER, e.where).skipped
    held: dict[str, list[str]] = defaultdict(list)
    for letter in found:
        if letter.kind == LetterKind.POISON:
            continue
        held[letter.subscription or "?"].extend(x.event_id or "?" for x in letter.entries)
        if letter.attempts != s.max_batch_failures:
            problems.append(
                f"{letter.subscription}: letter {letter.id} after {letter.attempts} attempts, "
                f"not max_batch_failures={s.max_batch_failures}"
            )
    want = {
        slug: sorted(set(ids) - (skipped if slug == LEDGER else set()))
        for slug, ids in e.dead_by().items()
    }
    want = {slug: ids for slug, ids in want.items() if ids}
    for slug, ids in want.items():
        if e.logs is None:
            break
        # Counted apart from the letter's own number: the runtime logs each failed try.
        text = "".join(p.read_text(errors="replace") for p in sorted(e.logs.glob(f"{slug}*.log")))
        for event_id in ids:
            tries = sum(
                1 for line in text.splitlines() if f"{event_id} at " in line and "failed:" in line
            )
            if tries != s.max_batch_failures:
                problems.append(
                    f"{slug}: {event_id} tried {tries} times (its log lines), not "
                    f"max_batch_failures={s.max_batch_failures}"
                )
    got = {sub: sorted(ids) for sub, ids in held.items()}
    if got != want:
        problems.append(f"dead-lettered {got}, not {want}")
    return {"I3": problems}


def garbage_letters(e: Evidence, poison: Sequence[DeadLetter]) -> list[str]:
    """Each subscription's poison letters are exactly the garbage records, one letter each
    (decoding them takes one attempt), naming what was wrong and holding each record's bytes
    and headers as they came."""
    problems = []
    got: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for letter in poison:
        who = letter.subscription or "?"
        if letter.attempts != 1 or not letter.error.strip():
            problems.append(
                f"{who}: poison letter {letter.id} after {letter.attempts} attempts, error "
                f"{letter.error!r}: a record that is no event is dead-lettered at once, saying why"
            )
        for entry in letter.entries:
            where = (letter.source_topic, letter.source_partition, entry.offset)
            got[who].append(where)
            came = e.garbage.get(where)
            if came is not None and (entry.value, entry.headers) != (came.value, came.headers):
                problems.append(f"{who}: the letter of {came.name} at {where} is not as it came")
    want = sorted(e.garbage)
    for who in sorted(set(got) | (set(SUBSCRIPTIONS) if e.garbage else set())):
        if sorted(got.get(who, [])) != want:
            extra = sorted(set(got.get(who, [])) - set(want))
            missing = sorted(set(want) - set(got.get(who, [])))
            twice = len(got.get(who, [])) - len(set(got.get(who, [])))
            problems.append(
                f"{who}: poison letters {len(got.get(who, []))}, not {len(want)}: "
                f"missing {_few(missing)}; not garbage {_few(extra)}; twice {twice}"
            )
    return problems


def clean_end(s: Settings, e: Evidence) -> dict[str, list[str]]:
    """I5: lag 0, no claim or effect left pending, nothing held back in a partition's progress,
    each subscription idle (nothing paused for a retry) in its final run, all within the bound."""
    problems = []
    if e.drained_in_s is None or e.drained_in_s > e.drain_bound_s:
        problems.append(f"not drained within {e.drain_bound_s:.0f}s (took {e.drained_in_s})")
    for slug, code in e.drains.items():
        if code != 0:
            problems.append(f"{slug}: the final run did not reach idle (exit {code})")
    base = s.kafka_config()
    admin = admin_client(base)
    client = redis_client(s)
    for slug in SUBSCRIPTIONS:
        reads = s.topology.subscription_reads(slug)
        behind = [p for p in group_lag(admin, base, reads, s.connect_timeout_s) if p.lag]
        if behind:
            problems.append(
                f"{slug}: lag {sum(p.lag for p in behind)} on "
                f"{_few([f'{p.topic}[{p.partition}]' for p in behind])}"
            )
        progress = store(s, client, slug, SystemClock())
        for topic in s.topology.stream_names():
            for partition in range(s.partitions):
                at = progress.load(TP(topic, partition))
                if at.pending_effects or at.applied_beyond or at.dead:
                    problems.append(
                        f"{slug}: {topic}[{partition}] left pending_effects={at.pending_effects} "
                        f"applied_beyond={at.applied_beyond[:SHOWN]} dead={at.dead[:SHOWN]}"
                    )
    return {"I5": problems}
