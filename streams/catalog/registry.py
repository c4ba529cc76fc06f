"""The catalog: every event and command type the platform defines, who writes it, what its
payload holds (its model, per version), what it causes and where a command goes.

``CATALOG`` is the platform's; a ``Catalog`` is a value, so a test (or a team with its own
types) can build another. Three questions are answered here and nowhere else:

- what a (type, version)'s payload must hold: :meth:`Catalog.check_payload`;
- the newest version of a type this code knows: :meth:`Catalog.latest`;
- how an event of an older version reads as the newest: :meth:`Catalog.upcast`, the chain of
  pure functions version n → n+1, applied on every path that decodes an event for a consumer.

Types not in the catalog (a team's own) pass through untouched: no payload check, no upcast.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from streams.catalog import payloads as p
from streams.envelopes import MISSING, Event
from streams.errors import EnvelopeError, UpcastFailed

# Version n's payload (a JSON object) in, version n + 1's out. Pure: no input mutated, no clock,
# no I/O; the same payload always gives the same result (tests/streams/test_catalog.py).
P = TypeVar("P", bound=p.Payload)

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class EventSpec:
    name: str
    version: int
    payload: type[p.Payload]
    producer: str
    meaning: str
    # The commands the causal router sends for it (empty: informational for the router).
    causes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommandSpec:
    name: str
    version: int
    payload: type[p.Payload]
    queue: str
    producer: str
    meaning: str


@dataclass(frozen=True)
class Catalog:
    events: tuple[EventSpec, ...]
    commands: tuple[CommandSpec, ...]
    # (type, n) → the upcaster from version n to n + 1.
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)
    _latest: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for kind, specs in (("event", self.events), ("command", self.commands)):
            seen: dict[str, list[int]] = {}
            for spec in specs:
                seen.setdefault(spec.name, []).append(spec.version)
            for name, versions in seen.items():
                if sorted(versions) != list(range(1, len(versions) + 1)):
                    raise ValueError(
                        f"{kind} type {name!r} has versions {sorted(versions)}: "
                        "they must run 1, 2, 3 … without a gap or a repeat"
                    )
        for (name, version), upcaster in self.upcasters.items():
            # Version 0 is no version: an upcaster from it would never run, yet looked valid.
            if version < 1 or self._event(name, version + 1) is None:
                raise ValueError(
                    f"an upcaster from {name}@{version}, but no event type {name} at versions "
                    f"{version} and {version + 1}: an upcaster goes from a cataloged version n "
                    "(1 or more) to n + 1"
                )
            if not callable(upcaster):
                raise ValueError(f"the upcaster from {name}@{version} is not a function")
        for spec in self.events:
            if spec.version > 1 and (spec.name, spec.version - 1) not in self.upcasters:
                raise ValueError(
                    f"{spec.name}@{spec.version} has no upcaster from the version before"
                )
        # The newest version of each type, looked up for every event a consumer decodes.
        latest: dict[str, int] = {}
        for spec in self.events:
            latest[spec.name] = max(latest.get(spec.name, 0), spec.version)
        object.__setattr__(self, "_latest", latest)

    # -- lookups ---------------------------------------------------------------------------------
    def _event(self, name: str, version: int) -> EventSpec | None:
        return next((s for s in self.events if s.name == name and s.version == version), None)

    def event(self, name: str, version: int | None = None) -> EventSpec | None:
        """The spec of ``name`` at ``version`` (the newest when None); None when not cataloged."""
        return self._event(name, self.latest(name) if version is None else version)

    def command(self, name: str, version: int | None = None) -> CommandSpec | None:
        specs = [s for s in self.commands if s.name == name]
        if not specs:
            return None
        wanted = max(s.version for s in specs) if version is None else version
        return next((s for s in specs if s.version == wanted), None)

    def latest(self, name: str) -> int:
        """The newest version of event type ``name`` this code knows; 0 when not cataloged."""
        return self._latest.get(name, 0)

    def event_types(self) -> list[str]:
        return sorted({s.name for s in self.events})

    def command_types(self) -> list[str]:
        return sorted({s.name for s in self.commands})

    def queues(self) -> dict[str, str]:
        """Every cataloged command type's queue purpose."""
        return {s.name: s.queue for s in self.commands}

    # -- checks ------------------------------------------------------------------------------------
    def check_payload(
        self, kind: str, name: str, version: int | None, payload: Mapping[str, Any]
    ) -> p.Payload | None:
        """``payload`` read as the model of ``name``@``version`` (the newest when None; ``kind``
        is "Event" or "Command"); None when the type is not cataloged at that version. Raises EnvelopeError naming the
        field (``payload.agentId``), the value and the rule."""
        spec = self.event(name, version) if kind == "Event" else self.command(name, version)
        if spec is None:
            # Not cataloged, or a version newer than this code knows: a publisher or writer of
            # an older release passes it on (consumers upgraded first read it; others park it).
            return None
        try:
            return spec.payload.model_validate(payload)
        except ValidationError as exc:
            raise _payload_error(kind, name, spec.version, exc) from exc

    def read(self, event: Event, model: type[P]) -> P:
        """``event``'s payload as ``model``, which must be the catalog's model of its type at its
        version (consumers see events upcast to the newest version they know). Raises
        EnvelopeError naming the field, the value and the rule."""
        spec = self.event(event.event_type, event.event_version)
        if spec is None or spec.payload is not model:
            # A wiring mistake of ours, not bad input: the reader and the catalog disagree.
            raise TypeError(
                f"{event.event_type}@{event.event_version} payloads are not read as "
                f"{model.__name__}"
            )
        try:
            return model.model_validate(event.payload)
        except ValidationError as exc:
            raise _payload_error("Event", spec.name, spec.version, exc) from exc

    def upcast(self, event: Event) -> Event:
        """``event`` as the newest version of its type this code knows; unchanged when it is
        that already, not cataloged, or newer than this code knows (see :meth:`is_newer`)."""
        latest = self.latest(event.event_type)
        version = event.event_version
        if not 0 < version < latest:
            return event
        payload: dict[str, Any] = copy.deepcopy(event.payload)
        while version < latest:
            try:
                payload = self.upcasters[(event.event_type, version)](payload)
            except Exception as exc:
                raise UpcastFailed(event.event_type, event.event_id, version, exc) from exc
            version += 1
        return event.model_copy(update={"payload": payload, "event_version": version})

    def is_newer(self, event: Event) -> bool:
        """Is ``event`` of a version of a cataloged type newer than this code knows?"""
        latest = self.latest(event.event_type)
        return 0 < latest < event.event_version


def _payload_error(kind: str, name: str, version: int, exc: ValidationError) -> EnvelopeError:
    error = exc.errors(include_url=False)[0]
    where = ".".join(["payload", *(str(part) for part in error["loc"])])
    if error["type"] == "missing":
        return EnvelopeError(kind, where, MISSING, f"required field is missing ({name}@{version})")
    return EnvelopeError(kind, where, error.get("input"), f"{_rule(error)} ({name}@{version})")


def _rule(error: Any) -> str:
    """pydantic's message, said as the rule the value broke."""
    context = error.get("ctx", {})
    kind = error["type"]
    if kind == "string_pattern_mismatch" and context.get("pattern") == r"\S":
        return "must not be blank"
    if kind == "string_too_short":
        return f"must have at least {context['min_length']} character(s)"
    if kind == "string_too_long":
        return f"must have at most {context['max_length']} characters"
    if kind == "too_long":
        return f"must have at most {context['max_length']} items"
    message = str(error["msg"])
    if message.startswith("Input should be "):
        return "must be " + message.removeprefix("Input should be ")
    return message[0].lower() + message[1:]


def _events(
    rows: Iterable[tuple[str, type[p.Payload], str, str, tuple[str, ...]]],
) -> tuple[EventSpec, ...]:
    return tuple(
        EventSpec(t, 1, model, who, meaning, causes) for t, model, who, meaning, causes in rows
    )


_API = "project service"
_AGENT = "agent runtime"
_INTEGRATION = "integration service"
_VERIFY = "verification service"
_ROUTER = "causal router"
_DEAD = "dead-letter consumer"

CATALOG = Catalog(
    events=_events(
        [
            ("project.created", p.ProjectCreated, _API, "a project exists", ()),
            ("change.created", p.ChangeCreated, _API, "a unit of work is opened", ()),
            (
                "task.created",
                p.TaskCreated,
                _INTEGRATION,
                "a task joins the change's work graph",
                (),
            ),
            ("task.ready", p.TaskReady, _INTEGRATION, "a task's dependencies are done", ()),
            ("task.started", p.TaskStarted, _AGENT, "an agent took the task", ()),
            (
                "task.completed",
                p.TaskCompleted,
                _AGENT,
                "the task is done; its agent is free",
                ("change.dispatch",),
            ),
            (
                "task.failed",
                p.TaskFailed,
                f"{_AGENT}, {_DEAD}",
                "the task failed; its agent is free",
                ("change.dispatch",),
            ),
            ("task.blocked", p.TaskBlocked, _DEAD, "a limit stopped the task", ()),
            (
                "intent.declared",
                p.Declared,
                _AGENT,
                "an agent will touch these paths",
                ("agent.wake",),
            ),
            (
                "challenge.raised",
                p.Declared,
                _AGENT,
                "an agent contests these paths",
                ("agent.wake",),
            ),
            (
                "changeset.proposed",
                p.Declared,
                _AGENT,
                "an agent proposes changes to these paths",
                ("agent.wake",),
            ),
            ("claim.acquired", p.Declared, _AGENT, "an agent holds these paths", ("agent.wake",)),
            ("claim.released", p.ClaimReleased, _AGENT, "an agent let these paths go", ()),
            (
                "verification.started",
                p.VerificationStarted,
                _VERIFY,
                "a change's candidate is being verified",
                ("candidate.create",),
            ),
            ("candidate.created", p.CandidateEvent, _VERIFY, "a candidate was composed", ()),
            (
                "candidate.verified",
                p.CandidateEvent,
                _VERIFY,
                "a candidate passed verification",
                (),
            ),
            (
                "candidate.rejected",
                p.CandidateEvent,
                _VERIFY,
                "a candidate failed verification",
                (),
            ),
            (
                "candidate.stale",
                p.CandidateStale,
                _ROUTER,
                "a newer generation made a candidate stale",
                (),
            ),
            (
                "artifact.promoted",
                p.ArtifactPromoted,
                _INTEGRATION,
                "a verified candidate was promoted",
                ("index.build",),
            ),
            (
                "canonical.advanced",
                p.CanonicalAdvanced,
                _INTEGRATION,
                "the project's canonical generation moved",
                ("agent.wake", "index.build"),
            ),
            (
                "release.completed",
                p.ReleaseCompleted,
                "release service",
                "a generation was released",
                (),
            ),
            ("agent.woken", p.AgentWoken, _AGENT, "an agent was woken", ()),
            ("model.routed", p.ModelRouted, _AGENT, "a model was chosen for a task", ()),
        ]
    ),
    commands=(
        CommandSpec(
            "agent.wake",
            1,
            p.AgentWake,
            "agent-wakeups",
            f"{_ROUTER}, integration worker",
            "wake an agent: work or a conflict waits for it",
        ),
        CommandSpec(
            "change.dispatch",
            1,
            p.ChangeDispatch,
            "integration",
            _ROUTER,
            "run a task whose dependencies are done",
        ),
        CommandSpec(
            "candidate.create",
            1,
            p.CandidateCreate,
            "integration",
            _ROUTER,
            "compose the change's candidate",
        ),
        CommandSpec(
            "forks.sweep",
            1,
            p.ForksSweep,
            "integration",
            f"{_ROUTER} (maintenance)",
            "remove the forks of finished changes",
        ),
        CommandSpec(
            "project.provision",
            1,
            p.ProjectProvision,
            "integration",
            _API,
            "set up a new project's resources",
        ),
        CommandSpec(
            "project.cleanup",
            1,
            p.ProjectCleanup,
            "integration",
            f"{_ROUTER} (maintenance)",
            "remove retired candidates",
        ),
        CommandSpec(
            "fixture.publish", 1, p.FixturePublish, "integration", _API, "publish test fixtures"
        ),
        CommandSpec(
            "index.build", 1, p.IndexBuild, "indexing", _ROUTER, "index a promoted generation"
        ),
        CommandSpec(
            "index.purge",
            1,
            p.IndexPurge,
            "indexing",
            f"{_ROUTER} (maintenance)",
            "drop indexes older than a generation",
        ),
        CommandSpec(
            "verification.start",
            1,
            p.VerificationStart,
            "verification",
            _INTEGRATION,
            "start verifying a candidate",
        ),
        CommandSpec(
            "release.start",
            1,
            p.ReleaseStart,
            "release",
            _INTEGRATION,
            "start releasing a generation",
        ),
    ),
)
