"""The fold copies only the parts of a state an event's folder may change: against the fold as
it was first written (a whole copy of the state, then the folder), every event of shuffled,
thinned, repeated and corrupted project histories gives the same state or the same error, and
leaves the state it was given as it was."""

from __future__ import annotations

import copy
import dataclasses
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.runtime.types import JSON
from consumers.subscriptions.causal_router.fold import (
    FOLDERS,
    WRITTEN_PARTS,
    FoldLimits,
    empty_state,
    fold_event,
)
from streams.envelopes import Draft, Event
from streams.errors import RouterInputError
from streams.workload import project_events

LIMITS = FoldLimits(agents_per_change=2, history=3, max_resources=50)
START = datetime(2026, 1, 1, tzinfo=UTC)
HUGE = 2**70


def whole_copy_fold(state: JSON | None, event: Event, limits: FoldLimits) -> JSON:
    s: JSON = orjson.loads(orjson.dumps(state)) if state is not None else empty_state()
    folder = FOLDERS.get(event.event_type)
    if folder is not None:
        folder(s, event, limits)
    return s


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # the whole point: any error must be the same error
        return "error", (type(exc), str(exc))


def corrupted(draft: Draft, rng: random.Random) -> Draft:
    choice = rng.randrange(6)
    if choice == 0:
        return dataclasses.replace(draft, payload={})
    if choice == 1:
        return dataclasses.replace(draft, payload={**draft.payload, "agentId": "agent-x"})
    if choice == 2:
        return dataclasses.replace(draft, payload={**draft.payload, "generation": HUGE})
    if choice == 3:
        return dataclasses.replace(draft, canonical_generation=HUGE)
    if choice == 4:
        return dataclasses.replace(draft, change_id=None)
    return dataclasses.replace(draft, payload={**draft.payload, "resources": ["src/", "src/a"]})


def history(seed: int, length: int) -> list[Event]:
    rng = random.Random(seed)
    drafts: list[Draft] = []
    for project in ("p1", "p2"):
        drafts += project_events(project, length)
    if rng.random() < 0.3:
        rng.shuffle(drafts)
    out: list[Draft] = []
    for draft in drafts:
        roll = rng.random()
        if roll < 0.08:
            continue
        out.append(corrupted(draft, rng) if roll < 0.2 else draft)
        if roll > 0.95:
            out.append(draft)
    return [
        d.to_event(tenant_id="t", timestamp=START + timedelta(seconds=n), slot=None)
        for n, d in enumerate(out)
    ]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 60))
def test_partial_copies_fold_as_whole_copies(seed: int, length: int) -> None:
    states: dict[str, JSON | None] = {}
    partial_copies = 0
    for event in history(seed, length):
        state = states.get(event.project_id)
        before = copy.deepcopy(state)
        found = outcome(lambda s=state, e=event: fold_event(s, e, LIMITS))
        assert found == outcome(lambda s=state, e=event: whole_copy_fold(s, e, LIMITS)), event
        assert state == before  # the state given is never changed, on success or failure
        if found[0] == "ok":
            states[event.project_id] = found[1]
            partial_copies += event.event_type in WRITTEN_PARTS and state is not None
    assert length < 5 or partial_copies > 0


@pytest.mark.parametrize(
    ("event_type", "change", "field"),
    [
        ("canonical.advanced", {"payload": {"generation": HUGE}}, "payload.generation"),
        ("artifact.promoted", {"payload": {"generation": HUGE}}, "payload.generation"),
        ("verification.started", {"canonical_generation": HUGE}, "canonicalGeneration"),
    ],
)
def test_a_generation_beyond_what_a_state_can_store_is_refused_naming_the_field(
    event_type: str, change: dict[str, Any], field: str
) -> None:
    # A fold is JSON written by orjson (integers up to 2**64 - 1): an event with a larger
    # generation is bad input, refused before anything is folded, never a state that a later
    # event or the store's commit would fail on.
    state: JSON | None = None
    for draft in project_events("p1", 60):
        if draft.event_type != event_type:
            event = draft.to_event(tenant_id="t", timestamp=START, slot=None)
            state = fold_event(state, event, LIMITS)
            continue
        payload = {**draft.payload, **change.get("payload", {})}
        bad = dataclasses.replace(
            draft,
            payload=payload,
            canonical_generation=change.get("canonical_generation", draft.canonical_generation),
        ).to_event(tenant_id="t", timestamp=START, slot=None)
        before = copy.deepcopy(state)
        with pytest.raises(RouterInputError) as refused:
            fold_event(state, bad, LIMITS)
        bound = "2**64 - 1" if field == "canonicalGeneration" else str(2**64 - 1)
        assert field in str(refused.value) and bound in str(refused.value)
        assert state == before
        return
    raise AssertionError(f"no {event_type} in the history")


def test_a_promotion_naming_no_change_marks_its_candidates_change_in_a_copy() -> None:
    # artifact.promoted writes the change its candidate names, which the event may not carry.
    state: JSON | None = None
    for draft in project_events("p1", 60):
        event = draft.to_event(tenant_id="t", timestamp=START, slot=None)
        if draft.event_type != "artifact.promoted":
            state = fold_event(state, event, LIMITS)
            continue
        assert state is not None
        bare = dataclasses.replace(draft, change_id=None).to_event(
            tenant_id="t", timestamp=START, slot=None
        )
        before = copy.deepcopy(state)
        promoted = fold_event(state, bare, LIMITS)
        assert state == before
        assert promoted == whole_copy_fold(state, bare, LIMITS)
        assert promoted["changes"][draft.change_id]["finishedAt"] is not None
        return
    raise AssertionError("no artifact.promoted in the history")
