"""Reading the causal router's input through the catalog's payload models
(``streams.catalog.payloads``, docs/catalog.md): each folder reads its event's payload as the
model of its type, and a payload the model refuses raises :class:`RouterInputError` naming the
event, the field, the value found and what was expected. Rules that span the payload and the
envelope (a generation in either, the envelope's single ``resource``) are read here too.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import ValidationError

from streams.catalog import CATALOG
from streams.catalog.payloads import Payload
from streams.envelopes import Event
from streams.errors import RouterInputError

P = TypeVar("P", bound=Payload)


def read(event: Event, model: type[P]) -> P:
    """``event``'s payload as ``model``, the catalog's model of its type (events reach the
    router upcast to the newest version it knows)."""
    spec = CATALOG.event(event.event_type)
    if spec is None or spec.payload is not model:
        # A wiring mistake of ours, not bad input: the folder and the catalog disagree.
        raise TypeError(f"{event.event_type} payloads are not read as {model.__name__}")
    try:
        return model.model_validate(event.payload)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = ".".join(["payload", *(str(part) for part in error["loc"])])
        if error["type"] == "missing":
            raise RouterInputError(event, field, None, "a value (the field is required)") from exc
        message = str(error["msg"]).removeprefix("Input should be ")
        expected = message[0].lower() + message[1:]
        raise RouterInputError(event, field, error.get("input"), expected) from exc


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
