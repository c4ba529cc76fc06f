"""The payload models of every cataloged event and command type, one class per (type, version).

A payload is open: a field the model does not name is kept and ignored (``extra="allow"``), so a
writer may add an optional field without breaking a reader that does not know it yet. A named
field is checked strictly (no coercion: ``"3"`` is not a generation). Python names are
snake_case, the wire names camelCase, as in the envelopes.

A model changes only by gaining optional fields; any other change is a new version of the type
(a new class, registered in ``streams.catalog.registry`` with an upcaster from the one before).
``make check`` holds the generated JSON Schemas in ``schemas/`` to these classes and to the
compatibility rule (docs/contract.md).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A name that says something: at least one character that is not white space.
Text = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"\S")]
# Generations are stored as JSON integers by orjson, which ends at 2**64 - 1.
Generation = Annotated[int, Field(ge=0, le=2**64 - 1)]
Paths = Annotated[list[Text], Field(max_length=10_000)]


class Payload(BaseModel):
    """The base of every payload model: open, strict, frozen, camelCase on the wire."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="allow",
        alias_generator=to_camel,
        populate_by_name=True,
    )


# -- events ------------------------------------------------------------------------------------


class ProjectCreated(Payload):
    name: Text


class ChangeCreated(Payload):
    client_request_id: Text | None = None
    title: Text | None = None


class TaskCreated(Payload):
    depends_on: list[Text] = Field(default_factory=list)
    resources: Paths | None = None


class TaskReady(Payload):
    pass


class TaskStarted(Payload):
    agent_id: Text


class TaskCompleted(Payload):
    agent_id: Text


class TaskFailed(Payload):
    agent_id: Text | None = None
    reason: Text | None = None
    blocked_limit: Text | None = None
    command_id: Text | None = None


class TaskBlocked(Payload):
    blocked_limit: Text | None = None
    command_id: Text | None = None


class Declared(Payload):
    """intent.declared, challenge.raised, changeset.proposed, claim.acquired: the paths an agent
    intends to touch. ``resources`` may be left out when the envelope's ``resource`` names one."""

    agent_id: Text
    resources: Paths | None = None


class ClaimReleased(Payload):
    agent_id: Text
    resources: Paths | None = None


class VerificationStarted(Payload):
    candidate_id: Text
    work_graph_completed: bool


class CandidateEvent(Payload):
    """candidate.created, candidate.verified, candidate.rejected."""

    candidate_id: Text


class CandidateStale(Payload):
    candidate_id: Text
    generation: Generation | None = None
    caused_by: Text | None = None


class ArtifactPromoted(Payload):
    """``generation`` may be left out when the envelope's ``canonicalGeneration`` carries it."""

    candidate_id: Text
    generation: Generation | None = None


class CanonicalAdvanced(Payload):
    """``generation`` may be left out when the envelope's ``canonicalGeneration`` carries it."""

    generation: Generation | None = None


class ReleaseCompleted(Payload):
    release_id: Text
    generation: Generation | None = None


class AgentWoken(Payload):
    agent_id: Text
    reason: Text


class ModelRouted(Payload):
    model: Text
    reason: Text


# -- commands ----------------------------------------------------------------------------------


class CommandPayload(Payload):
    """Every command may name the event that caused it and the tenant it works for (the
    dead-letter path writes its events for that tenant)."""

    caused_by: Text | None = None
    tenant_id: Text | None = None


class AgentWake(CommandPayload):
    agent_id: Text
    reason: Text
    generation: Generation | None = None
    resources: Paths | None = None
    match: Text | None = None
    classifier: Text | None = None


class ChangeDispatch(CommandPayload):
    task_id: Text
    reason: Text | None = None


class CandidateCreate(CommandPayload):
    candidate_id: Text


class ForksSweep(CommandPayload):
    change_ids: list[Text]
    complete: bool


class ProjectCleanup(CommandPayload):
    candidate_ids: list[Text]
    complete: bool


class IndexBuild(CommandPayload):
    generation: Generation
    candidate_id: Text | None = None


class IndexPurge(CommandPayload):
    keep_generation: Generation


class VerificationStart(CommandPayload):
    candidate_id: Text


class ReleaseStart(CommandPayload):
    release_id: Text
    generation: Generation | None = None


class ProjectProvision(CommandPayload):
    pass


class FixturePublish(CommandPayload):
    pass
