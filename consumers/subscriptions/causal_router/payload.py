"""Reading the causal router's input through the catalog's payload models
(``streams.catalog.payloads``, docs/catalog.md): each folder reads its event's payload as the
model of its type, and a payload the model refuses raises :class:`RouterInputError` naming the
event, the field, the value found and what was expected. Rules that span the payload and the
envelope (a generation in either, the envelope's single ``resource``) are read here too.
"""

from __future__ import annotations

from typing import TypeVar

from streams.catalog import CATALOG
from streams.catalog.payloads import Payload
from streams.envelopes import MISSING, Event
from streams.errors import EnvelopeError, RouterInputError

P = TypeVar("P", bound=Payload)


def read(event: Event, model: type[P]) -> P:
    """``event``'s payload as ``model``, the catalog's model of its type."""
    try:
        return CATALOG.read(event, model)
    except EnvelopeError as exc:
        if exc.value is MISSING:
            raise RouterInputError(event, exc.field, None, f"a value: {exc.reason}") from exc
        raise RouterInputError(
            event, exc.field, exc.value, exc.reason.removeprefix("must be ")
        ) from exc


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


# The largest generation a fold holds: its state is JSON written by orjson, whose integers end
# at 2**64 - 1 (the payload models' bound too), so an envelope beyond it is refused as bad input
# rather than folded into a state that could never be stored.
MAX_GENERATION = 2**64 - 1
_GENERATION_RANGE = "an integer from 0 to 2**64 - 1"


def need_generation(event: Event, generation: int | None) -> int:
    """The payload's ``generation`` (already checked by its model), else the envelope's."""
    value = generation if generation is not None else envelope_generation(event)
    if value is None:
        raise RouterInputError(
            event, "payload.generation", None, f"{_GENERATION_RANGE} (or canonicalGeneration)"
        )
    return value


def envelope_generation(event: Event) -> int | None:
    """The envelope's ``canonicalGeneration`` (None when absent), within MAX_GENERATION."""
    value = event.canonical_generation
    if value is not None and value > MAX_GENERATION:
        raise RouterInputError(event, "canonicalGeneration", value, _GENERATION_RANGE)
    return value


def normalize_path(path: str) -> str:
    """Paths compare without trailing slashes: ``src/`` and ``src`` name the same directory."""
    return path.rstrip("/") or "/"


def resources(
    event: Event, paths: list[str] | None, *, required: bool, max_resources: int
) -> list[str]:
    """The payload's ``resources`` (or the envelope's single ``resource``), normalized."""
    if paths is None and event.resource is not None:
        if not event.resource.strip():
            raise RouterInputError(event, "resource", event.resource, "a resource path")
        paths = [event.resource]
    if not paths:
        if required:
            raise RouterInputError(event, "payload.resources", paths, "at least one resource path")
        return []
    if len(paths) > max_resources:
        raise RouterInputError(
            event,
            "payload.resources",
            f"{len(paths)} paths",
            f"at most {max_resources} (router_max_resources_per_event)",
        )
    return sorted({normalize_path(v) for v in paths})
