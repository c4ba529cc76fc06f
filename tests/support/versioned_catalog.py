"""A catalog whose event type ``note.written`` has three versions, for the upcasting tests.

- v1: ``{"name": ...}``;
- v2: ``name`` renamed ``title``;
- v3: a new required field ``priority``; events written before it read as priority 0.

``note.read`` has one version; ``task.completed`` (the platform's type) is not in it at all.
"""

from __future__ import annotations

from typing import Any

from streams.catalog import Catalog, EventSpec
from streams.catalog.payloads import Payload, Text

NOTE = "note.written"
READ = "note.read"


class NoteV1(Payload):
    name: Text


class NoteV2(Payload):
    title: Text


class NoteV3(Payload):
    title: Text
    priority: int


def note_1_to_2(payload: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in payload.items() if key != "name"}
    out["title"] = payload["name"]
    return out


def note_2_to_3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "priority": 0}


def spec(name: str, version: int, model: type[Payload]) -> EventSpec:
    return EventSpec(name, version, model, "tests", "a note")


NOTE_SPECS = (spec(NOTE, 1, NoteV1), spec(NOTE, 2, NoteV2), spec(NOTE, 3, NoteV3))
UPCASTERS = {(NOTE, 1): note_1_to_2, (NOTE, 2): note_2_to_3}
VERSIONED = Catalog(events=(*NOTE_SPECS, spec(READ, 1, NoteV1)), commands=(), upcasters=UPCASTERS)
# The same types as a reader one release behind knows them: versions 1 and 2.
BEHIND = Catalog(
    events=(*NOTE_SPECS[:2], spec(READ, 1, NoteV1)),
    commands=(),
    upcasters={(NOTE, 1): note_1_to_2},
)

# A payload of each version, for the same note.
PAYLOADS: dict[int, dict[str, Any]] = {
    1: {"name": "plan"},
    2: {"title": "plan"},
    3: {"title": "plan", "priority": 2},
}
