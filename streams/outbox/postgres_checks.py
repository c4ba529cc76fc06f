"""What the PostgreSQL outbox's INSERT checks read (schema version 2): its limits, from the
settings, and its payload rules, generated from the catalog's payload models.

The models are the source of truth: each cataloged (event type, version) becomes one row of
``outbox_payload_rules`` per field of its model, read from the model's JSON Schema (the one
``schemas/`` publishes): required or not, null allowed or not, the JSON type, a string's length
and whether it must hold a character that is not white space (the pattern ``\\S``), an
integer's bounds, an array's length and its items' rules. A model using anything else is refused
here, naming the model and the field, rather than checked loosely.

``outbox init`` and ``outbox migrate`` write both tables in their transaction (replacing what
was there), so a writer sees the old rules or the new, never a mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields, replace
from typing import Any

import psycopg

from streams.catalog import CATALOG, Catalog

# The Rust regex of the payload models' Text ("\S"): the one pattern the SQL checks know.
_NON_BLANK = r"\S"
_SCALARS = ("string", "integer", "number", "boolean", "object")


@dataclass(frozen=True, slots=True)
class PayloadRule:
    """One row of outbox_payload_rules (columns in the table's order)."""

    event_type: str
    event_version: int
    position: int
    field: str
    alt_field: str | None
    required: bool
    nullable: bool
    json_type: str
    min_length: int | None = None
    max_length: int | None = None
    non_blank: bool = False
    minimum: int | None = None
    maximum: int | None = None
    max_items: int | None = None
    item_type: str | None = None
    item_min_length: int | None = None
    item_max_length: int | None = None
    item_non_blank: bool = False


_RULE_COLUMNS = tuple(f.name for f in fields(PayloadRule))


def _unsupported(where: str, schema: Mapping[str, Any], why: str) -> ValueError:
    return ValueError(
        f"the outbox's SQL checks cannot express {where} ({why}: {dict(schema)}); extend "
        "streams/outbox/postgres_checks.py and the schema's outbox_check_value, or change the model"
    )


def _string_rules(where: str, schema: Mapping[str, Any]) -> tuple[int | None, int | None, bool]:
    pattern = schema.get("pattern")
    if pattern not in (None, _NON_BLANK):
        raise _unsupported(where, schema, f"pattern {pattern!r}")
    return schema.get("minLength"), schema.get("maxLength"), pattern == _NON_BLANK


_KNOWN = {"type", "title", "description", "default", "minLength", "maxLength", "pattern"}
_KNOWN_NUMBER = {"type", "title", "description", "default", "minimum", "maximum"}
_KNOWN_ARRAY = {"type", "title", "description", "default", "items", "maxItems"}


def _rule(
    event_type: str,
    version: int,
    position: int,
    field: str,
    alt: str | None,
    *,
    required: bool,
    schema: Mapping[str, Any],
) -> PayloadRule:
    where = f"{event_type}@{version} payload.{field}"
    nullable = False
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1 or len(schema["anyOf"]) != 2:
            raise _unsupported(where, schema, "a union other than one type or null")
        nullable, schema = True, options[0]
    kind = schema.get("type")
    base = PayloadRule(event_type, version, position, field, alt, required, nullable, str(kind))
    if kind == "string":
        if set(schema) - _KNOWN:
            raise _unsupported(where, schema, "keywords other than lengths and \\S")
        low, high, non_blank = _string_rules(where, schema)
        return replace(base, min_length=low, max_length=high, non_blank=non_blank)
    if kind in ("integer", "number"):
        if set(schema) - _KNOWN_NUMBER:
            raise _unsupported(where, schema, "keywords other than minimum and maximum")
        return replace(base, minimum=schema.get("minimum"), maximum=schema.get("maximum"))
    if kind in ("boolean", "object") and not set(schema) - {"type", "title", "description"}:
        return base
    if kind == "array" and not set(schema) - _KNOWN_ARRAY:
        items = schema.get("items", {})
        item_kind = items.get("type")
        if item_kind not in _SCALARS or (item_kind != "string" and set(items) - {"type"}):
            raise _unsupported(where, schema, "items that are not plain scalars")
        if set(items) - _KNOWN:
            raise _unsupported(where, schema, "item keywords other than lengths and \\S")
        low, high, non_blank = _string_rules(where, items)
        return replace(
            base,
            max_items=schema.get("maxItems"),
            item_type=item_kind,
            item_min_length=low,
            item_max_length=high,
            item_non_blank=non_blank,
        )
    raise _unsupported(where, schema, f"type {kind!r}")


def payload_rules(catalog: Catalog = CATALOG) -> list[PayloadRule]:
    """Every cataloged event (type, version)'s payload rules, in its model's field order."""
    rules: list[PayloadRule] = []
    for spec in catalog.events:
        model = spec.payload
        schema = model.model_json_schema(by_alias=True)
        if schema.get("additionalProperties") is False:
            raise _unsupported(f"{spec.name}@{spec.version}", schema, "a closed payload")
        required = set(schema.get("required", ()))
        properties = schema.get("properties", {})
        for position, (name, info) in enumerate(model.model_fields.items()):
            wire = info.alias or name
            rules.append(
                _rule(
                    spec.name,
                    spec.version,
                    position,
                    wire,
                    name if name != wire else None,
                    required=wire in required,
                    schema=properties[wire],
                )
            )
    return rules


def limits(*, max_envelope_bytes: int) -> dict[str, tuple[int, str]]:
    """outbox_limits' rows: name → (value, the setting it comes from)."""
    return {"max_envelope_bytes": (max_envelope_bytes, "max_envelope_bytes")}


def write(
    conn: psycopg.Connection[Any], *, max_envelope_bytes: int, catalog: Catalog = CATALOG
) -> None:
    """Replace the limits and the payload rules in ``conn``'s open transaction."""
    conn.execute("DELETE FROM outbox_limits")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO outbox_limits (name, value, setting) VALUES (%s, %s, %s)",
            [
                (name, value, setting)
                for name, (value, setting) in limits(max_envelope_bytes=max_envelope_bytes).items()
            ],
        )
        conn.execute("DELETE FROM outbox_payload_rules")
        marks = ", ".join(["%s"] * len(_RULE_COLUMNS))
        cur.executemany(
            f"INSERT INTO outbox_payload_rules ({', '.join(_RULE_COLUMNS)}) VALUES ({marks})",
            [astuple(rule) for rule in payload_rules(catalog)],
        )
