"""A synthetic but realistic workload: projects whose changes run a task graph through to
promotion and release, in the catalog's event types.

Each project's events come out in its own causal order carrying ``slot`` 1, 2, 3 …; projects are
interleaved round-robin as concurrent writers would interleave them. Ids are deterministic for a
given ``run`` so a test can rebuild the expectation.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from streams import tracing
from streams.envelopes import Draft, Event
from streams.ids import stable_event_id
from streams.outbox.store import OutboxStore

TENANT = "tenant-demo"

TASKS_PER_CHANGE = 4


def project_ids(run: str, projects: int) -> list[str]:
    return [f"proj-{run}-{n:05d}" for n in range(projects)]


def _change_lifecycle(project_id: str, change_no: int, generation: int) -> Iterator[Draft]:
    change = f"{project_id}-chg{change_no}"

    def draft(event_type: str, task: str | None, payload: dict[str, object], **kw: object) -> Draft:
        key = str(kw.pop("key", "")) or None
        return Draft(
            event_id=stable_event_id(change, event_type, task, key),
            event_type=event_type,
            project_id=project_id,
            change_id=change,
            task_id=task,
            actor=str(kw.pop("actor", "service:integration")),
            payload=payload,
            **kw,  # type: ignore[arg-type]
        )

    yield draft(
        "change.created", None, {"clientRequestId": f"req-{change}", "title": f"change {change_no}"}
    )
    # A chain t0 -> t1 that fans out: the last two tasks both depend on t1, run at the same time
    # on two agents, and touch one shared file, so the second agent's intent overlaps what the
    # first one holds (the router wakes the first agent).
    tasks = [f"{change}-t{i}" for i in range(TASKS_PER_CHANGE)]
    fan = TASKS_PER_CHANGE - 2  # tasks before this index form the chain
    deps = [[tasks[min(i, fan) - 1]] if i else [] for i in range(len(tasks))]
    files = [
        [f"src/mod{i}.py"] + (["src/shared.py"] if i >= fan else []) for i in range(len(tasks))
    ]
    agents = [f"agent-{i % 3}" for i in range(len(tasks))]
    for i, task in enumerate(tasks):
        yield draft("task.created", task, {"dependsOn": deps[i], "resources": files[i]})

    def start(i: int) -> Iterator[Draft]:
        agent = agents[i]
        yield draft("task.started", tasks[i], {"agentId": agent}, actor=f"agent:{agent}")
        yield draft(
            "intent.declared",
            tasks[i],
            {"agentId": agent, "resources": files[i]},
            actor=f"agent:{agent}",
        )

    def complete(i: int) -> Draft:
        agent = agents[i]
        return draft("task.completed", tasks[i], {"agentId": agent}, actor=f"agent:{agent}")

    for i in range(fan):
        yield draft("task.ready", tasks[i], {})
        yield from start(i)
        yield complete(i)
    concurrent = range(fan, len(tasks))
    for i in concurrent:
        yield draft("task.ready", tasks[i], {})
    for i in concurrent:
        yield from start(i)
    for i in concurrent:
        yield complete(i)
    candidate = f"cand-{change}"
    yield draft(
        "verification.started", None, {"candidateId": candidate, "workGraphCompleted": True}
    )
    yield draft("candidate.created", None, {"candidateId": candidate})
    yield draft("candidate.verified", None, {"candidateId": candidate})
    yield draft("artifact.promoted", None, {"candidateId": candidate, "generation": generation})
    yield draft(
        "canonical.advanced", None, {"generation": generation}, canonical_generation=generation
    )
    yield draft(
        "release.completed",
        None,
        {"releaseId": f"rel_{project_id}_{generation}", "generation": generation},
        canonical_generation=generation,
    )


def project_events(project_id: str, count: int) -> list[Draft]:
    """The first ``count`` events of a project's life, in causal order."""
    out = [
        Draft(
            event_id=stable_event_id(None, "project.created", None, project_id),
            event_type="project.created",
            project_id=project_id,
            change_id=None,
            task_id=None,
            actor="service:api",
            payload={"name": project_id},
        )
    ]
    change_no = 0
    while len(out) < count:
        change_no += 1
        for item in _change_lifecycle(project_id, change_no, generation=change_no):
            out.append(item)
            if len(out) == count:
                break
    return out[:count]


def workload(run: str, projects: int, events: int, *, seed: int = 7) -> list[Draft]:
    """``events`` drafts over ``projects`` projects, interleaved as concurrent writers would."""
    ids = project_ids(run, projects)
    per, extra = divmod(events, projects)
    queues = [project_events(pid, per + (1 if n < extra else 0)) for n, pid in enumerate(ids)]
    rng = random.Random(seed)
    cursors = [0] * len(queues)
    live = [n for n, q in enumerate(queues) if q]
    out: list[Draft] = []
    while live:
        at = rng.randrange(len(live))
        n = live[at]
        out.append(queues[n][cursors[n]])
        cursors[n] += 1
        if cursors[n] == len(queues[n]):
            # Its place taken by the last live queue: removing from the middle of the list is
            # linear, and over 100,000 projects it was most of building the workload.
            live[at] = live[-1]
            live.pop()
    return out


def slotted_events(
    drafts: list[Draft], *, tenant_id: str, start: datetime | None = None
) -> list[Event]:
    """Give drafts their per-project slots and times directly (the outbox does this in
    production; this is for producing without one)."""
    base = start or datetime.now(UTC)
    next_slot: dict[str, int] = {}
    out = []
    for n, draft in enumerate(drafts):
        slot = next_slot.get(draft.project_id, 0) + 1
        next_slot[draft.project_id] = slot
        out.append(
            draft.to_event(
                tenant_id=tenant_id, timestamp=base + timedelta(milliseconds=n), slot=slot
            )
        )
    return out


# -- the synthetic workload written through an outbox ---------------------------------------------
@dataclass(frozen=True, slots=True)
class WriteReport:
    writers: int
    writes: int  # transactions committed
    events: int  # events appended
    duplicates: int
    seconds: float


WRITER_TABLE = (
    "CREATE TABLE IF NOT EXISTS synthetic_writer_state (writer TEXT NOT NULL, "
    "project_id TEXT NOT NULL, last_slot INTEGER NOT NULL, writes INTEGER NOT NULL, "
    "PRIMARY KEY (writer, project_id))"
)


def _writer_upsert(mark: str) -> str:
    """The writer's own state change, in SQL both backends take (``mark``: the placeholder; the
    column qualified, as PostgreSQL finds a bare ``writes`` ambiguous beside ``excluded``)."""
    return (
        "INSERT INTO synthetic_writer_state (writer, project_id, last_slot, writes) "
        f"VALUES ({mark}, {mark}, {mark}, 1) ON CONFLICT (writer, project_id) DO UPDATE SET "
        "last_slot = excluded.last_slot, writes = synthetic_writer_state.writes + 1"
    )


def _chunks(drafts: Sequence[Draft], size: int) -> Iterator[tuple[str, list[Draft]]]:
    """Up to ``size`` drafts of one project at a time, each project's in their order, projects
    taken in turn (as a writer serving many projects would)."""
    queues: dict[str, deque[Draft]] = {}
    for draft in drafts:
        queues.setdefault(draft.project_id, deque()).append(draft)
    while queues:
        for project_id in list(queues):
            queue = queues[project_id]
            yield project_id, [queue.popleft() for _ in range(min(size, len(queue)))]
            if not queue:
                del queues[project_id]


def write_workload(
    store: OutboxStore,
    drafts: Sequence[Draft],
    *,
    writers: int,
    events_per_write: int,
    tenant_id: str = TENANT,
) -> WriteReport:
    """Write ``drafts`` through the outbox with ``writers`` concurrent writer threads. Each write
    is one transaction: the writer's own state change (a row in its table) plus a few events of
    one project. Each project belongs to one writer, so its events keep their causal order."""
    shares: dict[int, list[Draft]] = defaultdict(list)
    owner: dict[str, int] = {}
    for draft in drafts:
        shares[owner.setdefault(draft.project_id, len(owner) % writers)].append(draft)
    with store.transaction() as unit:
        unit.execute(WRITER_TABLE)

    # Traced, each transaction runs inside a span of the writer's own, as a service's would: the
    # events' trace starts there (sampling is decided there), the outbox write its child.
    tracer = tracing.tracer(__name__) if tracing.active() else None

    def write(writer: int) -> tuple[int, int, int]:
        name = f"writer-{writer}"
        seen: dict[str, int] = {}
        writes = events = duplicates = 0
        for project_id, batch in _chunks(shares[writer], events_per_write):
            span = (
                tracer.start_as_current_span(
                    f"write {project_id}",
                    attributes={tracing.PROJECT: project_id, "rhumbatron.writer": name},
                )
                if tracer is not None
                else nullcontext()
            )
            with span, store.transaction() as unit:
                result = unit.append(
                    project_id, batch, tenant_id=tenant_id, seen_slot=seen.get(project_id)
                )
                unit.execute(_writer_upsert(unit.placeholder), (name, project_id, result.head))
            seen[project_id] = result.head
            writes += 1
            events += len(result.events)
            duplicates += len(result.duplicates)
        return writes, events, duplicates

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="outbox-writer") as pool:
        results = list(pool.map(write, range(writers)))
    return WriteReport(
        writers=writers,
        writes=sum(r[0] for r in results),
        events=sum(r[1] for r in results),
        duplicates=sum(r[2] for r in results),
        seconds=time.perf_counter() - started,
    )
