"""The Store contract against real PostgreSQL (each test in a schema of its own), plus what only
the SQL store has: its events' statements, run all or nothing with the cursor; an event whose
statements fail named, nothing written; outages (SQLSTATE classes 08 and 40, a lost connection)
raised as ours, nothing written; the tables made idempotently; claims that expire."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from consumers.runtime.sql_store import SqlStore, provision_sql_store
from consumers.runtime.store import Commit, EventStatements, Store
from consumers.runtime.types import TP, Progress, SqlStatement
from streams.clock import ManualClock
from streams.errors import (
    ConfigurationError,
    CursorMoved,
    Fenced,
    ServerRefused,
    StatementsFailed,
    Unreachable,
)
from tests.contracts.store import EVT, EVT2, EVT3, TPX, StoreContract
from tests.support.postgres import FreshSchema

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
EFFECTS = "CREATE TABLE contract_effects (tp text PRIMARY KEY, v text NOT NULL CHECK (v <> 'bad'))"
UPSERT = (
    "INSERT INTO contract_effects (tp, v) VALUES (%s, %s) "
    "ON CONFLICT (tp) DO UPDATE SET v = EXCLUDED.v"
)


class SqlSchema:
    """A schema with the store's tables and the effects table the tests' statements write."""

    def __init__(self) -> None:
        self.schema = FreshSchema(init=False)
        provision_sql_store(self.schema.url)
        with self.schema.connect(autocommit=True) as conn:
            conn.execute(EFFECTS)
        self.stores: list[SqlStore] = []

    def store(self, *, env: str | None = None, clock: ManualClock | None = None) -> SqlStore:
        store = SqlStore(
            self.schema.url,
            env=env or "t" + secrets.token_hex(4),
            slug="contract",
            clock=clock or ManualClock(datetime(2026, 1, 1, tzinfo=UTC)),
            claim_ttl_ms=8 * DAY_MS,
        )
        self.stores.append(store)
        return store

    def value(self, tp: TP) -> object:
        with self.schema.connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT v FROM contract_effects WHERE tp = %s", (str(tp),)
            ).fetchone()
        return row[0] if row else None

    def drop(self) -> None:
        for store in self.stores:
            store.close()
        self.schema.drop()


@pytest.fixture
def db() -> Iterator[SqlSchema]:
    schema = SqlSchema()
    yield schema
    schema.drop()


def _set(tp: TP, value: str, event_id: str = EVT, project: str = "p") -> EventStatements:
    return EventStatements(event_id, project, [SqlStatement(UPSERT, (str(tp), value))])


class TestSqlStore(StoreContract):
    redis_effects = False

    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        self.db = SqlSchema()
        yield
        self.db.drop()

    def make_store(self) -> Store:
        return self.db.store()

    def effect(self, value: str, tp: TP = TPX) -> dict[str, Any]:
        return {"sql": [_set(tp, value)]}

    def effect_of(self, store: Store, tp: TP) -> object:
        return self.db.value(tp)


def test_an_event_whose_statements_fail_is_named_and_nothing_is_written(db: SqlSchema) -> None:
    """alpha's first event violates the CHECK: it is named, and so is gamma's bad one (found in
    the same pass, under savepoints), and so is delta's, whose parameters do not fit its
    statement; alpha's later event is held back behind alpha's first, not run (its statement
    would fail too, and is not named); nothing of the commit is written."""
    store = db.store()
    epoch = store.acquire(TPX)
    other = TP(TPX.topic, 9)
    commit = Commit(
        TPX,
        epoch,
        -1,
        0,
        Progress(acked_through=4),
        claims=[EVT, EVT2, EVT3, "evt-4", "evt-5"],
        states={"alpha": {"n": 2}},
        sql=[
            _set(TPX, "one", "evt-0", "beta"),
            _set(TPX, "bad", EVT, "alpha"),
            _set(other, "ok", EVT2, "beta"),
            _set(TPX, "bad", EVT3, "alpha"),
            _set(TPX, "bad", "evt-4", "gamma"),
            EventStatements("evt-5", "delta", [SqlStatement("SELECT %s, %s", (1,))]),
        ],
    )
    refused = store.commit_many([commit])[0]
    assert isinstance(refused, StatementsFailed) and set(refused.failures) == {
        EVT,
        "evt-4",
        "evt-5",
    }
    assert isinstance(refused.failures[EVT], psycopg.errors.CheckViolation)
    assert isinstance(
        refused.failures["evt-5"], psycopg.ProgrammingError
    )  # 2 placeholders, 1 value
    assert db.value(TPX) is None and db.value(other) is None
    assert store.load(TPX).acked_through == -1 and store.states(TPX, ["alpha"]) == {"alpha": None}
    assert store.decisions(TPX, 0, [EVT2]) == (set(), set(), set())
    # Without the failed events (as the runner commits it next), the rest lands.
    commit.sql = [
        w for w in commit.sql if w.event_id not in refused.failures and w.event_id != EVT3
    ]
    assert store.commit_many([commit]) == [None]
    assert db.value(TPX) == "one" and db.value(other) == "ok"


def test_an_outage_commits_nothing_of_the_call_and_raises_ours(db: SqlSchema) -> None:
    """SQLSTATE 40001 and 40P01 raise ServerRefused, 08006 and a connection the server ended
    raise Unreachable: nothing of any partition of the call is written, and the store goes on
    (on a new connection when the old one was lost)."""
    store = db.store()
    other = TP(TPX.topic, 9)
    ea, eb = store.acquire(TPX), store.acquire(other)

    def raising(code: str) -> SqlStatement:
        return SqlStatement(
            f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END $$"
        )

    outages: list[tuple[SqlStatement, type[Exception]]] = [
        (raising("40001"), ServerRefused),
        (raising("40P01"), ServerRefused),
        (raising("08006"), Unreachable),
        (SqlStatement("SELECT pg_terminate_backend(pg_backend_pid())"), Unreachable),
    ]
    for statement, error in outages:
        with pytest.raises(error):
            store.commit_many(
                [
                    Commit(other, eb, -1, 0, Progress(acked_through=0), sql=[_set(other, "b")]),
                    Commit(
                        TPX,
                        ea,
                        -1,
                        0,
                        Progress(acked_through=0),
                        claims=[EVT],
                        sql=[_set(TPX, "a"), EventStatements(EVT2, "q", [statement])],
                    ),
                ]
            )
        assert db.value(TPX) is None and db.value(other) is None
        assert store.load(other).acked_through == -1 and store.claimed(TPX, 0, [EVT]) == set()
    assert store.commit_many([Commit(TPX, ea, -1, 0, Progress(acked_through=0))]) == [None]


def test_a_zombie_commit_changes_nothing(db: SqlSchema) -> None:
    """Two processes, two stores: the one whose epoch is stale has its whole commit, statements
    included, refused by the cursor UPDATE's ``WHERE epoch = <mine>``."""
    env = "t" + secrets.token_hex(4)
    old, new = db.store(env=env), db.store(env=env)
    stale = old.acquire(TPX)
    current = new.acquire(TPX)
    refused = old.commit_many(
        [Commit(TPX, stale, -1, 0, Progress(acked_through=3), claims=[EVT], sql=[_set(TPX, "z")])]
    )
    assert isinstance(refused[0], Fenced)
    assert db.value(TPX) is None and new.load(TPX).acked_through == -1
    new.commit(Commit(TPX, current, -1, 0, Progress(acked_through=3), sql=[_set(TPX, "n")]))
    assert db.value(TPX) == "n"
    with pytest.raises(CursorMoved):  # the cursor moved since the zombie read it, too
        old.commit(Commit(TPX, current, -1, 0, Progress(acked_through=5), sql=[_set(TPX, "z")]))
    assert db.value(TPX) == "n"


def test_environments_and_subscriptions_share_one_database_apart(db: SqlSchema) -> None:
    one, two = db.store(env="one"), db.store(env="two")
    e1 = one.acquire(TPX)
    assert two.acquire(TPX) == 1 == e1
    one.commit(Commit(TPX, e1, -1, 0, Progress(acked_through=7), claims=[EVT], states={"p": {}}))
    assert two.load(TPX).acked_through == -1 and two.claimed(TPX, 0, [EVT]) == set()
    assert two.all_states(TPX) == {}


def test_claims_expire_after_the_claim_ttl(db: SqlSchema) -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = db.store(clock=clock)
    epoch = store.acquire(TPX)
    store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
    clock.advance(7 * 86_400)  # a copy as late as the stream keeps it is still a duplicate
    assert store.claimed(TPX, 0, [EVT]) == {EVT}
    clock.advance(2 * 86_400)
    assert store.claimed(TPX, 0, [EVT]) == set()
    store.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT2]))
    with db.schema.connect(autocommit=True) as conn:  # the expired one was swept away
        rows = conn.execute("SELECT event_id FROM rhumbatron_claims").fetchall()
    assert rows == [(EVT2,)]


def test_provision_is_idempotent_and_a_database_without_it_is_refused(db: SqlSchema) -> None:
    provision_sql_store(db.schema.url)  # again: nothing to do
    db.store().check()
    bare = FreshSchema(init=False)
    try:
        store = SqlStore(bare.url, env="t", slug="mine", clock=ManualClock(), claim_ttl_ms=DAY_MS)
        with pytest.raises(ConfigurationError, match="rhumbatron provision"):
            store.check()
        with pytest.raises(ConfigurationError, match=r"\[subscriptions.mine\] database"):
            store.acquire(TPX)
        store.close()
    finally:
        bare.drop()


def test_effects_are_not_keys(db: SqlSchema) -> None:
    with pytest.raises(NotImplementedError, match="read them with SQL"):
        db.store().read(TPX, "k")
