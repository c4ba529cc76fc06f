"""The catalog's versions and upcasters: the invariants a catalog is refused without, and the
upcasters' chain on a test catalog where ``note.written`` has versions 1, 2 and 3 (a rename, then
a new required field with a default): pure, deterministic, applied 1→3 and 2→3, leaving alone
what is not theirs."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.catalog import CATALOG, Catalog
from streams.envelopes import Event, build, decode_event, encode
from streams.ids import stable_event_id
from tests.support.versioned_catalog import (
    BEHIND,
    NOTE,
    NOTE_SPECS,
    PAYLOADS,
    READ,
    UPCASTERS,
    VERSIONED,
    NoteV3,
    note_1_to_2,
    note_2_to_3,
    spec,
)
from tests.support.versioned_catalog import NoteV1 as Model

LIMIT = 64 * 1024


def note(version: int, payload: dict[str, Any], event_type: str = NOTE, **fields: Any) -> Event:
    return build(
        Event,
        event_id=stable_event_id(None, event_type, None, orjson.dumps(payload).decode()),
        event_type=event_type,
        event_version=version,
        tenant_id="t",
        project_id="p",
        actor="tests",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
        **fields,
    )


# -- the invariants ------------------------------------------------------------------------------


def _versions(catalog: Catalog) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in catalog.events:
        out.setdefault(s.name, []).append(s.version)
    return out


@pytest.mark.parametrize(
    "catalog", [CATALOG, VERSIONED, BEHIND], ids=["platform", "test", "behind"]
)
def test_every_type_runs_1_to_n_and_every_later_version_has_an_upcaster(catalog: Catalog) -> None:
    for name, versions in _versions(catalog).items():
        assert sorted(versions) == list(range(1, len(versions) + 1)), name
        assert catalog.latest(name) == len(versions)
        for version in versions[1:]:
            assert (name, version - 1) in catalog.upcasters, (name, version)
    for name, version in catalog.upcasters:
        assert catalog.event(name, version) is not None
        assert catalog.event(name, version + 1) is not None
    commands: dict[str, list[int]] = {}
    for c in catalog.commands:
        commands.setdefault(c.name, []).append(c.version)
    for name, versions in commands.items():
        assert sorted(versions) == list(range(1, len(versions) + 1)), name


def test_a_catalog_with_a_gap_a_repeat_or_a_missing_upcaster_is_refused() -> None:
    v1, v2, v3 = NOTE_SPECS
    with pytest.raises(ValueError, match=r"versions \[1, 3\].*without a gap"):
        Catalog(events=(v1, v3), commands=(), upcasters={(NOTE, 1): note_1_to_2})
    with pytest.raises(ValueError, match=r"versions \[1, 1\].*or a repeat"):
        Catalog(events=(v1, v1), commands=())
    with pytest.raises(ValueError, match=r"note.written@2 has no upcaster"):
        Catalog(events=(v1, v2), commands=())
    with pytest.raises(ValueError, match=r"note.written@3 has no upcaster"):
        Catalog(events=(v1, v2, v3), commands=(), upcasters={(NOTE, 1): note_1_to_2})


def test_an_upcaster_to_nowhere_from_no_version_or_not_a_function_is_refused() -> None:
    v1, v2, _ = NOTE_SPECS
    with pytest.raises(ValueError, match=r"upcaster from note.written@2.*n \+ 1"):
        Catalog(events=(v1, v2), commands=(), upcasters={**UPCASTERS})
    with pytest.raises(ValueError, match=r"upcaster from note.written@0"):
        Catalog(events=(v1,), commands=(), upcasters={(NOTE, 0): note_1_to_2})
    with pytest.raises(ValueError, match=r"upcaster from other.type@1"):
        Catalog(events=(v1,), commands=(), upcasters={("other.type", 1): note_1_to_2})
    with pytest.raises(ValueError, match="not a function"):
        Catalog(events=(v1, v2), commands=(), upcasters={(NOTE, 1): "rename"})  # type: ignore[dict-item]


def test_latest_and_is_newer() -> None:
    assert VERSIONED.latest(NOTE) == 3 and VERSIONED.latest(READ) == 1
    assert VERSIONED.latest("task.completed") == 0  # not cataloged here
    assert BEHIND.latest(NOTE) == 2
    assert BEHIND.is_newer(note(3, PAYLOADS[3]))
    assert not VERSIONED.is_newer(note(3, PAYLOADS[3]))
    assert not VERSIONED.is_newer(note(9, {}, "task.completed"))  # not cataloged: not newer


# -- the chain -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_the_chain_takes_every_older_version_to_the_newest(version: int) -> None:
    up = VERSIONED.upcast(note(version, PAYLOADS[version]))
    assert up.event_version == 3
    assert up.payload == {"title": "plan", "priority": 0}
    assert VERSIONED.check_payload("Event", NOTE, 3, up.payload) == NoteV3(title="plan", priority=0)


def test_a_reader_one_release_behind_upcasts_to_its_own_newest() -> None:
    assert BEHIND.upcast(note(1, PAYLOADS[1])).payload == {"title": "plan"}
    assert BEHIND.upcast(note(1, PAYLOADS[1])).event_version == 2


def test_the_newest_a_newer_one_and_types_not_cataloged_pass_untouched() -> None:
    for untouched in (
        note(3, PAYLOADS[3]),  # the newest
        note(4, {"anything": 1}),  # newer than the catalog knows: parked, not upcast
        note(1, {"name": "x"}, READ),  # one version only
        note(1, {"name": "x"}, "task.completed"),  # not in this catalog
    ):
        assert VERSIONED.upcast(untouched) is untouched


def test_upcasting_keeps_the_envelope_and_its_unknown_fields() -> None:
    # A newer writer's envelope field survives the upcast: only the payload and version change.
    old = note(1, {"name": "plan", "colour": "red"}, traceState="abc", slot=4)
    up = VERSIONED.upcast(old)
    assert up.model_extra == {"traceState": "abc"}
    assert up.payload == {"title": "plan", "priority": 0, "colour": "red"}  # kept, ignored
    assert (up.event_id, up.slot, up.timestamp) == (old.event_id, old.slot, old.timestamp)
    again = decode_event(encode(up, max_bytes=LIMIT), max_bytes=LIMIT)
    assert again == up


# -- purity --------------------------------------------------------------------------------------

json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
# A v1 payload: its name, and fields a writer added that the model does not name.
v1_payloads = st.builds(
    lambda name, rest: {**rest, "name": name},
    st.text(min_size=1, max_size=20).filter(str.strip),
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "name"), json_values, max_size=3),
)


@given(v1_payloads)
def test_every_upcaster_is_pure_and_deterministic(payload: dict[str, Any]) -> None:
    for upcaster in (note_1_to_2, note_2_to_3):
        before = copy.deepcopy(payload)
        first = upcaster(payload)
        assert payload == before  # its input is not changed
        assert upcaster(copy.deepcopy(payload)) == first  # the same input, the same output
        assert first is not payload
        payload = first


@given(v1_payloads)
def test_the_chain_is_pure_and_gives_a_valid_newest_payload(payload: dict[str, Any]) -> None:
    Model.model_validate(payload)  # a valid v1 payload
    old = note(1, payload)
    before = old.model_dump()
    up = VERSIONED.upcast(old)
    assert old.model_dump() == before  # the event it was given is unchanged
    assert VERSIONED.upcast(note(1, copy.deepcopy(payload))) == up
    assert up.payload["title"] == payload["name"] and up.payload["priority"] == 0
    VERSIONED.check_payload("Event", NOTE, 3, up.payload)
    # 1→3 is 1→2 then 2→3: the chain's steps compose.
    assert VERSIONED.upcast(note(2, note_1_to_2(payload))).payload == up.payload


def test_the_spec_helper_builds_a_catalog_like_the_platform_s() -> None:
    assert VERSIONED.event(NOTE) == spec(NOTE, 3, NoteV3)
    assert VERSIONED.event_types() == [READ, NOTE]
