"""Reading the causal router's input: the catalog fields an event must carry for
the router to fold it, each checked, with :class:`RouterInputError` naming the event, the field,
the value found and what was expected.
"""

from __future__ import annotations

from typing import Any

from streams.envelopes import Event
from streams.errors import RouterInputError


def event_ms(event: Event) -> int:
    return int(event.timestamp.timestamp() * 1000)


def need_change(event: Event) -> str:
    if event.change_id is None:
        raise RouterInputError(event, "changeId", None, "the change the task belongs to")
    return event.change_id


def need_task(event: Event) -> str:
    if event.task_id is None:
        raise RouterInputError(event, "taskId", None, "the task's id")
    return event.task_id


def need_text(event: Event, name: str) -> str:
    value = event.payload.get(name)
    if not isinstance(value, str) or not value.strip():
        raise RouterInputError(event, f"payload.{name}", value, "a non-empty string")
    return value


def optional_text(event: Event, name: str) -> str | None:
    if event.payload.get(name) is None:
        return None
    return need_text(event, name)


# The largest generation a fold holds: its state is JSON written by orjson, whose integers end
# at 2**64 - 1, so an event beyond it is refused as bad input rather than folded into a state
# that could never be stored.
MAX_GENERATION = 2**64 - 1
_GENERATION_RANGE = "an integer from 0 to 2**64 - 1"


def need_generation(event: Event) -> int:
    value = event.payload.get("generation", event.canonical_generation)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GENERATION:
        raise RouterInputError(event, "payload.generation", value, _GENERATION_RANGE)
    return value


def envelope_generation(event: Event) -> int | None:
    """The envelope's ``canonicalGeneration`` (None when absent), within MAX_GENERATION."""
    value = event.canonical_generation
    if value is not None and value > MAX_GENERATION:
        raise RouterInputError(event, "canonicalGeneration", value, _GENERATION_RANGE)
    return value


def need_flag(event: Event, name: str) -> bool:
    value = event.payload.get(name)
    if not isinstance(value, bool):
        raise RouterInputError(event, f"payload.{name}", value, "true or false")
    return value


def task_ids(event: Event, name: str) -> list[str]:
    value = event.payload.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RouterInputError(event, f"payload.{name}", value, "a list of task ids")
    return sorted(set(value))


def normalize_path(path: str) -> str:
    """Paths compare without trailing slashes: ``src/`` and ``src`` name the same directory."""
    return path.rstrip("/") or "/"


def resources(event: Event, *, required: bool, max_resources: int) -> list[str]:
    """The payload's ``resources`` (or the envelope's single ``resource``), normalized."""
    value: Any = event.payload.get("resources")
    if value is None and event.resource is not None:
        value = [event.resource]
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RouterInputError(event, "payload.resources", value, "a list of resource paths")
    if required and not value:
        raise RouterInputError(event, "payload.resources", value, "at least one resource path")
    if len(value) > max_resources:
        raise RouterInputError(
            event,
            "payload.resources",
            f"{len(value)} paths",
            f"at most {max_resources} (router_max_resources_per_event)",
        )
    return sorted({normalize_path(v) for v in value})
