"""rhumbatron.append: a service's events written in its own PostgreSQL transaction, with its own
change, or not at all; the limits are the settings'."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rhumbatron import Draft, EnvelopeError, append
from streams.ids import new_event_id
from tests.support.environment import make_settings
from tests.support.postgres import FreshSchema

pytestmark = pytest.mark.integration


@pytest.fixture
def schema() -> Iterator[FreshSchema]:
    fresh = FreshSchema()
    with fresh.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id integer PRIMARY KEY, state text NOT NULL)")
        conn.execute("INSERT INTO invoices VALUES (42, 'open')")
    yield fresh
    fresh.drop()


def _draft(event_type: str, payload: dict[str, object], **fields: object) -> Draft:
    return Draft(
        event_id=new_event_id(),
        event_type=event_type,
        project_id="proj-7",
        change_id="chg-1",
        task_id="task-1",
        actor="agent:a1",
        payload=payload,
        **fields,  # type: ignore[arg-type]
    )


def test_the_events_commit_with_the_services_change(schema: FreshSchema) -> None:
    settings = make_settings(outbox_missed_report_limit=10)
    with schema.connect() as conn:
        conn.execute("UPDATE invoices SET state = 'paid' WHERE id = 42")
        first = append(conn, _draft("task.started", {"agentId": "a1"}), tenant_id="t1")
        second = append(
            conn,
            _draft("task.completed", {"agentId": "a1"}, correlation_id="req-9", event_version=1),
            tenant_id="t1",
            seen_slot=0,
            settings=settings,
        )
    assert [e.slot for e in first.events] == [1]
    assert [e.slot for e in second.events] == [2]
    assert [e.event_type for e in second.missed] == ["task.started"]
    assert second.events[0].correlation_id == "req-9"
    with schema.connect() as conn:
        rows = conn.execute("SELECT event_type, slot FROM outbox ORDER BY slot").fetchall()
        state = conn.execute("SELECT state FROM invoices").fetchone()
    assert rows == [("task.started", 1), ("task.completed", 2)]
    assert state == ("paid",)


def test_a_refused_event_takes_the_whole_transaction_with_it(schema: FreshSchema) -> None:
    # The block's error rolls the transaction back, the service's change with it.
    with pytest.raises(EnvelopeError, match=r"payload\.agentId"), schema.connect() as conn:
        conn.execute("UPDATE invoices SET state = 'paid' WHERE id = 42")
        append(conn, _draft("task.started", {"agentId": "a1"}), tenant_id="t1")
        append(conn, _draft("task.completed", {}), tenant_id="t1")
    with schema.connect() as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        assert conn.execute("SELECT state FROM invoices").fetchone() == ("open",)
