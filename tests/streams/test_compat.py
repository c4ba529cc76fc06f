"""The compatibility rule on hand-made schemas: within a (type, version) only optional fields are
gained; a new version reads everything an earlier one accepted; whatever the checker cannot
evaluate is refused (fails closed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from streams.catalog.compat import Incompatibility, new_version, same_version

STRING: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 100}


def schema(**props: Any) -> dict[str, Any]:
    """An open payload schema whose fields are ``props``; the first is required."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.test/p.json",
        "type": "object",
        "additionalProperties": True,
        "properties": props,
        "required": list(props)[:1],
    }


def optional(inner: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [inner, {"type": "null"}], "default": None}


BASE = schema(agentId=STRING, reason=optional(STRING))


def changed(**props: Any) -> dict[str, Any]:
    new = copy.deepcopy(BASE)
    new["properties"].update(props)
    return new


def wheres(problems: list[Incompatibility]) -> set[str]:
    return {p.where for p in problems}


def test_the_same_schema_is_compatible_and_annotations_may_change() -> None:
    assert same_version(BASE, copy.deepcopy(BASE)) == []
    new = changed(agentId={**STRING, "description": "who ran it", "title": "Agent"})
    new["description"] = "reworded"
    assert same_version(BASE, new) == []


def test_an_open_schema_gaining_an_optional_field_is_compatible() -> None:
    new = changed(model=optional(STRING))
    assert same_version(BASE, new) == []
    assert new_version(BASE, new) == []


def test_a_required_field_added_is_incompatible() -> None:
    new = changed(model=STRING)
    new["required"] = ["agentId", "model"]
    problems = same_version(BASE, new)
    assert wheres(problems) == {"model"}
    assert "may leave it out" in str(problems[0])
    # A new version must read old data too: it lacks the field.
    assert wheres(new_version(BASE, new)) == {"model"}


def test_a_closed_schema_gaining_a_field_is_incompatible() -> None:
    closed = {**BASE, "additionalProperties": False}
    new = {**closed, "properties": {**closed["properties"], "model": optional(STRING)}}
    assert wheres(same_version(closed, new)) == {"model"}


def test_an_enum_narrowed_is_incompatible_and_widened_only_across_versions() -> None:
    wide = changed(reason={"enum": ["timeout", "crash", "oom"]})
    narrow = changed(reason={"enum": ["timeout", "crash"]})
    problems = same_version(wide, narrow)
    assert wheres(problems) == {"reason"}
    assert '"oom"' in str(problems[0])
    assert new_version(wide, narrow) != []
    # Widening: new readers read old data, old readers cannot read new data.
    assert new_version(narrow, wide) == []
    assert same_version(narrow, wide) != []


def test_a_type_widened_breaks_old_readers_within_a_version() -> None:
    old = changed(count={"type": "integer"})
    new = changed(count={"type": ["integer", "string"]})
    problems = same_version(old, new)
    assert wheres(problems) == {"count"}
    assert "the type" in problems[0].reason
    # Across versions it is fine: a reader of the new version reads every old integer.
    assert new_version(old, new) == []
    assert new_version(new, old) != []


def test_integer_to_number_is_a_widening() -> None:
    old, new = changed(n={"type": "integer"}), changed(n={"type": "number"})
    assert new_version(old, new) == []
    assert new_version(new, old) != []


def test_a_property_type_changed_is_incompatible_both_ways() -> None:
    new = changed(agentId={"type": "integer"})
    assert wheres(same_version(BASE, new)) == {"agentId"}
    assert wheres(new_version(BASE, new)) == {"agentId"}


def test_a_field_removed_is_incompatible_within_a_version() -> None:
    new = copy.deepcopy(BASE)
    del new["properties"]["reason"]
    problems = same_version(BASE, new)
    assert wheres(problems) == {"reason"}
    assert "no longer names" in problems[0].reason
    # A later version may drop an optional field: its readers ignore it in old data.
    assert new_version(BASE, new) == []


def test_a_required_field_removed_is_incompatible_within_a_version() -> None:
    new = copy.deepcopy(BASE)
    del new["properties"]["agentId"]
    new["required"] = []
    assert "agentId" in wheres(same_version(BASE, new))


def test_max_length_lowered_or_min_length_raised_is_incompatible() -> None:
    lower = changed(agentId={**STRING, "maxLength": 50})
    assert wheres(same_version(BASE, lower)) == {"agentId"}
    assert "maxLength" in same_version(BASE, lower)[0].reason
    assert wheres(new_version(BASE, lower)) == {"agentId"}
    assert new_version(lower, BASE) == []
    higher_min = changed(agentId={**STRING, "minLength": 2})
    assert wheres(new_version(BASE, higher_min)) == {"agentId"}


def test_a_bound_tightened_is_incompatible_and_loosened_only_across_versions() -> None:
    old = changed(generation={"type": "integer", "minimum": 0, "maximum": 10})
    tight = changed(generation={"type": "integer", "exclusiveMinimum": 0, "maximum": 10})
    loose = changed(generation={"type": "integer", "minimum": 0})
    assert wheres(new_version(old, tight)) == {"generation"}
    assert new_version(old, loose) == []
    assert new_version(loose, old) != []
    assert same_version(old, loose) != []


def test_an_optional_field_made_required_is_incompatible() -> None:
    new = copy.deepcopy(BASE)
    new["properties"]["reason"] = STRING
    new["required"] = ["agentId", "reason"]
    assert wheres(same_version(BASE, new)) == {"reason"}


def test_a_default_changed_is_incompatible() -> None:
    new = changed(reason={**optional(STRING), "default": "none given"})
    problems = same_version(BASE, new)
    assert wheres(problems) == {"reason"}
    assert "default" in problems[0].reason


def test_a_pattern_changed_cannot_be_proven_and_is_refused() -> None:
    old = changed(agentId={**STRING, "pattern": "^a"})
    new = changed(agentId={**STRING, "pattern": "^[ab]"})
    assert wheres(new_version(old, new)) == {"agentId"}


def test_array_items_are_compared() -> None:
    old = changed(paths={"type": "array", "items": STRING, "maxItems": 10})
    longer = changed(paths={"type": "array", "items": {**STRING, "maxLength": 200}})
    assert new_version(old, longer) == []
    problems = same_version(old, longer)
    assert wheres(problems) == {"paths", "paths[]"}


def with_defs(target: str, defs: dict[str, Any]) -> dict[str, Any]:
    new = changed(agentId={"$ref": f"#/$defs/{target}"})
    new["$defs"] = defs
    return new


def test_a_ref_target_changed_is_incompatible() -> None:
    defs = {"Name": STRING, "Id": {"type": "string", "pattern": "^agt_"}}
    old, new = with_defs("Name", defs), with_defs("Id", defs)
    assert wheres(same_version(old, new)) == {"agentId"}
    # The same target, or its definition changed only in what it annotates: compatible.
    assert same_version(old, copy.deepcopy(old)) == []
    renamed = with_defs("Name", {"Name": {**STRING, "description": "an agent"}})
    assert same_version(old, renamed) == []
    # The target's own definition narrowed.
    narrowed = with_defs("Name", {"Name": {**STRING, "maxLength": 5}})
    assert wheres(same_version(old, narrowed)) == {"agentId"}


def test_a_recursive_ref_is_followed_without_looping() -> None:
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
    }
    old = with_defs("Node", {"Node": tree})
    assert same_version(old, copy.deepcopy(old)) == []
    deeper = copy.deepcopy(old)
    deeper["$defs"]["Node"]["properties"]["name"] = {"type": "string"}
    deeper["$defs"]["Node"]["required"] = ["name"]
    assert "agentId.name" in wheres(same_version(old, deeper))


def test_a_ref_out_of_the_document_fails_closed() -> None:
    new = changed(agentId={"$ref": "https://example.test/other.json"})
    problems = same_version(BASE, new)
    assert problems and "$ref" in problems[0].where


@pytest.mark.parametrize(
    "keyword",
    [
        {"oneOf": [STRING, {"type": "null"}]},
        {"multipleOf": 2},
        {"patternProperties": {"^x": STRING}},
        {"if": {"type": "string"}, "then": STRING},
        {"not": {"type": "null"}},
        {"x-custom": True},
    ],
    ids=lambda k: next(iter(k)),
)
def test_an_unknown_keyword_fails_closed_naming_it(keyword: dict[str, Any]) -> None:
    new = changed(extra={**keyword})
    name = sorted(keyword)[0]
    for problems in (same_version(BASE, new), new_version(BASE, new), same_version(new, new)):
        assert problems, keyword
        assert any(repr(name) in p.reason for p in problems)
        assert any(p.where.startswith("#/properties/extra/") for p in problems)


def test_an_unknown_keyword_in_the_old_schema_fails_closed_too() -> None:
    old = changed(extra={"dependentRequired": {"a": ["b"]}})
    assert same_version(old, copy.deepcopy(old)) != []


def test_a_nested_id_and_another_dialect_fail_closed() -> None:
    nested = changed(agentId={**STRING, "$id": "https://example.test/x"})
    assert any("only at the document's root" in p.reason for p in same_version(BASE, nested))
    draft7 = {**BASE, "$schema": "http://json-schema.org/draft-07/schema#"}
    assert same_version(BASE, draft7) != []


def test_malformed_keywords_fail_closed() -> None:
    bad_ones: list[dict[str, Any]] = [
        {"type": "text"},
        {"maxLength": "10"},
        {"pattern": "("},
        {"anyOf": []},
    ]
    for bad in bad_ones:
        assert same_version(BASE, changed(agentId=bad)) != [], bad


def test_an_enum_checked_against_a_readers_constraints() -> None:
    reader = changed(level={"type": "integer", "minimum": 1, "maximum": 3})
    fits = changed(level={"enum": [1, 2, 3]})
    over = changed(level={"enum": [1, 4]})
    assert new_version(fits, reader) == []
    problems = new_version(over, reader)
    assert wheres(problems) == {"level"} and "[4]" in problems[0].reason
    const = changed(level={"const": 2})
    assert new_version(const, reader) == []
