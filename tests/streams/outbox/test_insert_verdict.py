"""One rule on both sides of the outbox: what a writer's INSERT (PostgreSQL, schema version 2)
or append (SQLite) takes is exactly what the publisher sends, and what it refuses the publisher
would refuse, naming the column or field.

Rows are generated from the edges: names of 0, 1, 200 and 201 characters, control characters,
bad ids and types, versions 0 and 2, BC and far-future times, payloads that are no object, and
cataloged payloads with fields missing, null, of the wrong type, empty, blank or too long, beside
uncataloged types and versions the catalog does not know. The publisher's verdict is
:func:`streams.outbox.stored.stored_event_bytes` on the envelope the row makes.

The one place the verdicts may differ is the documented margin below ``max_envelope_bytes``:
the INSERT estimates the envelope's size from PostgreSQL's JSON text of the payload, which has a
space after every ``:`` and ``,``; a row within that many bytes of the limit may be refused
though the publisher would send it. The tests measure that margin and allow nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from psycopg import sql

from streams.catalog import CATALOG
from streams.envelopes import Draft, format_time
from streams.errors import EnvelopeError, OutboxError
from streams.outbox import stored
from streams.outbox.postgres import DEFAULT_MAX_ENVELOPE_BYTES
from streams.outbox.postgres_checks import payload_rules
from streams.outbox.publisher import Publisher
from streams.outbox.store import RowState
from tests.support.outbox import (
    OutboxBackend,
    SimulatedKafka,
    append_all,
    drafts,
    policy,
    sqlite_outbox,
)

LIMIT = DEFAULT_MAX_ENVELOPE_BYTES  # the outbox_limits row init writes; the stores' limit
VERDICT = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same rows on every run
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

RULES = payload_rules()
CATALOGED = sorted({r.event_type for r in RULES} | set(CATALOG.event_types()))
GOOD_VALUES: dict[str, Any] = {
    "string": "x",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "object": {},
    "array": ["a"],
}
EDGE_VALUES: list[Any] = [
    None,
    "",
    " ",
    "\u00a0",  # white space to the catalog's \S
    "\x1c",  # not white space to it (Unicode's White_Space), though Python's isspace says so
    "\u200b",
    "x",
    "x" * 1000,
    "x" * 1001,
    0,
    -1,
    2**64 - 1,
    2**64,
    1.0,
    True,
    [],
    ["a"],
    [""],
    [" "],
    [1],
    ["x" * 1001],
    {},
]


def names(*, optional: bool) -> st.SearchStrategy[str | None]:
    edges = st.sampled_from(
        ["", "a", "x" * 200, "x" * 201, "é" * 200, "é" * 201, "a\x01b", "tab\tname", "del\x7f"]
    )
    free = st.text(max_size=12).filter(lambda t: "\x00" not in t)
    choice: st.SearchStrategy[str | None] = st.one_of(st.just("name-1"), edges, free)
    return st.one_of(st.none(), choice) if optional else choice


def good_payload(event_type: str, version: int) -> dict[str, Any]:
    return {
        r.field: GOOD_VALUES[r.json_type]
        for r in RULES
        if (r.event_type, r.event_version) == (event_type, version) and r.required
    }


@st.composite
def payloads(draw: st.DrawFn, event_type: str | None, version: int | None) -> Any:
    """A payload near the type's model: valid, then edited at up to two fields."""
    if draw(st.integers(0, 9)) == 7:
        return draw(st.sampled_from([[1], "text", 5, None, []]))  # not an object
    payload = good_payload(event_type or "", version or 1)
    fields = [r for r in RULES if r.event_type == event_type] or RULES
    for _ in range(draw(st.sampled_from([1, 2, 0]))):
        rule = draw(st.sampled_from(fields))
        key = draw(st.sampled_from([rule.field, rule.alt_field or rule.field, "extra"]))
        if draw(st.booleans()):
            payload.pop(key, None)
        else:
            payload[key] = draw(st.sampled_from(EDGE_VALUES))
    if draw(st.integers(0, 4)) == 3:  # near the size limit
        payload["pad"] = "p" * draw(st.integers(LIMIT - 1600, LIMIT - 150))
    return payload


EVENT_TYPES = st.one_of(st.sampled_from(CATALOGED), st.just("team.own_thing"))


OPTIONAL_NAMES = ("change_id", "task_id", "caused_by", "correlation_id")
EDGES: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.sampled_from(["evt_" + "A" * 32, "evt_" + "0" * 31, "evt_1", "", None]),
    "event_type": st.one_of(
        st.none(), st.sampled_from(["Task.done", "task", "a." + "b" * 99, "a." + "b" * 98])
    ),
    "event_version": st.sampled_from([0, -1, 2, None]),
    "tenant_id": names(optional=False),
    "actor": names(optional=False),
    **{column: names(optional=True) for column in OPTIONAL_NAMES},
    "resource": st.sampled_from(["", "x" * 1000, "x" * 1001, "a\x01b"]),
    "canonical_generation": st.sampled_from([0, -1, 2**31 - 1]),
    "occurred_at": st.sampled_from(
        [
            "0001-01-01 00:00:00+00",
            "0001-01-01 00:00:00+01",  # 1 BC in UTC
            "0001-01-01 00:00:00+00 BC",
            "9999-12-31 23:59:59.999+00",
            "9999-12-31 23:30:00-01",  # year 10000 in UTC
            "10000-01-01 00:00:00+00",
            "infinity",
            "-infinity",
            None,
        ]
    ),
}


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    """The columns of one INSERT (None: NULL, or the default where the table has one): a good
    row with up to two columns at an edge, and a payload near its type's model."""
    row: dict[str, Any] = {
        "event_id": "new",
        "event_type": draw(EVENT_TYPES),
        "event_version": draw(st.sampled_from([1, 1, 1, 2, None])),
        "tenant_id": "tenant-1",
        "project_id": draw(st.sampled_from(["proj-a", "proj-b"])),
        **{column: draw(st.sampled_from([None, "name-1"])) for column in OPTIONAL_NAMES},
        "actor": "agent:a",
        "resource": draw(st.sampled_from([None, "src/a.py"])),
        "canonical_generation": draw(st.sampled_from([None, 7])),
        "occurred_at": "2026-01-01 12:00:00.123456+00",
    }
    for column in draw(st.lists(st.sampled_from(sorted(EDGES)), max_size=2, unique=True)):
        row[column] = draw(EDGES[column])
    row["payload"] = draw(payloads(row["event_type"], row["event_version"]))
    return row


def _note(text: str, kind: str | None = None) -> None:
    with suppress(InvalidArgument):  # an explicit test, not a generated example
        note(text)
        if kind is not None:
            event(kind)


def publisher_verdict(envelope: str | bytes) -> str | None:
    """None if the publisher sends this envelope, else why not."""
    try:
        stored.stored_event_bytes(envelope, max_bytes=LIMIT)
    except EnvelopeError as exc:
        return str(exc)
    return None


# -- PostgreSQL ---------------------------------------------------------------------------------
COLUMNS = (
    "event_id",
    "event_type",
    "event_version",
    "tenant_id",
    "project_id",
    "change_id",
    "task_id",
    "actor",
    "resource",
    "canonical_generation",
    "caused_by",
    "correlation_id",
    "occurred_at",
    "payload",
)
NOT_NULL = ("event_id", "event_type", "event_version", "tenant_id", "project_id")
NOT_NULL_MORE = ("actor", "payload", "occurred_at", "created_at", "slot", "state")


@pytest.fixture
def shadow(pg: OutboxBackend) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the outbox, with ``shadow``: the outbox's columns without a
    check, a trigger or a NOT NULL, so any row can be stored and read as its envelope would
    be (``outbox_envelope``), as the publisher would read it had the INSERT taken it."""
    assert pg.schema is not None
    with pg.schema.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE shadow (LIKE outbox INCLUDING DEFAULTS)")
        conn.execute("ALTER TABLE shadow ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY")
        for column in (*NOT_NULL, *NOT_NULL_MORE, "attempts", "deferrals"):
            conn.execute(
                sql.SQL("ALTER TABLE shadow ALTER COLUMN {} DROP NOT NULL").format(
                    sql.Identifier(column)
                )
            )
        yield conn


def _kind(refusal: str | None) -> str:
    """The refusal's class, for the run's statistics (--hypothesis-show-statistics)."""
    if refusal is None:
        return "taken"
    for word in ("max_envelope_bytes", "payload.", "timestamp", "occurred_at", "payload"):
        if word in refusal:
            return f"refused: {word}"
    return "refused: an envelope field"


class RawJson(str):
    """A payload given as JSON text (a number no float holds: 1e400)."""


# Columns whose NULL means "left out": the table's default (1, now(), {}) is what a row gets.
DEFAULTED = ("event_version", "occurred_at", "payload")


def _values(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for column in COLUMNS:
        value = row[column]
        if value is None and column in DEFAULTED:
            continue
        if column == "payload" and not isinstance(value, RawJson):
            value = json.dumps(value)  # any JSON text (orjson refuses integers past 64 bits)
        if column == "event_id" and value == "new":
            value = "evt_" + secrets.token_hex(16)
        out[column] = value
    return out


def _one(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
    found = conn.execute(query.encode(), params).fetchone()
    assert found is not None, query
    return tuple(found)


def _insert(
    conn: psycopg.Connection[Any], table: str, row: dict[str, Any], slot: int | None
) -> Any:
    values = {**row, "slot": slot} if slot is not None else row
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING seq, slot").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder() * len(values)),
    )
    return conn.execute(query, list(values.values())).fetchone()


def _pg_verdicts(conn: psycopg.Connection[Any], row: dict[str, Any]) -> None:
    values = _values(row)
    insert_refusal: str | None = None
    try:
        with conn.transaction():
            found = _insert(conn, "outbox", values, None)
    except psycopg.errors.CheckViolation as exc:
        insert_refusal = exc.diag.message_primary or str(exc)
    _note(f"insert: {insert_refusal or 'taken'}", _kind(insert_refusal))
    if insert_refusal is None:
        assert found is not None
        (envelope,) = _one(
            conn, "SELECT outbox_envelope(o)::text FROM outbox o WHERE seq = %s", (found[0],)
        )
        verdict = publisher_verdict(envelope)
        assert verdict is None, f"taken at INSERT, refused by the publisher: {verdict}"
        return
    # Refused: the named column, or the payload's field, or the size, and the rule.
    assert insert_refusal.startswith("outbox: ")
    assert (
        "(Event." in insert_refusal
        or "payload." in insert_refusal
        or ("max_envelope_bytes" in insert_refusal)
    ), insert_refusal
    (slot,) = _one(
        conn,
        "SELECT coalesce(max(last_slot), 0) + 1 FROM outbox_slots WHERE project_id = %s",
        (row["project_id"],),
    )
    with conn.transaction():
        seq = _insert(conn, "shadow", values, slot)[0]
        envelope, estimate, payload_text = _one(
            conn,
            "SELECT outbox_envelope(ROW(s.*)::outbox)::text, "
            "outbox_envelope_size(ROW(s.*)::outbox), s.payload::text FROM shadow s WHERE seq = %s",
            (seq,),
        )
    assert envelope is not None
    verdict = publisher_verdict(envelope)
    _note(f"publisher: {verdict or 'sends it'}")
    if verdict is None:
        # The margin: refused on its estimated size, which is over the canonical size by the
        # spaces PostgreSQL writes in the payload's JSON, and nothing else.
        assert "max_envelope_bytes" in insert_refusal, insert_refusal
        canonical = len(stored.stored_event_bytes(envelope, max_bytes=LIMIT))
        spaces = len(payload_text.encode()) - len(orjson.dumps(orjson.loads(payload_text)))
        assert canonical <= LIMIT < estimate <= canonical + spaces


@pytest.mark.integration
@VERDICT
@given(row=rows())
def test_the_insert_takes_what_the_publisher_sends_and_refuses_the_rest(
    shadow: psycopg.Connection[Any], row: dict[str, Any]
) -> None:
    _pg_verdicts(shadow, row)


@pytest.mark.integration
@pytest.mark.parametrize(
    "row",
    [
        {"change_id": "c" * 300},
        {"occurred_at": "0044-03-15 12:00:00+00 BC"},
        {"occurred_at": "12026-01-01 00:00:00+00"},
        {"payload": [1]},
        {"payload": {}},
        {"payload": {"agentId": ""}},
        {"payload": {"agentId": 5}},
        {"event_type": "team.own_thing", "payload": {"anything": [1, {"at": "all"}]}},
        {"event_version": 2, "payload": {"not": "checked"}},
        {"event_version": 0},
        {"actor": "x" * 201},
        {"tenant_id": "a\x1fb"},
        {"payload": RawJson('{"agentId": "a", "n": 1e400}')},
        {"payload": {"agentId": "a", "deep": json.loads("[" * 300 + "]" * 300)}},
    ],
    ids=",".join,
)
def test_edges_one_by_one(shadow: psycopg.Connection[Any], row: dict[str, Any]) -> None:
    base: dict[str, Any] = {c: None for c in COLUMNS}
    base.update(
        event_id="new",
        event_type="task.completed",
        event_version=1,
        tenant_id="tenant-1",
        project_id="proj-a",
        actor="service:billing",
        occurred_at="2026-01-01 00:00:00+00",
        payload={"agentId": "agent-1"},
    )
    _pg_verdicts(shadow, {**base, **row})


@pytest.mark.integration
def test_the_size_margin_is_the_spaces_in_the_payloads_json(
    shadow: psycopg.Connection[Any],
) -> None:
    """Measured: an envelope the publisher sends, its canonical bytes at the limit exactly, is
    estimated over it by one byte per member of the payload's objects and per array element
    after the first (the spaces PostgreSQL writes after ':' and ','); refused at INSERT. With
    one key less in it, the row is taken."""
    base: dict[str, Any] = {c: None for c in COLUMNS}
    base.update(
        event_type="team.own_thing",
        event_version=1,
        tenant_id="t",
        project_id="proj-margin",
        actor="a",
        occurred_at="2026-01-01 00:00:00+00",
    )
    items = {f"k{n}": n for n in range(100)}  # 100 members: 100 ': ' and 99 ', ' in its text
    probe = {**base, "event_id": "new", "payload": {**items, "pad": ""}}
    values = _values(probe)
    with shadow.transaction():
        seq = _insert(shadow, "shadow", values, 1)[0]
        envelope, estimate = _one(
            shadow,
            "SELECT outbox_envelope(ROW(s.*)::outbox)::text, outbox_envelope_size(ROW(s.*)::outbox) "
            "FROM shadow s WHERE seq = %s",
            (seq,),
        )
    assert envelope is not None
    canonical = len(stored.stored_event_bytes(envelope, max_bytes=LIMIT))
    margin = estimate - canonical
    assert margin == 101 + 100  # payload members (101 with pad) and commas (100)
    # A row whose canonical envelope is exactly the limit: the publisher sends it, the INSERT
    # (estimating LIMIT + margin) refuses it on its size.
    pad = "p" * (LIMIT - canonical)
    at_limit = {**base, "event_id": "new", "payload": {**items, "pad": pad}}
    refused = pytest.raises(psycopg.errors.CheckViolation, match="max_envelope_bytes")
    with refused, shadow.transaction():
        _insert(shadow, "outbox", _values(at_limit), None)
    taken = {**base, "event_id": "new", "payload": {"pad": "p" * (LIMIT - canonical - 100)}}
    with shadow.transaction():
        assert _insert(shadow, "outbox", _values(taken), None) is not None


# -- SQLite ---------------------------------------------------------------------------------------
PLUS_ONE = timezone(timedelta(hours=1))
MINUS_ONE = timezone(timedelta(hours=-1))
TIMES = st.sampled_from(
    [
        None,
        datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=PLUS_ONE),  # year 0 in UTC
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 30, tzinfo=MINUS_ONE),  # year 10000 in UTC
        datetime(2026, 1, 1),  # no timezone
    ]
)
SQLITE_EDGES = [v for v in EDGE_VALUES if not (isinstance(v, int) and v >= 2**64)]


def _wire_time(value: datetime) -> str:
    if value.tzinfo is None:
        return value.isoformat()
    try:
        return format_time(value)
    except OverflowError:
        return "0000-12-31T23:00:00.000Z" if value.year == 1 else "10000-01-01T00:30:00.000Z"


@st.composite
def sqlite_drafts(draw: st.DrawFn) -> tuple[Draft, str]:
    row = draw(rows())
    payload = row["payload"]
    if isinstance(payload, dict):
        payload = {k: v for k, v in payload.items() if not (isinstance(v, int) and v >= 2**64)}
    draft = Draft(
        event_id=row["event_id"] if row["event_id"] is not None else "",
        event_type=row["event_type"] or "",
        project_id=row["project_id"],
        change_id=row["change_id"],
        task_id=row["task_id"],
        actor=row["actor"] or "",
        payload=payload,
        canonical_generation=row["canonical_generation"],
        resource=row["resource"],
        event_version=row["event_version"] if row["event_version"] is not None else 1,
        caused_by=row["caused_by"],
        correlation_id=row["correlation_id"],
        occurred_at=draw(TIMES),
    )
    return draft, row["tenant_id"] or ""


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Any]:
    store = sqlite_outbox(tmp_path / "outbox.db")
    yield store
    store.close()


@VERDICT
@given(case=sqlite_drafts())
def test_the_sqlite_append_takes_what_the_publisher_sends_and_refuses_the_rest(
    sqlite_store: Any, case: tuple[Draft, str]
) -> None:
    draft, tenant = case
    if draft.event_id == "new":
        draft = dataclasses.replace(draft, event_id="evt_" + secrets.token_hex(16))
    slot = sqlite_store.last_slot(draft.project_id) + 1
    now = datetime.now(UTC)
    refusal: Exception | None = None
    try:
        with sqlite_store.transaction() as unit:
            result = unit.append(draft.project_id, [draft], tenant_id=tenant)
    except (EnvelopeError, OutboxError) as exc:
        refusal = exc
    _note(f"append: {refusal or 'taken'}", _kind(str(refusal) if refusal else None))
    wire = {
        "eventId": draft.event_id,
        "eventType": draft.event_type,
        "eventVersion": draft.event_version,
        "tenantId": tenant,
        "projectId": draft.project_id,
        "changeId": draft.change_id,
        "taskId": draft.task_id,
        "actor": draft.actor,
        "resource": draft.resource,
        "canonicalGeneration": draft.canonical_generation,
        "causedBy": draft.caused_by,
        "correlationId": draft.correlation_id,
        "timestamp": _wire_time(draft.occurred_at or now),
        "slot": slot,
        "payload": draft.payload,
    }
    # Absent fields left out, as the envelope leaves them; a payload of None is sent as null.
    present = {k: v for k, v in wire.items() if v is not None or k == "payload"}
    verdict = publisher_verdict(orjson.dumps(present))
    _note(f"publisher: {verdict or 'sends it'}")
    if refusal is None:
        assert verdict is None, f"taken by append, refused by the publisher: {verdict}"
        assert result.events[0].slot == slot
    else:
        assert verdict is not None, f"refused by append, sent by the publisher: {refusal}"
        if isinstance(refusal, EnvelopeError):
            assert refusal.field and refusal.field in str(refusal)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"change_id": "c" * 201}, "changeId"),
        ({"caused_by": ""}, "causedBy"),
        ({"correlation_id": "a\x01"}, "correlationId"),
        ({"event_version": 0}, "eventVersion"),
        ({"occurred_at": datetime(1, 1, 1, tzinfo=PLUS_ONE)}, "timestamp"),
        ({"payload": {}}, "payload.agentId"),
        ({"payload": {"agentId": " "}}, "payload.agentId"),
    ],
)
def test_the_sqlite_append_names_the_field(
    sqlite_store: Any, change: dict[str, Any], field: str
) -> None:
    draft = Draft(
        event_id="evt_" + secrets.token_hex(16),
        event_type="task.completed",
        project_id="proj-a",
        change_id=None,
        task_id=None,
        actor="agent:a",
        payload={"agentId": "a"},
    )
    bad = dataclasses.replace(draft, **change)
    with pytest.raises(EnvelopeError) as refused, sqlite_store.transaction() as unit:
        unit.append("proj-a", [bad], tenant_id="t")
    assert refused.value.field == field
    assert sqlite_store.last_slot("proj-a") == 0


# -- the publisher's side ---------------------------------------------------------------------------
def _bad_payload_envelope(event_id: str, project: str, slot: int) -> bytes:
    return orjson.dumps(
        {
            "eventId": event_id,
            "eventType": "task.completed",
            "tenantId": "t",
            "projectId": project,
            "actor": "agent:a",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "slot": slot,
            "payload": {"agentId": " "},
        }
    )


def test_the_sqlite_publisher_fails_a_stored_row_whose_cataloged_payload_is_not_its_models(
    sqlite_store: Any, tmp_path: Path
) -> None:
    """A row put into the file by another program: the publisher checks its payload against the
    catalog as it reads it, fails it naming the field, and holds only its project."""
    event_id = "evt_" + secrets.token_hex(16)
    conn = sqlite3.connect(tmp_path / "outbox.db")
    with conn:
        conn.execute(
            "INSERT INTO outbox (event_id, project_id, slot, event_type, envelope, created_at) "
            "VALUES (?, 'proj-hand', 1, 'task.completed', ?, 0)",
            (event_id, _bad_payload_envelope(event_id, "proj-hand", 1)),
        )
    conn.close()
    _publish_and_check(sqlite_store, event_id)


@pytest.mark.integration
def test_the_postgres_publisher_fails_a_v1_row_whose_cataloged_payload_is_not_its_models(
    pg_v1: OutboxBackend,
) -> None:
    """Version 1 took any object as the payload; the publisher refuses it, naming the field."""
    assert pg_v1.schema is not None
    event_id = "evt_" + secrets.token_hex(16)
    with pg_v1.schema.connect() as conn:
        conn.execute(
            "INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, payload) "
            "VALUES (%s, 'task.completed', 'proj-hand', 't', 'agent:a', '{\"agentId\": \" \"}')",
            (event_id,),
        )
    _publish_and_check(pg_v1.store(), event_id)


def _publish_and_check(store: Any, event_id: str) -> None:
    append_all(store, drafts("proj-good", 2))
    kafka = SimulatedKafka()
    with Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        publisher.run_pass()
        publisher.run_pass()
    row = store.get(event_id)
    assert row is not None and row.state is RowState.FAILED
    assert "payload.agentId" in (row.last_error or "")
    assert [h.project_id for h in store.held_projects(10)] == ["proj-hand"]
    assert store.counts()[RowState.PUBLISHED] == 2
