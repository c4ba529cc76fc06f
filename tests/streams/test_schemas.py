"""schemas/ is the catalog as JSON Schema: the files are what the models say, each a valid
2020-12 schema with its own $id, the workload's envelopes and payloads valid against them; and
the check holds every file to its committed history and every version to the ones before."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Annotated, Any

import orjson
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import Field

from streams.catalog import CATALOG, Catalog, CommandSpec, schemas
from streams.catalog import payloads as p
from streams.envelopes import Command, build, encode
from streams.workload import TENANT, project_events, slotted_events
from tests.support.environment import ROOT

FOLDER = ROOT / "schemas"


def _with_payload(catalog: Catalog, name: str, model: type[p.Payload]) -> Catalog:
    events = tuple(
        dataclasses.replace(s, payload=model) if s.name == name else s for s in catalog.events
    )
    return dataclasses.replace(catalog, events=events)


class _CompletedWithModel(p.Payload):
    agent_id: p.Text
    model: p.Text


class _CompletedWithOptionalModel(p.Payload):
    agent_id: p.Text
    model: p.Text | None = None


class _CompletedShortAgent(p.Payload):
    agent_id: Annotated[str, Field(min_length=1, max_length=10, pattern=r"\S")]


def test_the_files_are_what_the_models_say() -> None:
    assert schemas.differences(FOLDER, schemas.documents()) == [], (
        "run .venv/bin/python -m streams.catalog.schemas --write"
    )


def test_every_cataloged_type_and_version_has_a_document() -> None:
    docs = schemas.documents()
    index = json.loads((FOLDER / schemas.INDEX).read_text())
    for spec in CATALOG.events:
        assert schemas.payload_file("event", spec.name, spec.version) in docs
    for command in CATALOG.commands:
        assert schemas.payload_file("command", command.name, command.version) in docs
    listed = {(e["type"], e["version"]) for e in index["events"]}
    assert listed == {(s.name, s.version) for s in CATALOG.events}
    assert {c["type"]: c["queue"] for c in index["commands"]} == CATALOG.queues()
    for entry in index["events"] + index["commands"]:
        assert (FOLDER / entry["file"]).is_file()
        assert set(entry) >= {"type", "version", "file", "producer", "$id"}
    completed = next(e for e in index["events"] if e["type"] == "task.completed")
    assert completed["causes"] == ["change.dispatch"]


def test_a_changed_model_is_detected() -> None:
    changed = _with_payload(CATALOG, "task.completed", _CompletedWithModel)
    problems = schemas.differences(FOLDER, schemas.documents(changed))
    assert problems == [f"{FOLDER}/events/task.completed.v1.schema.json: not what the models say"]


def test_a_removed_type_and_a_missing_file_are_detected(tmp_path: Path) -> None:
    folder = tmp_path / "schemas"
    schemas.write(folder, schemas.documents())
    (folder / "events" / "task.ready.v1.schema.json").unlink()
    (folder / "commands" / "gone.thing.v1.schema.json").write_text("{}\n")
    problems = schemas.differences(folder, schemas.documents())
    assert sorted(problems) == [
        f"{folder}/commands/gone.thing.v1.schema.json: no such (type, version) in the catalog",
        f"{folder}/events/task.ready.v1.schema.json: missing",
    ]
    assert schemas.write(folder, schemas.documents()) == [
        f"wrote {folder}/events/task.ready.v1.schema.json",
        f"removed {folder}/commands/gone.thing.v1.schema.json",
    ]
    assert schemas.differences(folder, schemas.documents()) == []


def test_the_files_are_deterministic() -> None:
    for file, document in schemas.documents().items():
        text = (FOLDER / file).read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
        assert document == json.loads(text)


def test_every_document_is_a_valid_2020_12_schema_with_a_unique_id() -> None:
    ids: dict[str, str] = {}
    for path in sorted(FOLDER.rglob("*.json")):
        document = json.loads(path.read_text())
        if "$schema" not in document:
            continue  # data, not a schema (the partitioning vectors, the index)
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema", path
        Draft202012Validator.check_schema(document)
        assert document["$id"] not in ids, (path, ids.get(document["$id"]))
        ids[document["$id"]] = str(path)
        assert document.get("title") and document.get("description"), path
    assert len(ids) >= len(schemas.documents()) - 1  # every document but the index


def test_payload_documents_are_open_and_envelopes_tolerate_unknown_fields() -> None:
    for file, document in schemas.documents().items():
        if file == schemas.INDEX:
            continue
        assert document["additionalProperties"] is True, file
    for kind, file in schemas.ENVELOPES.items():
        assert schemas.documents()[file]["properties"]["payload"]["type"] == "object", kind


def _validator(file: str) -> Draft202012Validator:
    document = json.loads((FOLDER / file).read_text())
    return Draft202012Validator(document, format_checker=FormatChecker())


def test_the_workloads_envelopes_and_payloads_are_valid() -> None:
    events = slotted_events(project_events("proj-schemas", 60), tenant_id=TENANT)
    envelope = _validator(schemas.ENVELOPES["event"])
    seen = set()
    for event in events:
        wire = orjson.loads(encode(event, max_bytes=1_000_000))
        envelope.validate(wire)
        file = schemas.payload_file("event", event.event_type, event.event_version)
        _validator(file).validate(wire["payload"])
        seen.add(event.event_type)
    assert len(seen) >= 12  # a change's whole life: tasks, intents, candidates, release


def test_a_command_envelope_is_valid_and_a_bad_one_is_not() -> None:
    command = build(
        Command,
        command_id="cmd_t1_ready",
        command_type="change.dispatch",
        project_id="p1",
        created_at="2026-01-02T03:04:05.678Z",
        payload={"taskId": "t1"},
    )
    wire = orjson.loads(encode(command, max_bytes=1_000_000))
    _validator(schemas.ENVELOPES["command"]).validate(wire)
    _validator("commands/change.dispatch.v1.schema.json").validate(wire["payload"])
    envelope = _validator(schemas.ENVELOPES["command"])
    assert not envelope.is_valid({**wire, "createdAt": "2026-01-02T03:04:05Z"})
    assert envelope.is_valid({**wire, "addedLater": 1})  # unknown envelope fields are tolerated
    payload = _validator("commands/change.dispatch.v1.schema.json")
    assert not payload.is_valid({"taskId": ""})
    assert payload.is_valid({"taskId": "t1", "extra": [1]})  # open: kept and ignored


@pytest.mark.parametrize(
    "payload",
    [{"agentId": "a"}, {"agentId": ""}, {}, {"agentId": 3}, {"agentId": "a", "x": None}],
)
def test_a_payload_document_and_the_catalog_agree(payload: dict[str, Any]) -> None:
    valid = _validator("events/task.completed.v1.schema.json").is_valid(payload)
    try:
        CATALOG.check_payload("Event", "task.completed", 1, payload)
    except ValueError:
        assert not valid
    else:
        assert valid


# -- the compatibility rule, against git history and across versions ---------------------------


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.test", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository whose schemas/ holds today's documents, committed."""
    _git(tmp_path, "init", "-q")
    schemas.write(tmp_path / "schemas", schemas.documents())
    _git(tmp_path, "add", "schemas")
    _git(tmp_path, "commit", "-q", "-m", "schemas")
    return tmp_path


def test_the_checkout_passes_the_check() -> None:
    assert schemas.main(["--check", "--root", str(ROOT)]) == 0


def test_a_committed_state_is_held_to_the_within_version_rule(checkout: Path) -> None:
    assert schemas.check(checkout, use_history=True) == []
    narrowed = _with_payload(CATALOG, "task.completed", _CompletedShortAgent)
    schemas.write(checkout / "schemas", schemas.documents(narrowed))
    problems = schemas.check(checkout, use_history=True, catalog=narrowed)
    assert len(problems) == 1
    assert problems[0].startswith("schemas/events/task.completed.v1.schema.json: agentId: ")
    assert "maxLength" in problems[0]
    # Committed, the change is still refused: every earlier state counts.
    _git(checkout, "commit", "-q", "-am", "narrowed")
    assert schemas.check(checkout, use_history=True, catalog=narrowed) == problems
    # Back as it was: still refused, the narrowed state is history now too.
    assert schemas.check(checkout, use_history=True) != []


def test_gaining_an_optional_field_passes_and_a_required_one_does_not(checkout: Path) -> None:
    for model, allowed in ((_CompletedWithOptionalModel, True), (_CompletedWithModel, False)):
        catalog = _with_payload(CATALOG, "task.completed", model)
        schemas.write(checkout / "schemas", schemas.documents(catalog))
        problems = schemas.check(checkout, use_history=True, catalog=catalog)
        assert (problems == []) is allowed, problems


def test_a_published_version_that_is_gone_is_refused(checkout: Path) -> None:
    (checkout / "schemas" / "events" / "task.ready.v1.schema.json").unlink()
    _git(checkout, "commit", "-q", "-am", "gone")
    history = schemas.read_history(checkout)
    problems = schemas.history_problems(history, {})
    assert any(
        p.startswith("schemas/events/task.ready.v1.schema.json: published") for p in problems
    )


def test_without_git_history_the_check_fails_closed_unless_told(tmp_path: Path) -> None:
    schemas.write(tmp_path / "schemas", schemas.documents())
    problems = schemas.check(tmp_path, use_history=True)
    assert len(problems) == 1 and "history cannot be read" in problems[0]
    assert "--no-history" in problems[0]
    assert schemas.check(tmp_path, use_history=False) == []
    assert schemas.main(["--check", "--root", str(tmp_path)]) == 1
    assert schemas.main(["--check", "--no-history", "--root", str(tmp_path)]) == 0


def test_a_shallow_clone_fails_closed(
    checkout: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _git(checkout, "commit", "-q", "--allow-empty", "-m", "second")
    clone = tmp_path_factory.mktemp("clone") / "c"
    _git(checkout, "clone", "-q", "--depth", "1", f"file://{checkout}", str(clone))
    history = schemas.read_history(clone)
    assert history.unavailable is not None and "shallow" in history.unavailable


def _with_command_v2(model: type[p.Payload]) -> Catalog:
    first = next(c for c in CATALOG.commands if c.name == "index.purge")
    second = CommandSpec("index.purge", 2, model, first.queue, first.producer, first.meaning)
    return dataclasses.replace(CATALOG, commands=(*CATALOG.commands, second))


class _PurgeWithReason(p.CommandPayload):
    keep_generation: p.Generation
    reason: p.Text | None = None


class _PurgeRequiringReason(p.CommandPayload):
    keep_generation: p.Generation
    reason: p.Text


def test_a_new_version_reads_every_earlier_one_or_is_refused() -> None:
    fine = _with_command_v2(_PurgeWithReason)
    assert schemas.version_problems(schemas.documents(fine), fine) == []
    broken = _with_command_v2(_PurgeRequiringReason)
    problems = schemas.version_problems(schemas.documents(broken), broken)
    assert problems == [
        "command index.purge@2 reading @1: reason: version 2 requires it, version 1 may leave "
        "it out"
    ]


def test_an_event_version_with_an_upcaster_chain_needs_no_backward_compatibility() -> None:
    first = next(e for e in CATALOG.events if e.name == "task.completed")
    second = dataclasses.replace(first, version=2, payload=_CompletedWithModel)
    catalog = dataclasses.replace(
        CATALOG,
        events=(*CATALOG.events, second),
        upcasters={("task.completed", 1): lambda payload: {**payload, "model": "unknown"}},
    )
    docs = schemas.documents(catalog)
    assert "events/task.completed.v2.schema.json" in docs
    assert schemas.version_problems(docs, catalog) == []
