"""A synthetic but realistic workload: projects whose changes run a task graph through to
promotion and release, in the event types of DESIGN.md §13.

Each project's events come out in its own causal order carrying ``slot`` 1, 2, 3 …; projects are
interleaved round-robin as concurrent writers would interleave them. Ids are deterministic for a
given ``run`` so a test can rebuild the expectation.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from streams.envelopes import Event, build
from streams.ids import stable_event_id

TASKS_PER_CHANGE = 4


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before the outbox gives it a slot and a time: what a writer appends."""

    event_id: str
    event_type: str
    project_id: str
    change_id: str | None
    task_id: str | None
    actor: str
    payload: dict[str, object]
    canonical_generation: int | None = None
    resource: str | None = None

    def to_event(self, *, tenant_id: str, timestamp: datetime, slot: int | None) -> Event:
        return build(
            Event,
            event_id=self.event_id,
            event_type=self.event_type,
            tenant_id=tenant_id,
            project_id=self.project_id,
            change_id=self.change_id,
            task_id=self.task_id,
            actor=self.actor,
            resource=self.resource,
            canonical_generation=self.canonical_generation,
            timestamp=timestamp,
            payload=self.payload,
            slot=slot,
        )


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
        n = rng.choice(live)
        out.append(queues[n][cursors[n]])
        cursors[n] += 1
        if cursors[n] == len(queues[n]):
            live.remove(n)
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
