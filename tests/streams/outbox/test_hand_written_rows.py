"""Outbox rows written by hand, past our writers, with bad columns: on PostgreSQL an INSERT of the
documented schema with any value in any column a writer supplies; on SQLite a row put straight
into the table (whose columns take any type). Whatever was written:

- the database refuses it (a CHECK, a NOT NULL, a type), with its own error; or
- the publisher sends it as an event that agrees with the row's columns (from SQLite, checked
  for shape only: an object with the row's id, project, slot and type that is still no valid
  event is dead-lettered as poison by each subscription, naming the field); or
- the publisher marks it ``failed`` with a reason, and it holds its project's later rows;

never a crash of the publisher, never a project held by another's bad row, and the operator's
reads (counts, held projects, failed rows) answer.

``RHUMBATRON_PROPERTY_EXAMPLES`` sets the examples in `make test`; the ``slow`` variants run
``RHUMBATRON_SOAK_EXAMPLES``.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from streams.envelopes import Event, build, decode_event, encode
from streams.errors import EnvelopeError
from streams.outbox.publisher import Publisher
from streams.outbox.store import RowState
from tests.support.outbox import OutboxBackend, SimulatedKafka, append_all, drafts, policy

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30"))
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "1000"))
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
LIMIT = 256 * 1024  # the backends' max_envelope_bytes (tests/support/outbox.py)
GOOD = ("good-1", "good-2")
HAND = "hand"


def _id() -> str:
    return "evt_" + secrets.token_hex(16)


def envelope(event_id: str, project_id: str, slot: int, **extra: Any) -> bytes:
    fields: dict[str, Any] = {
        "event_id": event_id,
        "event_type": "task.completed",
        "tenant_id": "t",
        "project_id": project_id,
        "actor": "service:hand",
        "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
        "payload": {"agentId": "a"},
        "slot": slot,
    }
    fields.update(extra)
    return encode(build(Event, **fields), max_bytes=1 << 21)


texts = st.one_of(
    st.sampled_from(["", "x" * 201, "a\x01b", "a\nb", "é", " "]),
    st.text(max_size=20).filter(lambda t: "\x00" not in t),
)
TRACE_CONTEXTS = [
    None,
    "not json",
    '"x"',
    "[1]",
    "5",
    '{"traceparent": 5}',
    '{"traceparent": "garbage"}',
    '{"traceparent": "00-' + "a" * 32 + "-" + "b" * 16 + '-01", "tracestate": ["x"]}',
    "{}",
]


# -- PostgreSQL: the documented INSERT, any value in any column ---------------------------------
PG_COLUMNS: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.one_of(st.builds(_id), st.sampled_from(["evt_nope", "", None])),
    "event_type": st.one_of(
        st.just("task.completed"), st.sampled_from(["Task.X", "task", "a." + "b" * 120, None])
    ),
    "event_version": st.one_of(st.just(1), st.sampled_from([0, -1, 2**31 - 1, None])),
    "tenant_id": st.one_of(st.just("t"), texts, st.none()),
    "project_id": st.one_of(st.just(HAND), texts, st.none()),
    "change_id": st.one_of(st.none(), texts),
    "task_id": st.one_of(st.none(), texts),
    "actor": st.one_of(st.just("service:hand"), texts, st.none()),
    "resource": st.one_of(st.none(), texts, st.just("r" * 300_000)),
    "canonical_generation": st.one_of(st.none(), st.sampled_from([0, -1, 2**31 - 1])),
    "caused_by": st.one_of(st.none(), texts),
    "correlation_id": st.one_of(st.none(), texts),
    "payload": st.sampled_from(
        [
            "{}",
            '{"agentId": "a"}',
            "[]",
            '"x"',
            "5",
            "null",
            '{"blob": "' + "x" * (LIMIT + 10) + '"}',
            '{"deep": ' + "[" * 500 + "]" * 500 + "}",
            '{"s": "\\u00e9\\ud83d\\ude00"}',
        ]
    ),
    "occurred_at": st.sampled_from(
        [
            "2026-01-01 00:00:00+00",
            "infinity",
            "-infinity",
            "0001-01-01 00:00:00+00",
            "20000-01-01 00:00:00+00",
            "2026-01-01 23:59:59.9999+14",
            "garbage",
        ]
    ),
    "trace_context": st.sampled_from(TRACE_CONTEXTS),
}
PG_CASTS = {"payload": "::jsonb", "trace_context": "::jsonb", "occurred_at": "::timestamptz"}


@st.composite
def pg_rows(draw: st.DrawFn) -> dict[str, Any]:
    """Columns to write: each left out (its default) or given a drawn value."""
    names = draw(st.sets(st.sampled_from(sorted(PG_COLUMNS)), min_size=1, max_size=5))
    row: dict[str, Any] = {
        "event_id": _id(),
        "event_type": "task.completed",
        "tenant_id": "t",
        "project_id": HAND,
        "actor": "service:hand",
    }
    for name in names:
        row[name] = draw(PG_COLUMNS[name])
    return row


def pg_insert(backend: OutboxBackend, row: dict[str, Any]) -> str | None:
    """The INSERT a writer in any language sends; the database's refusal, if it refused."""
    assert backend.schema is not None
    names = ", ".join(row)
    values = ", ".join(f"%s{PG_CASTS.get(n, '')}" for n in row)
    try:
        with backend.schema.connect() as conn:
            conn.execute(
                f"INSERT INTO outbox ({names}) VALUES ({values})".encode(), list(row.values())
            )
    except psycopg.Error as exc:
        return str(exc) or type(exc).__name__
    return None


# -- SQLite: a row put straight into the table ---------------------------------------------------
@st.composite
def sqlite_rows(draw: st.DrawFn) -> dict[str, Any]:
    event_id: Any = draw(st.one_of(st.builds(_id), st.sampled_from(["evt_nope", "", 5, b"\xff"])))
    project: Any = draw(st.one_of(st.just(HAND), st.sampled_from(["", b"blob", 7, "a\x01b"])))
    # Not text: SQLite orders text after every number, so a row whose slot is text is never a
    # project's head and never read for sending (it stays pending, holding nothing).
    slot: Any = draw(st.one_of(st.just(1), st.sampled_from([0, -1, 2.5])))
    event_type = draw(st.one_of(st.just("task.completed"), st.sampled_from(["Bad", b"x", 3])))
    good_columns = (
        isinstance(event_id, str)
        and event_id.startswith("evt_")
        and len(event_id) == 36
        and isinstance(project, str)
        and project
        and "\x01" not in project
        and isinstance(slot, int)
        and slot >= 1
    )
    kind = draw(
        st.sampled_from(
            ["matching", "other-project", "other-id", "other-slot", "garbage", "text", "huge", 5]
        )
    )
    value: Any
    if kind == "matching" and good_columns:
        value = envelope(event_id, project, slot)
    elif kind == "text" and good_columns:
        value = envelope(event_id, project, slot).decode()
    elif kind == "huge" and good_columns:
        value = envelope(event_id, project, slot, payload={"blob": "x" * LIMIT})
    elif kind == "other-project":
        value = envelope(_id(), "someone-else", 1)
    elif kind == "other-id":
        value = envelope(_id(), HAND, 1)
    elif kind == "other-slot":
        value = envelope(event_id if isinstance(event_id, str) and good_columns else _id(), HAND, 9)
    elif kind == 5:
        value = 5
    else:
        value = draw(st.binary(max_size=40))
    return {
        "event_id": event_id,
        "project_id": project,
        "slot": slot,
        "event_type": event_type,
        "envelope": value,
        "trace_context": draw(st.sampled_from(TRACE_CONTEXTS)),
        "created_at": draw(st.sampled_from([1.0, 1_700_000_000.5, "yesterday", 3])),
    }


def sqlite_insert(backend: OutboxBackend, row: dict[str, Any]) -> str | None:
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    conn = sqlite3.connect(backend.path)
    try:
        with conn:
            conn.execute(f"INSERT INTO outbox ({names}) VALUES ({marks})", list(row.values()))
    except sqlite3.Error as exc:
        return str(exc) or type(exc).__name__
    finally:
        conn.close()
    return None


# -- the property ---------------------------------------------------------------------------------
def _note(text: str) -> None:
    with suppress(InvalidArgument):  # an explicit test, not a generated example
        note(text)


def check(
    backend: OutboxBackend,
    rows: list[dict[str, Any]],
    insert: Callable[[OutboxBackend, dict[str, Any]], str | None],
    after: Callable[[OutboxBackend, dict[str, Any]], None],
) -> list[tuple[Any, ...]]:
    """Write good rows of two projects and ``rows`` by hand, run three publisher passes, check;
    the rows as stored (event id, project, state, last error)."""
    backend.reset()
    store = backend.store()
    try:  # closed at once: a generated example must not hold its connections till the end
        return _check(backend, store, rows, insert, after)
    finally:
        store.close()


def _check(
    backend: OutboxBackend,
    store: Any,
    rows: list[dict[str, Any]],
    insert: Callable[[OutboxBackend, dict[str, Any]], str | None],
    after: Callable[[OutboxBackend, dict[str, Any]], None],
) -> list[tuple[Any, ...]]:
    append_all(store, [d for p in GOOD for d in drafts(p, 3)])
    for row in rows:
        _note(
            f"row: { {k: (v[:80] if isinstance(v, str | bytes) else v) for k, v in row.items()} }"
        )
        refused = insert(backend, row)
        if refused is not None:
            _note(f"refused by the database: {refused}")
            assert refused.strip()
        else:
            after(backend, row)
    kafka = SimulatedKafka()
    with Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        for _ in range(3):
            publisher.run_pass()
    stored = backend.query("SELECT event_id, project_id, state, last_error FROM outbox")
    failed_projects = {p for _, p, state, _ in stored if state == RowState.FAILED}
    for event_id, project, state, last_error in stored:
        if project in GOOD:
            assert state == RowState.PUBLISHED, (event_id, state, last_error)
        elif state == RowState.FAILED:
            assert (last_error or "").strip(), "a failed row must say why"
            _note(f"failed: {last_error}")
        elif state == RowState.PENDING:
            assert project in failed_projects, f"{event_id} of {project!r} pending, nothing held"
        else:
            assert state == RowState.PUBLISHED, (event_id, state)
    sent = [value for log in kafka.log.values() for _, value in log]
    published = {str(e) for e, _, state, _ in stored if state == RowState.PUBLISHED}
    assert len(sent) == len(published)
    for value in sent:  # whatever went out is a row that was published, under its own id
        try:
            event_id = decode_event(value, max_bytes=LIMIT).event_id
        except EnvelopeError:
            # Only from SQLite, whose rows the publisher checks for shape, not field by field:
            # each subscription dead-letters it as poison naming the field (the runtime's tests).
            assert backend.schema is None, value[:200]
            event_id = orjson.loads(value)["eventId"]
        assert event_id in published
    # The operator's reads answer.
    store.counts()
    store.held_projects(10)
    store.rows_in_state(RowState.FAILED, 10)
    return stored


def pg_after(backend: OutboxBackend, row: dict[str, Any]) -> None:
    """A good row of the same project behind the hand-written one."""
    project = row["project_id"]
    if isinstance(project, str) and project and "\x01" not in project and len(project) <= 200:
        assert pg_insert(backend, {**row, **_good_pg(project)}) is None


def _good_pg(project: str) -> dict[str, Any]:
    return {
        "event_id": _id(),
        "event_type": "task.completed",
        "event_version": 1,
        "tenant_id": "t",
        "project_id": project,
        "actor": "service:hand",
        "payload": '{"agentId": "a"}',
        "occurred_at": "2026-01-01 00:00:00+00",
        "trace_context": None,
        **{k: None for k in ("change_id", "task_id", "resource", "caused_by", "correlation_id")},
        "canonical_generation": None,
    }


def sqlite_after(backend: OutboxBackend, row: dict[str, Any]) -> None:
    """A good row of the same project at the next slot, as a careful hand would write it."""
    project, slot = row["project_id"], row["slot"]
    if isinstance(project, str) and project and isinstance(slot, int) and slot >= 0:
        event_id = _id()
        good = {
            "event_id": event_id,
            "project_id": project,
            "slot": slot + 1,
            "event_type": "task.completed",
            "envelope": envelope(event_id, project, slot + 1) if "\x01" not in project else b"{}",
            "trace_context": None,
            "created_at": 1.0,
        }
        sqlite_insert(backend, good)


@pytest.fixture
def pg(tmp_path: Path) -> Any:
    backend = OutboxBackend("postgres", tmp_path)
    yield backend
    backend.close()


@pytest.fixture
def lite(tmp_path: Path) -> Any:
    backend = OutboxBackend("sqlite", tmp_path)
    backend.store().close()  # the file and its tables
    yield backend
    backend.close()


@pytest.mark.integration
@PROPERTY
@given(row=pg_rows())
def test_postgres_rows_written_by_hand(pg: OutboxBackend, row: dict[str, Any]) -> None:
    check(pg, [row], pg_insert, pg_after)


@PROPERTY
@given(row=sqlite_rows())
def test_sqlite_rows_written_by_hand(lite: OutboxBackend, row: dict[str, Any]) -> None:
    check(lite, [row], sqlite_insert, sqlite_after)


@pytest.mark.slow
@pytest.mark.integration
@SOAK
@given(row=pg_rows())
def test_postgres_rows_written_by_hand_soak(pg: OutboxBackend, row: dict[str, Any]) -> None:
    check(pg, [row], pg_insert, pg_after)


@pytest.mark.slow
@SOAK
@given(row=sqlite_rows())
def test_sqlite_rows_written_by_hand_soak(lite: OutboxBackend, row: dict[str, Any]) -> None:
    check(lite, [row], sqlite_insert, sqlite_after)


# -- the examples that stopped every project -------------------------------------------------------
def test_a_postgres_trace_context_of_another_shape_does_not_stop_the_publisher(
    pg: OutboxBackend,
) -> None:
    # jsonb takes any JSON: a string there made every pass fail ('str' has no attribute 'items').
    shapes = ('"x"', "[1]", '{"traceparent": 5}')
    rows = [{**_good_pg(f"{HAND}-{n}"), "trace_context": shape} for n, shape in enumerate(shapes)]
    stored = check(pg, rows, pg_insert, pg_after)
    assert {state for _, _, state, _ in stored} == {"published"}
    assert len(stored) == len(GOOD) * 3 + len(shapes) * 2


def test_a_sqlite_row_with_a_bad_envelope_or_trace_context_fails_alone(lite: OutboxBackend) -> None:
    # A bad trace context made every pass fail; a bad envelope went out to every subscription as
    # poison, an envelope of another event under the row's columns as that event.
    store = lite.store()
    append_all(store, drafts("good-1", 2))
    rows: dict[str, tuple[Callable[[str, str], bytes], str | None]] = {
        "garbage": (lambda _id, _p: b"\xff not json", None),
        "other-project": (lambda event_id, _p: envelope(event_id, "someone-else", 1), None),
        "bad-trace": (lambda event_id, p: envelope(event_id, p, 1), "not json"),
    }
    for project, (value, trace) in rows.items():
        event_id = _id()
        row = {
            "event_id": event_id,
            "project_id": project,
            "slot": 1,
            "event_type": "task.completed",
            "envelope": value(event_id, project),
            "trace_context": trace,
            "created_at": 1.0,
        }
        assert sqlite_insert(lite, row) is None
    kafka = SimulatedKafka()
    with Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        publisher.run_pass()
    state = {
        p: (s, e) for p, s, e in lite.query("SELECT project_id, state, last_error FROM outbox")
    }
    assert state["good-1"][0] == "published" and state["bad-trace"][0] == "published"
    assert state["garbage"][0] == "failed" and "not valid JSON" in state["garbage"][1]
    assert state["other-project"][0] == "failed"
    assert (
        "projectId 'someone-else' is not the row's project_id 'other-project'"
        in (state["other-project"][1])
    )
    assert [h.project_id for h in store.held_projects(10)] == ["garbage", "other-project"]
    sent = sorted(orjson.loads(v)["projectId"] for log in kafka.log.values() for _, v in log)
    assert sent == ["bad-trace", "good-1", "good-1"]
