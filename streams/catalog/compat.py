"""Is a change of a payload's JSON Schema allowed? Two rules (docs/contract.md):

- **within a (type, version)** a schema may only gain optional fields: readers of the old schema
  read what writers of the new one write, and readers of the new one read what was written
  before — :func:`same_version`;
- **a new version** of a type reads everything written at an earlier one (a consumer on version
  n reads data of any version m < n) — :func:`new_version`; an event type with an upcaster chain
  from m to n needs no such check, the upcasters carry the old data over.

Both come down to one question asked of a reader's schema and a writer's: does the reader accept
every document the writer may write? It is answered keyword by keyword, and answered "no" (an
:class:`Incompatibility`) whenever it cannot be proven "yes": a keyword outside the few this
module evaluates, a reference out of the document, a changed ``pattern`` (whether one regular
expression accepts all another does is not decidable here). Failing closed is the point: a change
the checker does not understand needs a new version, not a guess.

One convention underlies "gaining optional fields": a field a schema does not name was never
written by its writers under that name. So a reader that names a new optional field reads old
data; but a field *removed* from a schema is one its writers may now fill with anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

Schema = Mapping[str, Any] | bool

# Keywords that say something about the schema but assert nothing about the data.
ANNOTATIONS = frozenset(
    {"title", "description", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
# Keywords whose effect on the data this module evaluates.
EVALUATED = frozenset(
    {
        "type",
        "enum",
        "const",
        "default",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "anyOf",
        "$ref",
    }
)
# Only at a document's root: its identity, its dialect and the definitions its $refs point into.
ROOT_ONLY = frozenset({"$schema", "$id", "$defs"})
KNOWN = ANNOTATIONS | EVALUATED
TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class Incompatibility:
    """One reason a change is not allowed: ``where`` is the field (``agentId``, ``resources[]``)
    or, for a keyword the checker refuses, the place in the schema (``#/properties/x``)."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def same_version(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    old_name: str = "the old schema",
    new_name: str = "the new schema",
) -> list[Incompatibility]:
    """Why ``new`` may not replace ``old`` within one (type, version); empty when it may (it
    differs only by optional fields gained, or annotations)."""
    problems = unknown_keywords(old, old_name) + unknown_keywords(new, new_name)
    if problems:
        return problems
    problems += _Reading(old, new, reader=old_name, writer=new_name, writer_is_newer=True).run()
    problems += _Reading(new, old, reader=new_name, writer=old_name, writer_is_newer=False).run()
    return _unique(problems)


def new_version(
    earlier: Mapping[str, Any],
    later: Mapping[str, Any],
    *,
    earlier_name: str = "the earlier version",
    later_name: str = "the later version",
) -> list[Incompatibility]:
    """Why a reader of ``later`` cannot read everything written at ``earlier``; empty when it
    can (backward compatible)."""
    problems = unknown_keywords(earlier, earlier_name) + unknown_keywords(later, later_name)
    if problems:
        return problems
    reading = _Reading(
        later, earlier, reader=later_name, writer=earlier_name, writer_is_newer=False
    )
    return _unique(reading.run())


# -- keywords the checker does not know --------------------------------------------------------


def unknown_keywords(document: Mapping[str, Any], name: str) -> list[Incompatibility]:
    """Every keyword of ``document`` the checker does not evaluate, and every malformed one."""
    return list(_walk(document, "#", name, root=True))


def _walk(
    node: object, pointer: str, name: str, *, root: bool = False
) -> Iterator[Incompatibility]:
    if isinstance(node, bool):
        return
    if not isinstance(node, Mapping):
        yield Incompatibility(pointer, f"{name}: a schema must be an object or a boolean")
        return
    allowed = KNOWN | ROOT_ONLY if root else KNOWN
    for keyword in sorted(set(node) - allowed):
        where = (
            "evaluates only at the document's root" if keyword in ROOT_ONLY else "does not evaluate"
        )
        yield Incompatibility(
            f"{pointer}/{_escape(keyword)}",
            f"{name} uses the keyword {keyword!r}, which the compatibility checker {where}; it "
            f"cannot tell what a change means, so it refuses it (express the rule with the "
            f"keywords docs/contract.md lists, or make a new version)",
        )
    if root and "$schema" in node and node["$schema"] != DIALECT:
        yield Incompatibility(
            f"{pointer}/$schema",
            f"{name} is written in {node['$schema']!r}; the checker reads {DIALECT} only",
        )
    yield from _malformed(node, pointer, name)
    for keyword in ("properties", "$defs"):
        for key, child in (node.get(keyword) or {}).items():
            yield from _walk(child, f"{pointer}/{keyword}/{_escape(key)}", name)
    for keyword in ("items", "additionalProperties"):
        if keyword in node:
            yield from _walk(node[keyword], f"{pointer}/{keyword}", name)
    for n, child in enumerate(node.get("anyOf") or []):
        yield from _walk(child, f"{pointer}/anyOf/{n}", name)


def _malformed(node: Mapping[str, Any], pointer: str, name: str) -> Iterator[Incompatibility]:
    def bad(keyword: str, rule: str) -> Incompatibility:
        return Incompatibility(
            f"{pointer}/{keyword}", f"{name}: {keyword} = {node[keyword]!r}: {rule}"
        )

    kind = node.get("type")
    if "type" in node and not (
        (isinstance(kind, str) and kind in TYPES)
        or (isinstance(kind, list) and kind and all(t in TYPES for t in kind))
    ):
        yield bad("type", f"must be one of {sorted(TYPES)} or a list of them")
    for keyword in ("properties", "$defs"):
        if keyword in node and not isinstance(node[keyword], Mapping):
            yield bad(keyword, "must be an object of schemas")
    if "required" in node and not (
        isinstance(node["required"], list) and all(isinstance(r, str) for r in node["required"])
    ):
        yield bad("required", "must be a list of field names")
    if "anyOf" in node and not (isinstance(node["anyOf"], list) and node["anyOf"]):
        yield bad("anyOf", "must be a non-empty list of schemas")
    if "enum" in node and not isinstance(node["enum"], list):
        yield bad("enum", "must be a list of values")
    if "$ref" in node and not str(node["$ref"]).startswith("#"):
        yield bad("$ref", "only references inside the document (#/$defs/…) are evaluated")
    if "pattern" in node and not _compiles(node["pattern"]):
        yield bad("pattern", "is not a regular expression the checker can read")
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        value = node.get(keyword)
        if keyword in node and (isinstance(value, bool) or not isinstance(value, int)):
            yield bad(keyword, "must be a whole number")
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = node.get(keyword)
        if keyword in node and (isinstance(value, bool) or not isinstance(value, int | float)):
            yield bad(keyword, "must be a number")


def _compiles(pattern: object) -> bool:
    try:
        re.compile(str(pattern))
    except re.error:
        return False
    return isinstance(pattern, str)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# -- does a reader accept everything a writer writes? ---------------------------------------------


class _Reading:
    """One reader's schema against one writer's: :meth:`run` lists what the writer may write
    that the reader refuses (or that the checker cannot prove it accepts)."""

    def __init__(
        self,
        reader_doc: Mapping[str, Any],
        writer_doc: Mapping[str, Any],
        *,
        reader: str,
        writer: str,
        writer_is_newer: bool,
    ) -> None:
        self.docs = (reader_doc, writer_doc)
        self.r, self.w = reader, writer
        self.writer_is_newer = writer_is_newer
        self.problems: list[Incompatibility] = []
        # Pairs of nodes being compared: a recursive $ref compares as compatible where it
        # meets itself again (the rest of the comparison decides).
        self.active: set[tuple[int, int]] = set()

    def run(self) -> list[Incompatibility]:
        self.node(self.docs[0], self.docs[1], "")
        return self.problems

    def fail(self, where: str, reason: str) -> None:
        self.problems.append(Incompatibility(where or "<document>", reason))

    def trial(self, r: Schema, w: Schema, where: str) -> list[Incompatibility]:
        saved, self.problems = self.problems, []
        try:
            self.node(r, w, where)
            return self.problems
        finally:
            self.problems = saved

    def resolve(self, schema: Schema, side: int, where: str) -> Schema | None:
        seen: set[str] = set()
        while isinstance(schema, Mapping) and "$ref" in schema:
            ref = str(schema["$ref"])
            assertions = set(schema) - ANNOTATIONS - {"$ref", "default"}
            if assertions or ref in seen:
                why = (
                    f"$ref {ref!r} beside {sorted(assertions)}"
                    if assertions
                    else f"$ref {ref!r} refers only to itself"
                )
                self.fail(where, f"{(self.r, self.w)[side]}: {why}: the checker cannot read it")
                return None
            seen.add(ref)
            target = _pointer(self.docs[side], ref)
            if target is None:
                self.fail(where, f"{(self.r, self.w)[side]}: $ref {ref!r} points at nothing")
                return None
            schema = target
        return schema

    def node(self, r: Schema, w: Schema, where: str) -> None:
        if isinstance(r, Mapping) and isinstance(w, Mapping):
            self.default(r, w, where)
        resolved_r, resolved_w = self.resolve(r, 0, where), self.resolve(w, 1, where)
        if resolved_r is None or resolved_w is None:
            return
        key = (id(resolved_r), id(resolved_w))
        if key in self.active:
            return
        self.active.add(key)
        try:
            self.compare(resolved_r, resolved_w, where)
        finally:
            self.active.discard(key)

    def default(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> None:
        if "default" in r and "default" in w and not _same(r["default"], w["default"]):
            self.fail(
                where,
                f"the default changed ({self.w}: {_show(w['default'])}, {self.r}: "
                f"{_show(r['default'])}): data that leaves the field out means another thing",
            )

    def compare(self, r: Schema, w: Schema, where: str) -> None:
        if w is False:
            return  # the writer writes nothing here
        if r is False:
            self.fail(where, f"{self.r} accepts nothing here, {self.w} accepts values")
            return
        r = {} if r is True else r
        w = {} if w is True else w
        if "anyOf" in w:
            if self.beside_any_of(w, self.w, where):
                for branch in w["anyOf"]:
                    self.node(r, branch, where)
            return
        if "anyOf" in r:
            if self.beside_any_of(r, self.r, where):
                tried = [self.trial(branch, w, where) for branch in r["anyOf"]]
                if all(tried):
                    closest: list[Incompatibility] = min(tried, key=len)
                    self.problems += closest
            return
        if "enum" in w or "const" in w:
            values = w["enum"] if "enum" in w else [w["const"]]
            refused = [v for v in values if not self.admits(r, v)]
            if refused:
                self.fail(where, f"{self.w} allows {_show(refused)}, {self.r} refuses them")
            return
        if "enum" in r or "const" in r:
            allowed = r["enum"] if "enum" in r else [r["const"]]
            self.fail(where, f"{self.r} allows only {_show(allowed)}, {self.w} allows more")
            return
        kinds = self.types(r, w, where)
        if "string" in kinds:
            self.strings(r, w, where)
        if kinds & {"integer", "number"}:
            self.numbers(r, w, where)
        if "array" in kinds:
            self.arrays(r, w, where)
        if "object" in kinds:
            self.objects(r, w, where)

    def beside_any_of(self, schema: Mapping[str, Any], name: str, where: str) -> bool:
        others = set(schema) - ANNOTATIONS - ROOT_ONLY - {"anyOf", "default"}
        if others:
            self.fail(where, f"{name}: anyOf beside {sorted(others)}: the checker cannot read it")
        return not others

    def types(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> set[str]:
        """The types the writer may write (each one's keywords are compared next)."""
        wt, rt = _types(w), _types(r)
        if rt is None:
            return wt or set(TYPES)
        if wt is None:
            self.fail(where, f"{self.w} allows any type, {self.r} only {_show(sorted(rt))}")
            return rt
        extra = {t for t in wt if t not in rt and not (t == "integer" and "number" in rt)}
        if extra:
            self.fail(
                where,
                f"the type: {self.w} allows {_show(sorted(wt))}, {self.r} only {_show(sorted(rt))}",
            )
        return wt - extra

    def strings(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> None:
        self.least("minLength", r.get("minLength", 0), w.get("minLength", 0), where)
        self.most("maxLength", r.get("maxLength"), w.get("maxLength"), where)
        for keyword in ("pattern", "format"):
            if keyword in r and w.get(keyword) != r[keyword]:
                self.fail(
                    where,
                    f"{keyword}: {self.w} has {_show(w[keyword]) if keyword in w else 'none'}, {self.r} "
                    f"{_show(r[keyword])}: the checker cannot prove the second accepts all the "
                    f"first does",
                )

    def numbers(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> None:
        for side, keywords in (
            ("lower", ("minimum", "exclusiveMinimum")),
            ("upper", ("maximum", "exclusiveMaximum")),
        ):
            rb, wb = _bound(r, *keywords, side), _bound(w, *keywords, side)
            if rb is None:
                continue
            sign = 1 if side == "lower" else -1
            holds = wb is not None and (
                sign * wb[0] > sign * rb[0] or (wb[0] == rb[0] and (wb[1] or not rb[1]))
            )
            if not holds:
                self.fail(
                    where,
                    f"the {side} bound: {self.w} has {_show_bound(wb)}, {self.r} {_show_bound(rb)}",
                )

    def arrays(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> None:
        self.least("minItems", r.get("minItems", 0), w.get("minItems", 0), where)
        self.most("maxItems", r.get("maxItems"), w.get("maxItems"), where)
        if r.get("uniqueItems") is True and w.get("uniqueItems") is not True:
            self.fail(where, f"{self.r} requires unique items, {self.w} does not")
        self.node(r.get("items", True), w.get("items", True), f"{where}[]")

    def objects(self, r: Mapping[str, Any], w: Mapping[str, Any], where: str) -> None:
        rp, wp = r.get("properties", {}), w.get("properties", {})
        rap, wap = r.get("additionalProperties", True), w.get("additionalProperties", True)
        written = set(w.get("required", []))
        for name in sorted(set(r.get("required", [])) - written):
            self.fail(_at(where, name), f"{self.r} requires it, {self.w} may leave it out")
        for name, schema in wp.items():
            if name in rp:
                self.node(rp[name], schema, _at(where, name))
            elif rap is False:
                self.fail(
                    _at(where, name),
                    f"{self.w} has this field, {self.r} refuses fields it does not name",
                )
            else:
                self.node(rap, schema, _at(where, name))
        for name in sorted(set(rp) - set(wp)):
            # Writers of an older schema never wrote a field it did not name (the convention
            # that makes gaining an optional field safe); writers of a newer one that dropped
            # it may write anything there.
            if wap is not False and self.writer_is_newer and self.trial(rp[name], wap, "x"):
                self.fail(
                    _at(where, name),
                    f"{self.w} no longer names this field, so its writers may put anything "
                    f"there; {self.r} checks it",
                )
        if rap is False and wap is not False:
            self.fail(
                where or "<document>",
                f"{self.r} refuses fields it does not name (additionalProperties: false), "
                f"{self.w} allows them",
            )
        elif rap is not True and wap is not False:
            self.node(rap, wap, _at(where, "*"))

    def least(self, keyword: str, r: int, w: int, where: str) -> None:
        if w < r:
            self.fail(where, f"{keyword}: {self.w} allows {w}, {self.r} requires {r}")

    def most(self, keyword: str, r: int | None, w: int | None, where: str) -> None:
        if r is not None and (w is None or w > r):
            allowed = "no limit" if w is None else w
            self.fail(where, f"{keyword}: {self.w} allows {allowed}, {self.r} at most {r}")

    def admits(self, r: Schema, value: object) -> bool:
        """Does schema ``r`` (of the reader's document) accept ``value``? False when unsure."""
        schema = self.resolve(r, 0, "")
        if schema is None or schema is False:
            return False
        if schema is True:
            return True
        if "anyOf" in schema:
            return any(self.admits(branch, value) for branch in schema["anyOf"])
        if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
            return False
        if "const" in schema and not _same(value, schema["const"]):
            return False
        kinds = _types(schema)
        if kinds is not None and not _json_types(value) & kinds:
            return False
        return _admits_shape(self, schema, value)


def _admits_shape(reading: _Reading, schema: Mapping[str, Any], value: object) -> bool:
    if isinstance(value, str):
        return (
            schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
            and ("pattern" not in schema or re.search(schema["pattern"], value) is not None)
            and "format" not in schema  # not evaluated: unsure
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        low = _bound(schema, "minimum", "exclusiveMinimum", "lower")
        high = _bound(schema, "maximum", "exclusiveMaximum", "upper")
        return (low is None or value > low[0] or (value == low[0] and not low[1])) and (
            high is None or value < high[0] or (value == high[0] and not high[1])
        )
    if isinstance(value, list):
        return (
            schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value))
            and not (schema.get("uniqueItems") and len({_canonical(v) for v in value}) < len(value))
            and all(reading.admits(schema.get("items", True), item) for item in value)
        )
    if isinstance(value, dict):
        named = schema.get("properties", {})
        return set(schema.get("required", [])) <= set(value) and all(
            reading.admits(named.get(k, schema.get("additionalProperties", True)), v)
            for k, v in value.items()
        )
    return True


# -- small pieces --------------------------------------------------------------------------------


def _pointer(document: Mapping[str, Any], ref: str) -> Schema | None:
    node: Any = document
    fragment = unquote(ref[1:])
    for part in fragment.split("/")[1:] if fragment else []:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return None
    return node if isinstance(node, Mapping | bool) else None


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _json_types(value: object) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number", "integer"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    return {"object"}


def _bound(
    schema: Mapping[str, Any], inclusive: str, exclusive: str, side: str
) -> tuple[float, bool] | None:
    """The tighter of an inclusive and an exclusive bound: (value, exclusive?)."""
    found = [(schema[inclusive], False)] if inclusive in schema else []
    found += [(schema[exclusive], True)] if exclusive in schema else []
    if not found:
        return None
    sign = 1 if side == "lower" else -1
    # Tighter: further in; at one value, the exclusive one.
    return max(found, key=lambda bound: (sign * bound[0], bound[1]))


def _show_bound(bound: tuple[float, bool] | None) -> str:
    if bound is None:
        return "none"
    return f"{bound[0]} ({'exclusive' if bound[1] else 'inclusive'})"


def _canonical(value: object) -> str:
    def plain(item: object) -> object:
        if isinstance(item, float) and item.is_integer():
            return int(item)
        if isinstance(item, list):
            return [plain(v) for v in item]
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        return item

    return json.dumps(plain(value), sort_keys=True)


def _same(a: object, b: object) -> bool:
    return _canonical(a) == _canonical(b)


def _show(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _unique(problems: list[Incompatibility]) -> list[Incompatibility]:
    return list(dict.fromkeys(problems))
