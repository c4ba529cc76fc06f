"""Building causal-router processors and event histories for tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from consumers.runtime.types import TP, Delivery, Effects, Phase
from consumers.subscriptions.causal_router.budget import (
    CommandBudget,
    DailyCounter,
    MemoryCommandBudget,
    MemoryDailyCounter,
)
from consumers.subscriptions.causal_router.classifier import (
    Answer,
    Classifier,
    HeuristicClassifier,
    OverlapJudge,
    OverlapQuestion,
)
from consumers.subscriptions.causal_router.fold import FoldLimits
from consumers.subscriptions.causal_router.processor import CausalRouter, EventOutbox, RouterConfig
from streams.clock import Clock, ManualClock
from streams.envelopes import Command, Event, build, decode_command
from streams.ids import stable_event_id
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.sqlite_schema import SqliteOptions

ENV = "test"
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MAX_BYTES = 1 << 20


def open_test_outbox(path: Path, clock: Clock | None = None) -> SqliteOutbox:
    return SqliteOutbox(
        path,
        options=SqliteOptions(
            max_envelope_bytes=MAX_BYTES,
            missed_report_limit=100,
            busy_timeout_s=5.0,
            synchronous="NORMAL",
        ),
        clock=clock,
    )


def make_router(
    outbox: EventOutbox,
    *,
    clock: Clock | None = None,
    classifier: Classifier | None = None,
    counter: DailyCounter | None = None,
    budget: CommandBudget | None = None,
    agents_per_change: int = 8,
    commands_per_change_per_day: int = 1000,
    calls_per_day: int = 200,
    threshold: float = 0.7,
    history: int = 50,
    env: str = ENV,
) -> CausalRouter:
    clock = clock or ManualClock(START)
    return CausalRouter(
        RouterConfig(
            env=env,
            max_envelope_bytes=MAX_BYTES,
            command_ttl_s=3600.0,
            commands_per_change_per_day=commands_per_change_per_day,
            limits=FoldLimits(
                agents_per_change=agents_per_change, history=history, max_resources=1000
            ),
        ),
        judge=OverlapJudge(
            classifier or HeuristicClassifier(),
            counter or MemoryDailyCounter(),
            calls_per_day,
            threshold,
            clock.now,
        ),
        budget=budget or MemoryCommandBudget(commands_per_change_per_day),
        outbox=outbox,
        clock=clock,
    )


class ScriptedClassifier:
    """Answers from a script and records every question (a unit-test stand-in for a model)."""

    name = "scripted"

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.questions: list[OverlapQuestion] = []

    def classify(self, question: OverlapQuestion) -> Answer:
        self.questions.append(question)
        return self.answer


@dataclass
class History:
    """Events of one project, numbered and timed in order (slots 1, 2, 3 ...)."""

    project: str = "proj-1"
    tenant: str = "tenant-1"
    events: list[Event] = field(default_factory=list)

    def add(
        self,
        event_type: str,
        *,
        change: str | None = "chg-1",
        task: str | None = None,
        key: str | None = None,
        canonical_generation: int | None = None,
        **payload: Any,
    ) -> Event:
        n = len(self.events) + 1
        event = build(
            Event,
            event_id=stable_event_id(change, event_type, task, f"{self.project}/{key or n}"),
            event_type=event_type,
            tenant_id=self.tenant,
            project_id=self.project,
            change_id=change,
            task_id=task,
            actor="test",
            canonical_generation=canonical_generation,
            timestamp=START + timedelta(seconds=n),
            payload=payload,
            slot=n,
        )
        self.events.append(event)
        return event


def delivery(offset: int = 0, revision: int = 0) -> Delivery:
    return Delivery(TP("s0", 0), offset, Phase.LIVE, True, revision)


class Driver:
    """Folds and processes events in order as the runtime would (no transport, no claims), each
    event a batch of its own."""

    def __init__(self, router: CausalRouter, *, revision: int = 0) -> None:
        self.router = router
        self.revision = revision  # the cursor revision every delivery carries
        self.states: dict[str, Any] = {}
        self.offset = 0
        self.effects: list[Effects] = []

    def feed(self, events: Iterable[Event]) -> list[Command]:
        out: list[Command] = []
        for event in events:
            self.offset += 1
            if self.router.consumes is not None and event.event_type not in self.router.consumes:
                continue
            state = self.router.reduce(self.states.get(event.project_id), event)
            given = delivery(self.offset, self.revision)
            effects = self.router.process(event, state, given)
            # Each event a batch of its own: its commands are admitted right after it.
            effects.records = self.router.finish_batch(
                effects.records, effects.redis, given.check_owner
            )
            self.states[event.project_id] = state
            self.effects.append(effects)
            out.extend(decode_command(r.value, max_bytes=MAX_BYTES) for r in effects.records)
        return out

    def fold(self, events: Iterable[Event]) -> None:
        """Fold only (what the history did before the event under test)."""
        for event in events:
            if self.router.consumes is None or event.event_type in self.router.consumes:
                self.states[event.project_id] = self.router.reduce(
                    self.states.get(event.project_id), event
                )


def drive(router: CausalRouter, events: Iterable[Event]) -> list[Command]:
    """The commands of ``events`` folded and processed in order by a fresh driver."""
    return Driver(router).feed(events)


def graph_history(project: str = "proj-1", change: str = "chg-1") -> History:
    """One change's life: 12 tasks with dependencies run by 3 agents, overlapping resources,
    an early candidate that goes stale, verification, promotion and a canonical advance — with
    an agent of a second change still at work when the generation advances.

    Graph: t01 → t02, t03, t04; t02 → t05; t02 + t03 → t06; t04 → t07; t05 + t06 → t08;
    t06 + t07 → t09; t08 → t10; t09 → t11; t10 + t11 → t12. Agents a, b, c take the tasks in
    turn (t01 a, t02 b, t03 c, t04 a, ...). Intents beyond each task's own path, in wave 2:
    b declares ``src/api`` (a prefix of c's ``src/api/models``: 2 of 3 parts, the heuristic
    abstains → wake c); c declares ``src/api/routes.py`` (b holds it: exact → wake b); a declares
    a deep path under ``src/api/models`` (b's ``src/api`` shares 2 of 7 parts: skip; c's
    ``src/api/models`` 3 of 7: abstain → wake c)."""
    deps = {
        "t01": [],
        "t02": ["t01"],
        "t03": ["t01"],
        "t04": ["t01"],
        "t05": ["t02"],
        "t06": ["t02", "t03"],
        "t07": ["t04"],
        "t08": ["t05", "t06"],
        "t09": ["t06", "t07"],
        "t10": ["t08"],
        "t11": ["t09"],
        "t12": ["t10", "t11"],
    }
    paths = {
        "t01": "src/core/config.py",
        "t02": "src/api/routes.py",
        "t03": "src/api/models",
        "t04": "docs",
        "t05": "src/api/routes.py",
        "t06": "src/api/models/user.py",
        "t07": "docs/guide/api/v2/index.md",
        "t08": "src/api",
        "t09": "tests/api",
        "t10": "src/api/routes.py",
        "t11": "tests/api/test_models.py",
        "t12": "README.md",
    }
    agents = {t: f"agent-{'abc'[i % 3]}" for i, t in enumerate(deps)}
    intents = {t: [p] for t, p in paths.items()}
    intents["t02"] = ["src/api"]
    intents["t03"] = ["src/api/models", "src/api/routes.py"]
    intents["t04"] = ["docs", "src/api/models/v1/schemas/deep/user.py"]
    h = History(project=project)
    h.add(
        "verification.started",
        change=change,
        candidateId=f"{change}-cand-0",
        workGraphCompleted=False,
    )
    for t, d in deps.items():
        h.add(
            "task.created",
            change=change,
            task=f"{change}-{t}",
            dependsOn=[f"{change}-{x}" for x in d],
            resources=[paths[t]],
        )
    waves = [
        ["t01"],
        ["t02", "t03", "t04"],
        ["t05", "t06", "t07"],
        ["t08", "t09"],
        ["t10", "t11"],
        ["t12"],
    ]
    for wave in waves:
        for t in wave:
            task = f"{change}-{t}"
            h.add("task.ready", change=change, task=task)
            h.add("task.started", change=change, task=task, agentId=agents[t])
        for t in wave:
            task = f"{change}-{t}"
            h.add(
                "intent.declared", change=change, task=task, agentId=agents[t], resources=intents[t]
            )
        for t in wave:
            h.add("task.completed", change=change, task=f"{change}-{t}", agentId=agents[t])
    other = f"{change}-next"
    h.add("task.created", change=other, task=f"{other}-t01", resources=["src/next"])
    h.add("task.ready", change=other, task=f"{other}-t01")
    h.add("task.started", change=other, task=f"{other}-t01", agentId="agent-d")
    h.add(
        "verification.started",
        change=change,
        candidateId=f"{change}-cand-1",
        workGraphCompleted=True,
    )
    h.add("candidate.created", change=change, candidateId=f"{change}-cand-1")
    h.add("candidate.verified", change=change, candidateId=f"{change}-cand-1")
    h.add("artifact.promoted", change=change, candidateId=f"{change}-cand-1", generation=1)
    h.add("canonical.advanced", change=None, generation=1)
    return h
