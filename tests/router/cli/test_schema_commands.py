"""``rhumbatron schema`` prints the catalog's list and its JSON Schemas, refusing an unknown type
or version as any bad input (exit 2); ``rhumbatron validate`` names each bad envelope of an NDJSON
input by line, field and reason, and exits 2 when there is one."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.cli.main import main
from streams.catalog import CATALOG
from streams.envelopes import encode
from streams.workload import TENANT, project_events, slotted_events
from tests.support.environment import ROOT

EVENT: dict[str, Any] = {
    "eventId": "evt_" + "0" * 32,
    "eventType": "task.completed",
    "tenantId": "t",
    "projectId": "p",
    "actor": "agent:a",
    "timestamp": "2026-01-02T03:04:05.678Z",
    "payload": {"agentId": "a"},
}
COMMAND: dict[str, Any] = {
    "commandId": "cmd_t1_ready",
    "commandType": "change.dispatch",
    "projectId": "p",
    "createdAt": "2026-01-02T03:04:05.678Z",
    "payload": {"taskId": "t1"},
}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_schema_lists_every_type_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["schema"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "TYPE", "VERSION", "QUEUE"]
    for spec in CATALOG.events:
        assert ["event", spec.name, str(spec.version), "-"] in [line.split() for line in lines]
    for command in CATALOG.commands:
        row = ["command", command.name, str(command.version), command.queue]
        assert row in [line.split() for line in lines]


def test_schema_json_is_the_index(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["schema", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == json.loads((ROOT / "schemas" / "catalog.json").read_text())


@pytest.mark.parametrize(
    ("what", "file"),
    [
        ("event", "event.schema.json"),
        ("command", "command.schema.json"),
        ("task.completed", "events/task.completed.v1.schema.json"),
        ("task.completed@1", "events/task.completed.v1.schema.json"),
        ("agent.wake", "commands/agent.wake.v1.schema.json"),
    ],
)
def test_schema_prints_the_file(what: str, file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["schema", what], capsys)
    assert code == 0
    assert out == (ROOT / "schemas" / file).read_text()


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("task.completd", "'task.completd' is no event or command type of the catalog (did you"),
        ("task.completed@2", "task.completed has version(s) 1"),
        ("task.completed@", "task.completed has version(s) 1"),
        ("task.completed@x", "task.completed has version(s) 1"),
        ("nothing", "'nothing' is no event or command type"),
    ],
)
def test_an_unknown_type_or_version_is_bad_input(
    what: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["schema", what], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("rhumbatron: schema: ") and said in err
    assert err.count("\n") == 1


def _ndjson(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "in.ndjson"
    path.write_bytes(
        b"".join(
            (line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines
        )
    )
    return path


def test_validate_passes_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = slotted_events(project_events("proj-validate", 40), tenant_id=TENANT)
    path = _ndjson(tmp_path, *(encode(e, max_bytes=1_000_000) for e in events), COMMAND)
    code, out, err = run(["validate", str(path)], capsys)
    assert (code, err) == (0, "")
    assert out == "41 envelope(s), all valid\n"


def test_validate_names_each_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ndjson(
        tmp_path,
        EVENT,
        b"",  # blank lines are skipped, but counted in the line numbers
        b"not json",
        {**EVENT, "payload": {}},
        {**EVENT, "payload": {"agentId": 7}},
        {**EVENT, "eventId": "evt_bad"},
        {**COMMAND, "payload": {}},
        {"neither": 1},
        [1, 2],
        {**EVENT, "eventType": "team.own", "payload": {"anything": 1}},  # not cataloged: passes
        COMMAND,
    )
    code, out, err = run(["validate", str(path)], capsys)
    assert code == 2
    lines = out.splitlines()
    assert len(lines) == 7
    expected = [
        "line 3: <envelope>: not valid JSON (",
        "line 4: payload.agentId: required field is missing (task.completed@1)",
        "line 5: payload.agentId: ",
        "line 6: eventId: ",
        "line 7: payload.taskId: required field is missing (change.dispatch@1)",
        "line 8: <envelope>: has neither eventId (an event) nor commandId (a command)",
        "line 9: <envelope>: must be a JSON object: an event (eventId …) or a command",
    ]
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start), (line, start)
    assert lines[2].endswith("(got 7)")
    assert lines[3].endswith("(got 'evt_bad')")
    assert err == (
        f"rhumbatron: 7 of 10 envelope(s) invalid in {path}: each is named above by its line, "
        "field and reason\n"
    )


def test_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ndjson(tmp_path, EVENT, {**EVENT, "payload": {}})
    code, out, _ = run(["validate", "--json", str(path)], capsys)
    assert code == 2
    assert json.loads(out) == {
        "envelopes": 2,
        "valid": 1,
        "invalid": [
            {
                "line": 2,
                "field": "payload.agentId",
                "reason": "required field is missing (task.completed@1)",
            }
        ],
    }


def test_validate_reads_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = orjson.dumps(EVENT) + b"\n" + orjson.dumps(COMMAND) + b"\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert run(["validate", "-"], capsys) == (0, "2 envelope(s), all valid\n", "")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"x": 1}\n')))
    code, _, err = run(["validate", "-"], capsys)
    assert code == 2
    assert "invalid in standard input" in err


def test_validate_refuses_an_oversized_envelope_by_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_MAX_ENVELOPE_BYTES", "2000")
    path = _ndjson(tmp_path, {**EVENT, "payload": {"agentId": "a", "blob": "x" * 3000}})
    code, out, _ = run(["validate", str(path)], capsys)
    assert code == 2
    assert out.startswith("line 1: <envelope>: envelope is ") and "max_envelope_bytes" in out


def test_validate_a_missing_file_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (str(tmp_path / "nope.ndjson"), "\n", str(tmp_path)):
        code, _, err = run(["validate", name], capsys)
        assert code == 2
        assert err.startswith(f"rhumbatron: validate: cannot read {name!r}: "), err
        assert err.count("\n") == 1


def test_validate_names_a_field_the_envelope_does_not_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The router keeps and ignores such a field (a newer writer's); a writer's misspelling would
    # be lost there without an error, so validate names it.
    path = _ndjson(tmp_path, {**EVENT, "corelationId": "req-1"}, {**COMMAND, "colour": "red"})
    code, out, _ = run(["validate", str(path)], capsys)
    assert code == 2
    assert out.splitlines() == [
        "line 1: corelationId: not a field of the Event envelope: readers keep it and ignore it "
        "(docs/contract.md, forward compatibility); check its spelling against "
        "`rhumbatron schema event`",
        "line 2: colour: not a field of the Command envelope: readers keep it and ignore it "
        "(docs/contract.md, forward compatibility); check its spelling against "
        "`rhumbatron schema command`",
    ]
