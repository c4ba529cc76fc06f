"""The event and command catalog (docs/catalog.md): every type, its payload model per version,
and the upcasters that read an older version as the newest.

Read a payload through its model rather than the raw dict::

    from rhumbatron.catalog import CATALOG, TaskCompleted

    def process(self, event, state, delivery):
        agent = CATALOG.read(event, TaskCompleted).agent_id
"""

from __future__ import annotations

from streams.catalog import CATALOG, Catalog, CommandSpec, EventSpec, Upcaster
from streams.catalog.payloads import (
    AgentWake,
    AgentWoken,
    ArtifactPromoted,
    CandidateCreate,
    CandidateEvent,
    CandidateStale,
    CanonicalAdvanced,
    ChangeCreated,
    ChangeDispatch,
    ClaimReleased,
    CommandPayload,
    Declared,
    FixturePublish,
    ForksSweep,
    IndexBuild,
    IndexPurge,
    ModelRouted,
    Payload,
    ProjectCleanup,
    ProjectCreated,
    ProjectProvision,
    ReleaseCompleted,
    ReleaseStart,
    TaskBlocked,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskReady,
    TaskStarted,
    VerificationStart,
    VerificationStarted,
)

__all__ = [
    "CATALOG",
    "AgentWake",
    "AgentWoken",
    "ArtifactPromoted",
    "CandidateCreate",
    "CandidateEvent",
    "CandidateStale",
    "CanonicalAdvanced",
    "Catalog",
    "ChangeCreated",
    "ChangeDispatch",
    "ClaimReleased",
    "CommandPayload",
    "CommandSpec",
    "Declared",
    "EventSpec",
    "FixturePublish",
    "ForksSweep",
    "IndexBuild",
    "IndexPurge",
    "ModelRouted",
    "Payload",
    "ProjectCleanup",
    "ProjectCreated",
    "ProjectProvision",
    "ReleaseCompleted",
    "ReleaseStart",
    "TaskBlocked",
    "TaskCompleted",
    "TaskCreated",
    "TaskFailed",
    "TaskReady",
    "TaskStarted",
    "Upcaster",
    "VerificationStart",
    "VerificationStarted",
]
