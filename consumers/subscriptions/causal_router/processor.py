"""``causal-router``: decides, after each fresh event, which work to request (docs/router.md).

The fold (``reduce``, :mod:`~consumers.subscriptions.causal_router.fold`) keeps each project's task graph,
active agents, candidates and generation. ``process`` applies the rules, deterministic ones first:

| event | commands (queue) |
|---|---|
| ``task.ready`` | none: the dispatcher sent the wake already |
| informational types | none (most are not even consumed) |
| ``task.completed`` | ``change.dispatch`` (integration) per task it made ready, while the change has a free agent slot; the rest wait |
| ``task.completed`` / ``task.failed`` | frees the task's agent slot: ``change.dispatch`` for tasks waiting at the limit |
| ``verification.started`` with ``workGraphCompleted`` | ``candidate.create`` (integration) |
| ``canonical.advanced`` | ``agent.wake`` (agent-wakeups) per active agent, ``index.build`` (indexing), and ``candidate.stale`` events for older open candidates |
| ``artifact.promoted`` | ``index.build`` (indexing) |
| ``intent.declared``, ``challenge.raised``, ``changeset.proposed``, ``claim.acquired`` | per *other* active agent: a resource in common → ``agent.wake``; only a directory-prefix overlap → the classifier (wake unless it confidently says skip); none → nothing |

One ``change.dispatch`` per task (target = the task), so the integration worker learns exactly
which task to start and why (``dependencies-completed`` or ``agent-slot-freed``).

Every command passes the per-change daily budget (:mod:`~consumers.subscriptions.causal_router.budget`),
asked once per partition batch for all of the batch's commands, in their order (``finish_batch``,
after the batch's last ``process``: one round trip, the same answers as one admission after
another); one over the cap is not sent: it is counted (``commands_capped:<type>`` in the router's
metrics hash, an exact Redis effect of the batch) and logged with its change id. Commands are Kafka
effects: records and consumed offsets commit in one transaction, after their pending copy, the
fold and the claims committed in Redis (docs/guarantees.md), so commands, offsets and fold agree
across any crash.

Command ids carry the delivery's cursor revision when it is above 0 (``rule_command_id``), so a
``reprocess_from`` re-run sends commands the workers have not seen; the record id is the command
id.

The ``candidate.stale`` events are facts the router decides; it writes them to **its own outbox**
(stable event ids: a retried batch writes them again and the outbox ignores the repeat), whose
publisher gives them slots of that outbox and sends them to the project's stream like any other
event. The router never writes another subscription's state.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

import redis

from consumers.runtime.types import (
    JSON,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    RedisOp,
)
from consumers.subscriptions.causal_router.budget import CommandBudget
from consumers.subscriptions.causal_router.classifier import OverlapJudge, OverlapQuestion
from consumers.subscriptions.causal_router.commands import (
    AGENT_WAKE,
    CANDIDATE_CREATE,
    CHANGE_DISPATCH,
    INDEX_BUILD,
    Planned,
    command_record,
    make_command,
    rule_command_id,
)
from consumers.subscriptions.causal_router.fold import (
    DECLARING,
    FOLDERS,
    STALE,
    FoldLimits,
    active_agents,
    declared_by,
    fold_event,
)
from consumers.subscriptions.causal_router.payload import need_generation, read
from streams.catalog import payloads
from streams.clock import Clock
from streams.envelopes import Draft, Event
from streams.ids import stable_event_id
from streams.outbox.store import UnitOfWork

log = logging.getLogger("rhumbatron.causal_router")

SLUG = "causal-router"
ACTOR = "service:causal-router"
METRICS_KEY = "router:metrics"  # logical key, one hash per partition (see read_router_metrics)


class EventOutbox(Protocol):
    """Where the router writes the events it decides: its own outbox (streams.outbox)."""

    def transaction(self) -> AbstractContextManager[UnitOfWork]: ...


@dataclass(frozen=True, slots=True)
class RouterConfig:
    env: str
    max_envelope_bytes: int
    command_ttl_s: float
    commands_per_change_per_day: int
    limits: FoldLimits


@dataclass(frozen=True, slots=True)
class _Unadmitted:
    """A command ``process`` made, waiting for the batch's admission (``finish_batch``)."""

    project_id: str
    change_id: str | None
    day: str
    command_type: str


@dataclass
class RouterStats:
    """This process's figures (the exact, cross-process ones are in the metrics hash)."""

    sent: Counter[str] = field(default_factory=Counter)
    capped: Counter[str] = field(default_factory=Counter)
    classifier: Counter[str] = field(default_factory=Counter)
    stale_written: int = 0
    stale_repeated: int = 0


def _metric(name: str, n: int = 1) -> RedisOp:
    return RedisOp("HINCRBY", METRICS_KEY, (name, n))


def is_prefix(a: str, b: str) -> bool:
    """``a`` is a directory prefix of ``b`` (component-wise, not character-wise)."""
    return a != b and b.startswith(a.rstrip("/") + "/")


class CausalRouter(BaseProcessor):
    slug: ClassVar[str] = SLUG
    # Everything the rules or the fold need; purely informational types (project.created,
    # change.created, release.completed, agent.woken, model.routed) are not even claimed.
    consumes: ClassVar[frozenset[str] | None] = frozenset(FOLDERS)
    # 2: a task's blockedLimit, and a failure after a block keeps the task blocked.
    # 3: a blocked task holds its agent slot and agent until the failure that follows the block.
    reducer_version: ClassVar[str] = "3"
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

    def __init__(
        self,
        config: RouterConfig,
        *,
        judge: OverlapJudge,
        budget: CommandBudget,
        outbox: EventOutbox,
        clock: Clock,
    ) -> None:
        self.config = config
        self.judge = judge
        self.budget = budget
        self.outbox = outbox
        self.clock = clock
        self.stats = RouterStats()
        # This partition batch's commands by command id (the record id), until finish_batch.
        self._unadmitted: dict[str, _Unadmitted] = {}

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        return fold_event(state, event, self.config.limits)

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if state is None:
            raise ValueError(f"{SLUG}: no fold for {event.event_id}; reduce must run first")
        # The classifier's daily count and the outbox are written here, outside the runtime's
        # fenced commit: a process that lost the partition must not count or write, so
        # ownership is checked right before each (one Redis read, only for events that can do
        # either). The command cap is counted by finish_batch, which checks it again.
        declaring = event.event_type in DECLARING
        if declaring:
            delivery.check_owner()
        ops: list[RedisOp] = []
        planned = list(self._plan(event, state, ops))
        drafts = self._stale_drafts(event, state)
        if drafts and not declaring:
            delivery.check_owner()
        # Most events plan no command: the clock and the day are read only for those that do.
        records = (
            self._commands(event, planned, self.clock.now(), delivery.cursor_revision)
            if planned
            else []
        )
        if drafts:
            # Last: nothing that can still fail comes after it (a failure before it writes
            # nothing; a retry after it writes the same ids, which the outbox ignores).
            self._write_events(event, drafts)
            ops.append(_metric("stale_written", len(drafts)))
        return Effects(redis=ops, records=records)

    # -- the rules -----------------------------------------------------------------------------
    def _plan(self, event: Event, state: JSON, ops: list[RedisOp]) -> Iterator[Planned]:
        kind = event.event_type
        if kind in ("task.completed", "task.failed"):
            yield from self._dispatches(event, state)
        elif kind == "verification.started":
            started = read(event, payloads.VerificationStarted)
            if started.work_graph_completed:
                candidate = started.candidate_id
                yield Planned(
                    CANDIDATE_CREATE,
                    candidate,
                    event.change_id,
                    None,
                    {"candidateId": candidate, "causedBy": event.event_id},
                )
        elif kind == "canonical.advanced":
            generation = need_generation(event, read(event, payloads.CanonicalAdvanced).generation)
            for agent in active_agents(state):
                yield self._wake(
                    event, state, agent, "canonical-advanced", {"generation": generation}
                )
            yield self._index_build(event, generation)
        elif kind == "artifact.promoted":
            promoted = read(event, payloads.ArtifactPromoted)
            yield self._index_build(
                event, need_generation(event, promoted.generation), promoted.candidate_id
            )
        elif kind in DECLARING:
            yield from self._overlaps(event, state, ops)

    def _dispatches(self, event: Event, state: JSON) -> Iterator[Planned]:
        change = state["changes"].get(event.change_id)
        if change is None:
            return
        for name in sorted(change["tasks"]):
            task = change["tasks"][name]
            if task["by"] == event.event_id:
                yield Planned(
                    CHANGE_DISPATCH,
                    name,
                    event.change_id,
                    name,
                    {"taskId": name, "reason": task["why"], "causedBy": event.event_id},
                )

    def _index_build(self, event: Event, generation: int, candidate: str | None = None) -> Planned:
        payload: dict[str, Any] = {"generation": generation, "causedBy": event.event_id}
        if candidate is not None:
            payload["candidateId"] = candidate
        return Planned(INDEX_BUILD, f"generation-{generation}", event.change_id, None, payload)

    def _wake(
        self, event: Event, state: JSON, agent: str, reason: str, extra: dict[str, Any]
    ) -> Planned:
        change, task = min(state["agents"][agent]["tasks"])
        payload = {"agentId": agent, "reason": reason, "causedBy": event.event_id, **extra}
        return Planned(AGENT_WAKE, agent, change, task, payload)

    def _overlaps(self, event: Event, state: JSON, ops: list[RedisOp]) -> Iterator[Planned]:
        declaring, declared = declared_by(event, self.config.limits.max_resources)
        for agent in active_agents(state):
            if agent == declaring:
                continue
            held = state["agents"][agent]["resources"]
            exact = sorted(set(declared) & set(held))
            if exact:
                yield self._wake(
                    event, state, agent, "resource-overlap", {"resources": exact, "match": "exact"}
                )
                continue
            pairs = [(d, h) for d in declared for h in held if is_prefix(d, h) or is_prefix(h, d)]
            if not pairs:
                continue
            change, _ = min(state["agents"][agent]["tasks"])
            outcome = self.judge.judge(
                OverlapQuestion(
                    project_id=event.project_id,
                    change_id=change,
                    event_id=event.event_id,
                    event_type=event.event_type,
                    declaring_agent=declaring,
                    declared=tuple(declared),
                    active_agent=agent,
                    held=tuple(held),
                    overlaps=tuple(pairs),
                )
            )
            self.stats.classifier[outcome.value] += 1
            ops.append(_metric(f"classifier:{outcome.value}"))
            if outcome.wakes:
                yield self._wake(
                    event,
                    state,
                    agent,
                    "resource-overlap",
                    {
                        "resources": sorted({p for pair in pairs for p in pair}),
                        "match": "prefix",
                        "classifier": outcome.value,
                    },
                )

    # -- budget, commands, events ----------------------------------------------------------------
    def _commands(
        self, event: Event, planned: list[Planned], now: datetime, cursor_revision: int
    ) -> list[OutRecord]:
        day = now.strftime("%Y-%m-%d")
        records: list[OutRecord] = []
        for p in planned:
            command_id = rule_command_id(event.event_id, p.command_type, p.target, cursor_revision)
            command = make_command(
                command_id=command_id,
                command_type=p.command_type,
                project_id=event.project_id,
                change_id=p.change_id,
                task_id=p.task_id,
                payload=p.payload,
                now=now,
                ttl_s=self.config.command_ttl_s,
            )
            records.append(
                command_record(
                    command, env=self.config.env, max_bytes=self.config.max_envelope_bytes
                )
            )
            self._unadmitted[command_id] = _Unadmitted(
                event.project_id, p.change_id, day, p.command_type
            )
        return records

    def finish_batch(
        self, records: list[OutRecord], ops: list[RedisOp], check_owner: Callable[[], None]
    ) -> list[OutRecord]:
        """The batch's commands past the daily cap, admitted in one round trip in the batch's
        order; the others are counted and logged, not sent."""
        unadmitted, self._unadmitted = self._unadmitted, {}
        asked = [
            (r.record_id, unadmitted[r.record_id]) for r in records if r.record_id in unadmitted
        ]
        if not asked:
            return records
        check_owner()  # the cap is shared: a process that lost the partition must not count
        answers = self.budget.admit_all(
            [(u.project_id, u.change_id, u.day, command_id) for command_id, u in asked]
        )
        refused: set[str] = set()
        for (command_id, u), ok in zip(asked, answers, strict=True):
            if ok:
                self.stats.sent[u.command_type] += 1
                ops.append(_metric(f"commands_sent:{u.command_type}"))
                continue
            refused.add(command_id)
            self.stats.capped[u.command_type] += 1
            ops.append(_metric(f"commands_capped:{u.command_type}"))
            log.warning(
                "%s: %s %s for change %s of project %s not sent: %d commands per change per "
                "day reached on %s (commands_per_change_per_day)",
                SLUG,
                u.command_type,
                command_id,
                u.change_id or "(none)",
                u.project_id,
                self.config.commands_per_change_per_day,
                u.day,
            )
        return [r for r in records if r.record_id not in refused] if refused else records

    def _stale_drafts(self, event: Event, state: JSON) -> list[Draft]:
        if event.event_type != "canonical.advanced":
            return []
        generation = need_generation(event, read(event, payloads.CanonicalAdvanced).generation)
        drafts = []
        for name in sorted(state["candidates"]):
            candidate = state["candidates"][name]
            if candidate["by"] != event.event_id or candidate["status"] != STALE:
                continue
            drafts.append(
                Draft(
                    event_id=stable_event_id(candidate["change"], "candidate.stale", None, name),
                    event_type="candidate.stale",
                    project_id=event.project_id,
                    change_id=candidate["change"],
                    task_id=None,
                    actor=ACTOR,
                    payload={
                        "candidateId": name,
                        "generation": generation,
                        "causedBy": event.event_id,
                    },
                    canonical_generation=generation,
                )
            )
        return drafts

    def _write_events(self, event: Event, drafts: list[Draft]) -> None:
        with self.outbox.transaction() as unit:
            result = unit.append(event.project_id, drafts, tenant_id=event.tenant_id)
        self.stats.stale_written += len(result.events)
        self.stats.stale_repeated += len(result.duplicates)


def read_router_metrics(client: redis.Redis[bytes], env: str) -> dict[str, int]:
    """The router's exact metrics, summed over partitions: ``commands_sent:<type>``,
    ``commands_capped:<type>``, ``classifier:<outcome>``, ``stale_written``."""
    totals: dict[str, int] = {}
    pattern = f"rh:{env}:{{{SLUG}|*:x:{METRICS_KEY}"
    for key in client.scan_iter(match=pattern, count=1000):
        for name, value in client.hgetall(key).items():
            totals[name.decode()] = totals.get(name.decode(), 0) + int(value)
    return dict(sorted(totals.items()))
