"""The TypeScript writer (examples/ts-writer) under node, end to end: its own node tests pass
(stream and partition against schemas/partitioning.json, stable ids against Python's, the JSON
Schema checks); it writes a project's events through a PostgreSQL outbox made by ``rhumbatron
outbox init``, by plain INSERTs and by ``rhumbatron_append`` (reading back the slots and the event
another writer wrote meanwhile); a bad event is refused by its own schema check; our publisher
sends the events to the stream and partition the writer computed; project-view-projector folds
them, and ``rhumbatron view`` and the project's feed show its events in slot order."""

from __future__ import annotations

import fcntl
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import read_feed
from router.settings import Settings
from streams.envelopes import Draft
from streams.ids import stable_event_id
from streams.outbox.postgres import PostgresOptions, PostgresOutbox
from tests.support.environment import ROOT, run_cli
from tests.support.kafka import events_of, read_all
from tests.support.outbox import cli_env
from tests.support.postgres import FreshSchema
from tests.support.projector_oracle import expected_view
from tests.support.runtime_processes import cli, consume_cli

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "ts-writer"
MAIN = EXAMPLE / "dist" / "src" / "main.js"
PROJECT = "proj-ts-writer"
TENANT = "tenant-ts"
SCHEMA_REFUSED, DATABASE_REFUSED = 3, 4
NODE_TESTS = 10  # the example's own: test/hashing, test/ids, test/schemas

CHANGE: list[dict[str, Any]] = [
    {"eventType": "change.created", "changeId": "chg-1", "payload": {"title": "A writer in TS"}},
    {"eventType": "task.created", "changeId": "chg-1", "taskId": "t1", "payload": {}},
    {
        "eventType": "task.created",
        "changeId": "chg-1",
        "taskId": "t2",
        "payload": {"dependsOn": ["t1"]},
    },
]
WORK: list[dict[str, Any]] = [
    {
        "eventType": "task.started",
        "changeId": "chg-1",
        "taskId": "t2",
        "payload": {"agentId": "a2"},
    },
    {
        "eventType": "task.completed",
        "changeId": "chg-1",
        "taskId": "t1",
        "payload": {"agentId": "a1"},
    },
    {
        "eventType": "task.completed",
        "changeId": "chg-1",
        "taskId": "t2",
        "payload": {"agentId": "a2"},
    },
]
# No agentId: the payload schema of task.completed requires one.
BAD: list[dict[str, Any]] = [
    {"eventType": "task.completed", "changeId": "chg-1", "taskId": "t3", "payload": {}}
]


def _npm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["npm", *args], cwd=EXAMPLE, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def built() -> Path:
    """The example installed (``npm ci`` only when its lock file is newer than what is installed,
    as ``make node`` does: offline after the first run) and compiled, its own tests passed."""
    modules = EXAMPLE / "node_modules"
    lock_path = ROOT / ".local" / "ts-writer-npm.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time, whichever worker comes first
        lock_file = EXAMPLE / "package-lock.json"
        if not modules.is_dir() or lock_file.stat().st_mtime > modules.stat().st_mtime:
            done = _npm("ci", "--no-audit", "--no-fund", "--prefer-offline")
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            modules.touch()
        tested = _npm("test")
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-3000:]
    assert "# fail 0" in tested.stdout and f"# pass {NODE_TESTS}" in tested.stdout, tested.stdout
    return MAIN


@pytest.fixture
def outbox(settings: Settings) -> Iterator[FreshSchema]:
    schema = FreshSchema(init=False)
    try:
        made = run_cli(settings, "outbox", "init", "--outbox", schema.url, env=cli_env(settings))
        assert made.returncode == 0, made.stderr
        yield schema
    finally:
        schema.drop()


def _write(
    main: Path, s: Settings, url: str, facts: list[dict[str, Any]], tmp: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    events = tmp / f"events-{len(list(tmp.iterdir()))}.json"
    events.write_text(json.dumps(facts))
    done = subprocess.run(
        ["node", str(main), "--database", url, "--tenant", TENANT, "--project", PROJECT]
        + ["--events", str(events), "--streams", str(s.streams)]
        + ["--partitions", str(s.partitions), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, SCHEMA_REFUSED, DATABASE_REFUSED), done.stderr
    said: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, said


def _another_writer(url: str) -> str:
    """An event of the project written by a Python service meanwhile: the TS writer missed it."""
    store = PostgresOutbox(
        url, options=PostgresOptions(max_envelope_bytes=256 * 1024, missed_report_limit=100)
    )
    event_id = stable_event_id("chg-1", "task.started", "t1")
    draft = Draft(
        event_id=event_id,
        event_type="task.started",
        project_id=PROJECT,
        change_id="chg-1",
        task_id="t1",
        actor="service:python",
        payload={"agentId": "a1"},
    )
    try:
        with store.transaction() as unit:
            result = unit.append(PROJECT, [draft], tenant_id=TENANT)
    finally:
        store.close()
    assert [e.slot for e in result.events] == [4]
    return event_id


def test_a_typescript_service_writes_through_the_outbox_to_the_project_view(
    built: Path, settings: Settings, outbox: FreshSchema, tmp_path: Path
) -> None:
    s, url = settings, outbox.url
    cli(s, "provision")

    # Plain INSERTs, one an event: slots 1, 2, 3.
    code, first = _write(built, s, url, CHANGE, tmp_path, "--via", "insert")
    assert code == 0 and first["slots"] == [1, 2, 3] and first["duplicates"] == []
    expected_ids = [
        stable_event_id(f.get("changeId"), f["eventType"], f.get("taskId")) for f in CHANGE
    ]
    assert first["eventIds"] == expected_ids  # the same ids Python derives

    # Another writer takes slot 4; the TS writer, having seen slot 3, is told of it.
    missed_id = _another_writer(url)
    code, second = _write(built, s, url, WORK, tmp_path, "--via", "append", "--seen-slot", "3")
    assert code == 0, second
    assert second["slots"] == [5, 6, 7] and second["head"] == 7
    assert [(e["slot"], e["eventId"]) for e in second["missed"]] == [(4, missed_id)]
    assert second["missedComplete"] is True

    # A retried request writes nothing twice.
    code, again = _write(built, s, url, CHANGE, tmp_path, "--via", "append")
    assert code == 0 and again["slots"] == [] and again["duplicates"] == expected_ids

    # A bad event is refused by the writer's own JSON Schema check, before the database.
    code, refused = _write(built, s, url, BAD, tmp_path)
    assert code == SCHEMA_REFUSED and refused["refused"] == "schema"
    [problem] = refused["problems"]
    assert "payload must have required property 'agentId'" in problem
    with outbox.connect() as conn:
        rows = conn.execute("SELECT last_slot FROM outbox_slots").fetchall()
        assert rows == [(7,)]  # nothing of it written
        own = conn.execute(
            "SELECT task_id, last_event FROM ts_writer_tasks ORDER BY task_id"
        ).fetchall()
        # The writer's own state committed with its events (the refused event's did not).
        assert own == [("t1", "task.completed"), ("t2", "task.completed")]

    # Our publisher sends them to the stream and partition the writer computed, in slot order.
    published = run_cli(
        s, "publish", "--outbox", url, "--until-empty", "--json", env=cli_env(s), timeout=300
    )
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["published"] == 7
    messages = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=7)
    topic = f"rhumbatron_events_{second['stream']:02d}_{s.env}"
    assert {(m.topic(), m.partition()) for m in messages} == {(topic, second["partition"])}
    events = events_of(messages)
    assert [e.slot for e in events] == list(range(1, 8))

    # project-view-projector folds them; the view and the feed show them in slot order.
    done = consume_cli(s, "project-view-projector", until_idle=4, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    tp = TP(topic, second["partition"])
    view = json.loads(cli(s, "view", PROJECT, "--json").stdout)
    assert view == expected_view(PROJECT, tp, events)
    assert view["highSlot"] == 7 and view["missingSlots"] == [] and view["gapsRecorded"] == 0
    assert view["tasks"]["t1"]["state"] == view["tasks"]["t2"]["state"] == "completed"
    feed = read_feed(connect(s.redis_url, timeout=5), s.env, tp, PROJECT)  # as `feed` shows it
    in_slot_order = [*expected_ids, missed_id, *second["eventIds"]]
    assert [e["slot"] for e in reversed(feed)] == list(range(1, 8))
    assert [e["eventId"] for e in reversed(feed)] == in_slot_order


def test_a_bad_event_forced_past_the_schema_check_is_refused_by_the_database(
    built: Path, settings: Settings, outbox: FreshSchema, tmp_path: Path
) -> None:
    with outbox.connect() as conn:
        [(version,)] = conn.execute("SELECT max(version) FROM outbox_schema_version").fetchall()
    assert isinstance(version, int) and version >= 2  # 2 checks rows at INSERT; 3: an identity
    too_long: list[dict[str, Any]] = [
        {"eventType": "change.created", "changeId": "c" * 300, "payload": {}}
    ]
    # Refused by the writer's own check first, every problem named.
    code, refused = _write(built, settings, outbox.url, BAD + too_long, tmp_path)
    assert code == SCHEMA_REFUSED, refused
    assert [p.split(": ", 1)[1] for p in refused["problems"]][:2] == [
        "payload must have required property 'agentId'",
        "envelope/changeId must NOT have more than 200 characters",
    ]
    # Forced past it, by the database: the plain INSERT and rhumbatron_append alike.
    for facts, via, said in (
        (BAD, "insert", "outbox: payload.agentId is missing"),
        (too_long, "append", "outbox: change_id is 300 characters, over the 200 allowed"),
    ):
        code, refused = _write(
            built, settings, outbox.url, facts, tmp_path, "--via", via, "--skip-schema-check"
        )
        assert code == DATABASE_REFUSED, refused
        assert refused["refused"] == "database" and refused["sqlstate"] == "23514"
        assert refused["message"].startswith(said), refused["message"]
    with outbox.connect() as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchall() == [(0,)]


def test_the_stable_id_vectors_are_what_python_computes() -> None:
    """examples/ts-writer/test/stable-ids.json, which the node tests check the TS ids against."""
    found = json.loads((EXAMPLE / "test" / "stable-ids.json").read_text(encoding="utf-8"))
    assert len(found["vectors"]) >= 5
    for v in found["vectors"]:
        assert v["eventId"] == stable_event_id(
            v["changeId"], v["eventType"], v["taskId"], v["key"]
        ), v
