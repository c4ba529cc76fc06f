"""acme-task-history: one upserted row per task event, in the team's PostgreSQL.

rhumbatron.testing records a SQL processor's statements without running them; the last test runs
them in a real database when ``ACME_TEST_DATABASE`` names one (a URL whose search_path is a
schema the test may fill), and is skipped otherwise."""

from __future__ import annotations

import os
from collections.abc import Sequence

import psycopg
import pytest
from acme_processors.cli import DATABASE_VARIABLE, init_db, main
from acme_processors.history import UPSERT, TaskHistory
from task_events import lifecycle

from rhumbatron import SqlStatement
from rhumbatron.testing import assert_exactly_once, event, run

EVENTS = [
    *lifecycle("acme-web", "t1", "completed", first_slot=1),
    *lifecycle("acme-api", "t2", "failed", first_slot=1),
    *lifecycle("acme-web", "t3", "completed", first_slot=4),
]


def test_one_upsert_per_task_event() -> None:
    result = run(TaskHistory, EVENTS)
    assert [s.sql for s in result.sql] == [UPSERT] * len(EVENTS)
    rows = {a.event_id: a.sql[0].params for a in result.applied}
    assert set(rows) == {e.event_id for e in EVENTS}
    failed = EVENTS[5]
    assert rows[failed.event_id] == {
        "event_id": failed.event_id,
        "project_id": "acme-api",
        "task_id": "t2",
        "status": "failed",
        "actor": failed.actor,
        "slot": 3,
        "occurred_at": failed.timestamp,
        "payload": '{"reason": "tests failed"}',
    }


def test_other_events_write_nothing() -> None:
    others = [
        event("task.blocked", "acme-web", slot=1, task_id="t1"),
        event("change.created", "acme-web", slot=2, change_id="c1"),
    ]
    assert run(TaskHistory, others).sql == []


def test_an_event_naming_no_task_is_dead_lettered_and_its_project_goes_on() -> None:
    no_task = event("task.created", "acme-web", slot=7)
    result = run(TaskHistory, [*EVENTS, no_task])
    assert [d.event_id for d in result.dead_letters] == [no_task.event_id]
    assert result.dead_letters[0].reason.startswith("validate: ValueError: task.created")
    assert len(result.sql) == len(EVENTS)


def test_a_reprocess_writes_the_same_rows_again() -> None:
    result = run(TaskHistory, EVENTS, operator_move=("reprocess", len(EVENTS) // 2))
    first = {a.event_id: a.sql for a in result.applied if a.cursor_revision == 0}
    # Events published after the reprocess are first applied at its revision: not again.
    again = [a for a in result.applied if a.cursor_revision == 1 and a.event_id in first]
    assert again, "the reprocess ran nothing again"
    assert all(first[a.event_id] == a.sql for a in again)


def test_exactly_once_whatever_happens() -> None:
    assert_exactly_once(TaskHistory, EVENTS)


def test_init_db_needs_a_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DATABASE_VARIABLE, raising=False)
    assert main(["init-db"]) == 2
    assert DATABASE_VARIABLE in capsys.readouterr().err


def _apply(url: str, statements: Sequence[SqlStatement]) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        for statement in statements:
            conn.execute(statement.sql, statement.params)
        return conn.execute(
            "SELECT event_id, project_id, task_id, status, slot, payload FROM task_history "
            "ORDER BY event_id"
        ).fetchall()


@pytest.mark.skipif(
    not os.environ.get("ACME_TEST_DATABASE"), reason="ACME_TEST_DATABASE names no database"
)
def test_the_statements_run_in_postgresql_and_a_reprocess_converges() -> None:
    url = os.environ["ACME_TEST_DATABASE"]
    init_db(url)
    init_db(url)  # idempotent, as a deployment runs it on every upgrade
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE task_history")
    once = _apply(url, run(TaskHistory, EVENTS).sql)
    assert len(once) == len(EVENTS)
    reprocessed = run(TaskHistory, EVENTS, operator_move=("reprocess", len(EVENTS) // 2))
    assert len(reprocessed.sql) > len(EVENTS)
    assert _apply(url, reprocessed.sql) == once
