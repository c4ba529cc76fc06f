"""rhumbatron.catalog: every payload model of the catalog, importable from the public package."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

import rhumbatron.catalog as public
from streams.catalog import payloads
from streams.errors import EnvelopeError
from streams.workload import project_events

START = datetime(2026, 1, 1, tzinfo=UTC)


def test_every_payload_model_is_public() -> None:
    models = {
        name
        for name, value in vars(payloads).items()
        if inspect.isclass(value) and issubclass(value, payloads.Payload)
    }
    assert models <= set(public.__all__)
    used = [s.payload for s in public.CATALOG.events] + [s.payload for s in public.CATALOG.commands]
    for model in used:
        assert getattr(public, model.__name__) is model


def test_a_processor_reads_a_payload_through_its_model() -> None:
    events = [
        d.to_event(tenant_id="t", timestamp=START, slot=n)
        for n, d in enumerate(project_events("p1", 40), 1)
    ]
    completed = next(e for e in events if e.event_type == "task.completed")
    assert public.CATALOG.read(completed, public.TaskCompleted).agent_id.startswith("agent-")
    bad = completed.model_copy(update={"payload": {"agentId": ""}})
    with pytest.raises(EnvelopeError, match=r"payload\.agentId.*at least 1 character"):
        public.CATALOG.read(bad, public.TaskCompleted)
    with pytest.raises(TypeError, match="not read as TaskStarted"):
        public.CATALOG.read(completed, public.TaskStarted)
