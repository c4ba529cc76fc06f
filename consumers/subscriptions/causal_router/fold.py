"""The causal router's fold: one project's task graph and agent state, built by ``reduce``.

State (a JSON object per project)::

    generation      latest canonical generation (0: none yet); generationAt its event time (ms)
    changes         {change: {tasks: {task: Task}, waiting: [task, ...], finishedAt: ms | null}}
    agents          {agent: {resources: [path, ...], tasks: [[change, task], ...]}}
    candidates      {candidate: {change, generation, status, at, by}}
    finished        [[seq, ms, change], ...]     changes promoted (maintenance: forks.sweep)
    retired         [[seq, ms, candidate], ...]  candidates stale or rejected (project.cleanup)
    finishedSeq, retiredSeq                      counters numbering those two lists

    Task = {deps: [task], resources: [path], status, agent, by, why, blockedLimit, held}

Task status: ``created`` (some dependency not completed) → ``waiting`` (every dependency
completed, held at the agent limit) → ``ready`` (dispatched: by the router's ``change.dispatch``,
or seen as ``task.ready``) → ``started`` → ``completed`` | ``failed``; ``blocked`` from the
dead-letter path, with ``blockedLimit`` (``dead_letter``) saying why. The dead-letter path writes
``task.blocked`` then ``task.failed`` (marked with the same ``blockedLimit``): the failure that
follows a block keeps the task ``blocked``, so the reason stays visible.

A change's agent slots are its tasks in flight (``ready`` or ``started``): a task dispatched but
not yet started already holds the agent it will get, so the router never dispatches more than
``agents_per_change`` at once. A task blocked while in flight keeps its agent slot and its agent
(``held``) until the ``task.failed`` that follows the block: the block alone frees nothing; the
failure frees the agent slot and re-dispatches a task waiting at the limit, as any failure does. ``by``/``why`` on a task name the event whose fold
dispatched it and why; ``by`` on a candidate the event that made it stale. ``process`` reads these
marks to know what *this* event decided, so the decision lives in the fold and a retried batch
decides exactly the same.

An agent is *active* while it has a task in flight it started; its resources are its tasks'
resources plus what it declared (intent, challenge, changeset, claim) minus what it released.
Resources declared by an agent with no task in flight are checked for overlap but not kept.

Bad input: a consumed event whose payload does not fit the catalog raises
:class:`RouterInputError` naming the event, the field and the value. The runtime counts it as a
failing event, retries it and dead-letters it after the fifth failure, so an operator sees the
reason, and the graph is never built from a guess (the event is not folded).

Size: finished changes and retired candidates beyond ``history`` are forgotten, together with the
tasks and candidates that belong only to them. A change that never finishes (no candidate of it is
ever promoted) stays in its project's fold with its tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from consumers.runtime.types import JSON
from consumers.subscriptions.causal_router.payload import (
    envelope_generation,
    event_ms,
    need_change,
    need_generation,
    need_task,
    read,
    resources,
)
from streams.catalog import payloads as p
from streams.envelopes import Event
from streams.errors import RouterInputError

CREATED, WAITING, READY, STARTED = "created", "waiting", "ready", "started"
COMPLETED, FAILED, BLOCKED = "completed", "failed", "blocked"
IN_FLIGHT = frozenset({READY, STARTED})
TASK_DONE = frozenset({COMPLETED, FAILED, BLOCKED})

VERIFYING, CAND_CREATED, VERIFIED = "verifying", "created", "verified"
PROMOTED, REJECTED, STALE = "promoted", "rejected", "stale"
CANDIDATE_OPEN = frozenset({VERIFYING, CAND_CREATED, VERIFIED})

# Why a task was dispatched (``why`` on the task, ``reason`` in the command's payload).
DEPENDENCIES_COMPLETED = "dependencies-completed"
AGENT_SLOT_FREED = "agent-slot-freed"

DECLARING = frozenset(
    {"intent.declared", "challenge.raised", "changeset.proposed", "claim.acquired"}
)


@dataclass(frozen=True, slots=True)
class FoldLimits:
    agents_per_change: int
    history: int
    max_resources: int


def empty_state() -> JSON:
    return {
        "generation": 0,
        "generationAt": None,
        "changes": {},
        "agents": {},
        "candidates": {},
        "finished": [],
        "finishedSeq": 0,
        "retired": [],
        "retiredSeq": 0,
    }


# The parts of the state an event's folder may change: fold_event copies only those and shares
# the rest with the state it was given, which nothing changes. ``changes`` is copied as a dict
# (a folder may add or forget a change) holding the one change the folder may write, copied
# (see _written_change); the others are shared. A type not named here copies the whole state (a
# project's fold is ~40 KB 500 events in: copied whole, each way, for every event, it was a
# quarter of the causal router's time).
_TASK_PARTS = ("changes", "agents")
WRITTEN_PARTS: dict[str, tuple[str, ...]] = {
    "task.created": ("changes",),
    "task.ready": ("changes",),
    "task.blocked": ("changes",),
    "task.started": _TASK_PARTS,
    "task.completed": _TASK_PARTS,
    "task.failed": _TASK_PARTS,
    **dict.fromkeys(DECLARING, ("agents",)),
    "claim.released": ("agents",),
    # A candidate opening or moving on reads the generation and writes its candidate alone.
    "verification.started": ("candidates",),
    "candidate.created": ("candidates",),
    "candidate.verified": ("candidates",),
    # Retiring stale candidates appends to ``retired``; pruning forgets changes and candidates.
    "canonical.advanced": ("candidates", "retired", "changes"),
    # The promoted candidate's change is marked finished and appended to ``finished``.
    "artifact.promoted": ("candidates", "finished", "changes"),
}


def _written_change(state: JSON, event: Event) -> str | None:
    """The change whose entry the event's folder may write: the event's own, or for a promotion
    its candidate's change (the candidate's, when it names one)."""
    if event.event_type == "artifact.promoted":
        name = event.payload.get("candidateId")
        candidate = state["candidates"].get(name) if isinstance(name, str) else None
        if isinstance(candidate, dict) and candidate.get("change") is not None:
            return str(candidate["change"])
    return event.change_id


def _copy(state: JSON, event: Event) -> JSON:
    parts = WRITTEN_PARTS.get(event.event_type)
    if (
        parts is None
        or not isinstance(state.get("changes"), dict)
        or not isinstance(state.get("candidates"), dict)
    ):
        copied: JSON = orjson.loads(orjson.dumps(state))
        return copied
    s = dict(state)
    for part in parts:
        if part == "changes":
            changes = dict(state["changes"])
            change = _written_change(state, event)
            if change in changes:
                changes[change] = orjson.loads(orjson.dumps(changes[change]))
            s["changes"] = changes
        else:
            s[part] = orjson.loads(orjson.dumps(state[part]))
    return s


def fold_event(state: JSON | None, event: Event, limits: FoldLimits) -> JSON:
    """The state after ``event``. Never mutates ``state`` (the runtime caches it, and a failing
    event must leave it untouched): the parts the event's folder may change are copies."""
    s = _copy(state, event) if state is not None else empty_state()
    folder = FOLDERS.get(event.event_type)
    if folder is not None:
        folder(s, event, limits)
    return s


# -- graph helpers -----------------------------------------------------------------------------
def change_of(s: JSON, change: str) -> JSON:
    changes: JSON = s["changes"]
    if change not in changes:
        changes[change] = {"tasks": {}, "waiting": [], "finishedAt": None}
    entry: JSON = changes[change]
    return entry


def task_of(s: JSON, change: str, task: str) -> JSON:
    tasks: JSON = change_of(s, change)["tasks"]
    if task not in tasks:
        # Known only from a later event (the router started after its creation): no known
        # dependencies, no known resources.
        tasks[task] = {
            "deps": [],
            "resources": [],
            "status": CREATED,
            "agent": None,
            "by": None,
            "why": None,
            "blockedLimit": None,
            "held": False,
        }
    entry: JSON = tasks[task]
    return entry


def holds_agent_slot(task: JSON) -> bool:
    return task["status"] in IN_FLIGHT or (task["status"] == BLOCKED and bool(task.get("held")))


def in_flight(change: JSON) -> int:
    return sum(1 for t in change["tasks"].values() if holds_agent_slot(t))


def active_agents(s: JSON) -> list[str]:
    return sorted(a for a, v in s["agents"].items() if v["tasks"])


def _unwait(change: JSON, task: str) -> None:
    if task in change["waiting"]:
        change["waiting"].remove(task)


def _release_agent(s: JSON, agent: str | None, change: str, task: str) -> None:
    if agent is None or agent not in s["agents"]:
        return
    entry = s["agents"][agent]
    entry["tasks"] = [ct for ct in entry["tasks"] if ct != [change, task]]
    if not entry["tasks"]:
        del s["agents"][agent]  # inactive: its resources no longer matter to anyone


def _dispatch_ready(
    s: JSON, event: Event, change_id: str, newly_ready: list[str], limit: int
) -> None:
    """Dispatch what waited at the agent limit (oldest first), then what just became ready, as
    far as the change's free agent slots allow; the rest waits."""
    change = change_of(s, change_id)
    queue = [*change["waiting"], *(t for t in newly_ready if t not in change["waiting"])]
    free = limit - in_flight(change)
    waiting: list[str] = []
    for name in queue:
        task = change["tasks"][name]
        if free > 0:
            task["why"] = AGENT_SLOT_FREED if name in change["waiting"] else DEPENDENCIES_COMPLETED
            task["status"], task["by"] = READY, event.event_id
            free -= 1
        else:
            task["status"] = WAITING
            waiting.append(name)
    change["waiting"] = waiting


# -- payloads read by more than one folder or rule --------------------------------------------
_CANDIDATE_MODELS: dict[str, type[p.VerificationStarted | p.CandidateEvent | p.CandidateStale]] = {
    "verification.started": p.VerificationStarted,
    "candidate.created": p.CandidateEvent,
    "candidate.verified": p.CandidateEvent,
    "candidate.rejected": p.CandidateEvent,
    "candidate.stale": p.CandidateStale,
}


def candidate_id(event: Event) -> str:
    """The candidate an event names; ``artifact.promoted``'s too."""
    if event.event_type == "artifact.promoted":
        return read(event, p.ArtifactPromoted).candidate_id
    return read(event, _CANDIDATE_MODELS[event.event_type]).candidate_id


def declared_by(event: Event, max_resources: int) -> tuple[str, list[str]]:
    """The agent and the paths of a declaring event (intent, challenge, changeset, claim)."""
    payload = read(event, p.Declared)
    paths = resources(event, payload.resources, required=True, max_resources=max_resources)
    return payload.agent_id, paths


# -- folders, one per event type ---------------------------------------------------------------
def _task_created(s: JSON, event: Event, limits: FoldLimits) -> None:
    change, name = need_change(event), need_task(event)
    payload = read(event, p.TaskCreated)
    deps = sorted(set(payload.depends_on))
    if name in deps:
        raise RouterInputError(
            event, "payload.dependsOn", deps, "a list not naming the task itself"
        )
    paths = resources(event, payload.resources, required=False, max_resources=limits.max_resources)
    task = task_of(s, change, name)
    task["deps"], task["resources"] = deps, paths


def _task_ready(s: JSON, event: Event, limits: FoldLimits) -> None:
    change, name = need_change(event), need_task(event)
    task = task_of(s, change, name)
    _unwait(change_of(s, change), name)
    if task["status"] in (CREATED, WAITING):
        task["status"] = READY


def _task_started(s: JSON, event: Event, limits: FoldLimits) -> None:
    change, name = need_change(event), need_task(event)
    agent = read(event, p.TaskStarted).agent_id
    task = task_of(s, change, name)
    _unwait(change_of(s, change), name)
    if task["status"] in TASK_DONE:
        return  # a late start of a finished task changes nothing
    if task["agent"] not in (None, agent):
        _release_agent(s, task["agent"], change, name)
    task["status"], task["agent"] = STARTED, agent
    entry = s["agents"].setdefault(agent, {"resources": [], "tasks": []})
    if [change, name] not in entry["tasks"]:
        entry["tasks"].append([change, name])
    entry["resources"] = sorted(set(entry["resources"]) | set(task["resources"]))


def _task_finished(s: JSON, event: Event, limits: FoldLimits) -> None:
    change, name = need_change(event), need_task(event)
    completed = event.event_type == "task.completed"
    if completed:
        named: str | None = read(event, p.TaskCompleted).agent_id
        limit = None
    else:
        failed = read(event, p.TaskFailed)
        named, limit = failed.agent_id, failed.blocked_limit
    task = task_of(s, change, name)
    task["held"] = False  # a completion or a failure always frees the agent slot
    if completed:
        task["status"], task["blockedLimit"] = COMPLETED, None
    elif limit is not None or task["status"] == BLOCKED:
        # The dead-letter path's failure, following its block: the task stays blocked.
        task["status"] = BLOCKED
        task["blockedLimit"] = limit or task.get("blockedLimit")
    else:
        task["status"] = FAILED
    _unwait(change_of(s, change), name)
    _release_agent(s, task["agent"] or named, change, name)
    newly_ready: list[str] = []
    if completed:
        tasks = change_of(s, change)["tasks"]
        for other in sorted(tasks):
            t = tasks[other]
            if (
                t["status"] == CREATED
                and name in t["deps"]
                and all(tasks.get(d, {}).get("status") == COMPLETED for d in t["deps"])
            ):
                newly_ready.append(other)
    _dispatch_ready(s, event, change, newly_ready, limits.agents_per_change)


def _task_blocked(s: JSON, event: Event, limits: FoldLimits) -> None:
    change, name = need_change(event), need_task(event)
    task = task_of(s, change, name)
    _unwait(change_of(s, change), name)
    if task["status"] != COMPLETED:
        # The block alone frees nothing: the task keeps its agent slot and its agent until the
        # task.failed the dead-letter path writes after it.
        task["held"] = holds_agent_slot(task)
        task["status"] = BLOCKED
        task["blockedLimit"] = read(event, p.TaskBlocked).blocked_limit


def _declared(s: JSON, event: Event, limits: FoldLimits) -> None:
    agent, paths = declared_by(event, limits.max_resources)
    entry = s["agents"].get(agent)
    if entry is not None:
        entry["resources"] = sorted(set(entry["resources"]) | set(paths))


def _released(s: JSON, event: Event, limits: FoldLimits) -> None:
    released = read(event, p.ClaimReleased)
    agent = released.agent_id
    paths = resources(event, released.resources, required=True, max_resources=limits.max_resources)
    entry = s["agents"].get(agent)
    if entry is not None:
        entry["resources"] = sorted(set(entry["resources"]) - set(paths))


def _candidate(s: JSON, event: Event, status: str) -> JSON:
    name = candidate_id(event)
    found: JSON | None = s["candidates"].get(name)
    if found is None:
        generation = envelope_generation(event)
        found = {
            "change": event.change_id,
            "generation": generation if generation is not None else s["generation"],
            "status": status,
            "at": event_ms(event),
            "by": None,
        }
        s["candidates"][name] = found
    elif found["status"] in CANDIDATE_OPEN:
        found["status"] = status
    if found["change"] is None and event.change_id is not None:
        found["change"] = event.change_id
    return found


def _retire(s: JSON, event: Event, name: str, status: str) -> None:
    candidate = s["candidates"][name]
    if candidate["status"] in (STALE, REJECTED):
        return  # retired already (e.g. the router's own candidate.stale coming back)
    candidate["status"] = status
    s["retiredSeq"] += 1
    s["retired"].append([s["retiredSeq"], event_ms(event), name])


def _verification_started(s: JSON, event: Event, limits: FoldLimits) -> None:
    _candidate(s, event, VERIFYING)  # its candidateId and workGraphCompleted checked there


def _candidate_event(s: JSON, event: Event, limits: FoldLimits) -> None:
    status = {
        "candidate.created": CAND_CREATED,
        "candidate.verified": VERIFIED,
        "candidate.rejected": REJECTED,
        "candidate.stale": STALE,
    }[event.event_type]
    if status in (REJECTED, STALE):
        candidate = _candidate(s, event, VERIFYING)
        if candidate["status"] != PROMOTED:
            _retire(s, event, candidate_id(event), status)
            _prune(s, event, limits.history)
    else:
        _candidate(s, event, status)


def _artifact_promoted(s: JSON, event: Event, limits: FoldLimits) -> None:
    need_generation(event, read(event, p.ArtifactPromoted).generation)
    candidate = _candidate(s, event, VERIFYING)
    candidate["status"] = PROMOTED
    change = candidate["change"] or event.change_id
    if change is None:
        return
    entry = change_of(s, change)
    if entry["finishedAt"] is None:
        entry["finishedAt"] = event_ms(event)
        s["finishedSeq"] += 1
        s["finished"].append([s["finishedSeq"], event_ms(event), change])
    _prune(s, event, limits.history)


def _canonical_advanced(s: JSON, event: Event, limits: FoldLimits) -> None:
    generation = need_generation(event, read(event, p.CanonicalAdvanced).generation)
    if generation > s["generation"]:
        s["generation"], s["generationAt"] = generation, event_ms(event)
    for name in sorted(s["candidates"]):
        candidate = s["candidates"][name]
        if candidate["status"] in CANDIDATE_OPEN and candidate["generation"] < generation:
            candidate["by"] = event.event_id
            _retire(s, event, name, STALE)
    _prune(s, event, limits.history)


def _prune(s: JSON, event: Event, history: int) -> None:
    """Forget what maintenance and the rules no longer need, beyond ``history`` — except what
    this event decided (``process`` still has to act on it)."""
    s["finished"] = s["finished"][-history:]
    s["retired"] = s["retired"][-history:]
    kept_changes = {c for _, _, c in s["finished"]}
    for change in [c for c, v in s["changes"].items() if v["finishedAt"] is not None]:
        if change not in kept_changes:
            del s["changes"][change]
    kept_retired = {c for _, _, c in s["retired"]}
    for name, candidate in list(s["candidates"].items()):
        gone = (candidate["status"] in (STALE, REJECTED) and name not in kept_retired) or (
            candidate["status"] == PROMOTED and candidate["change"] not in s["changes"]
        )
        if gone and candidate["by"] != event.event_id:
            del s["candidates"][name]


Folder = Callable[[JSON, Event, FoldLimits], None]

FOLDERS: dict[str, Folder] = {
    "task.created": _task_created,
    "task.ready": _task_ready,
    "task.started": _task_started,
    "task.completed": _task_finished,
    "task.failed": _task_finished,
    "task.blocked": _task_blocked,
    **dict.fromkeys(DECLARING, _declared),
    "claim.released": _released,
    "verification.started": _verification_started,
    "candidate.created": _candidate_event,
    "candidate.verified": _candidate_event,
    "candidate.rejected": _candidate_event,
    "candidate.stale": _candidate_event,
    "artifact.promoted": _artifact_promoted,
    "canonical.advanced": _canonical_advanced,
}
