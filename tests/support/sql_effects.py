"""SQL-effect processors for the runtime's tests, the tables their statements write, and the SQL
path of the adversarial suite (tests/support/adversarial.py).

``TaskHistory`` upserts one ``task_history`` row a task event (``INSERT … ON CONFLICT DO
UPDATE``: idempotent, so a ``reprocess_from`` that runs the statements again converges) and
appends one ``task_log`` row (not idempotent on purpose: a reader of it sees every run). Both
tables refuse ``status = 'bad'`` (a CHECK constraint): an event carrying the ``fail`` drill
writes it, and fails on the constraint, in the database. Every row carries the store's
environment, so the examples of a property share one schema.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, ClassVar

from consumers.runtime.sql_store import SqlStore, provision_sql_store
from consumers.runtime.types import (
    JSON,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    Processor,
    SqlStatement,
)
from streams.clock import ManualClock
from streams.envelopes import Event
from tests.support.adversarial import Fleet
from tests.support.postgres import FreshSchema
from tests.support.runtime_harness import World

DAY_MS = 86_400_000
TABLES = """
CREATE TABLE task_history (
    env text NOT NULL,
    project text NOT NULL,
    n integer NOT NULL,
    count integer NOT NULL,
    status text NOT NULL CHECK (status <> 'bad'),
    key text NOT NULL,
    PRIMARY KEY (env, project, n)
);
CREATE TABLE task_log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    env text NOT NULL,
    project text NOT NULL,
    n integer NOT NULL,
    status text NOT NULL CHECK (status <> 'bad'),
    key text NOT NULL
)
"""
UPSERT = (
    "INSERT INTO task_history (env, project, n, count, status, key) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (env, project, n) "
    "DO UPDATE SET count = EXCLUDED.count, status = EXCLUDED.status, key = EXCLUDED.key"
)
APPEND = "INSERT INTO task_log (env, project, n, status, key) VALUES (%s, %s, %s, %s, %s)"
# What a statement meets in an outage: the server's SQLSTATE (40001 a serialization failure,
# 40P01 a deadlock, 08006 a connection failure), or the connection lost (its server ended it).
OUTAGES: dict[str, str] = {
    code: f"DO $$ BEGIN RAISE EXCEPTION 'injected outage' USING ERRCODE = '{code}'; END $$"
    for code in ("40001", "40P01", "08006")
} | {"lost": "SELECT pg_terminate_backend(pg_backend_pid())"}


def outage(kind: str) -> SqlStatement:
    return SqlStatement(OUTAGES[kind])


class TaskHistory(BaseProcessor):
    """A fold (events per project, the ns seen) whose effects are rows of ``task_history`` and
    ``task_log``. ``outages``: statements of the database's trouble, one put before the next
    events' own (class-wide, like FlakyEffects' budget)."""

    slug: ClassVar[str] = "task-history"
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.SQL
    consumes: ClassVar[frozenset[str] | None] = frozenset({"task.completed", "task.failed"})
    outages: ClassVar[list[str]] = []

    def __init__(self, env: str) -> None:
        self.env = env

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        s = dict(state or {"count": 0, "seen": []})
        s["count"] += 1
        s["seen"] = [*s["seen"], event.payload["n"]]
        return s

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        assert state is not None
        return Effects(sql=self.statements(event, state, delivery, failing=self.failing(event)))

    def failing(self, event: Event) -> bool:
        return event.payload.get("drill") == "fail"

    def statements(
        self, event: Event, state: JSON, delivery: Delivery, *, failing: bool
    ) -> list[SqlStatement]:
        project, n = event.project_id, int(event.payload["n"])
        status = "bad" if failing else "ok"
        key = delivery.idempotency_key(event.event_id)
        out = [
            SqlStatement(UPSERT, (self.env, project, n, state["count"], status, key)),
            SqlStatement(APPEND, (self.env, project, n, status, key)),
        ]
        if self.outages:
            out.insert(0, outage(self.outages.pop(0)))
        return out


class FlakySql(TaskHistory):
    """The adversarial suite's SQL processor: an event's effect fails as often as the test's
    budget says, an odd n by raising in ``process``, an even one on the table's constraint in
    the database; ``outage_at``: the n-th ``process`` call from now puts the database's outage
    (of ``outage_kind``) before its statements."""

    slug: ClassVar[str] = "flaky-sql"
    budget: ClassVar[dict[str, int]] = {}
    outage_at: ClassVar[dict[str, Any]] = {}

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        assert state is not None
        left = self.budget.get(event.event_id, 0)
        failing = left > 0
        if failing:
            self.budget[event.event_id] = left - 1
            if int(event.payload["n"]) % 2:
                raise ValueError(f"effect of {event.event_id} fails ({left} left)")
        statements = self.statements(event, state, delivery, failing=failing)
        armed = self.outage_at
        if armed:
            armed["n"] -= 1
            if armed["n"] == 0:
                statements.insert(0, outage(armed.pop("kind")))
                armed.clear()
        return Effects(sql=statements)


class SqlDatabase:
    """A schema of its own on the test server with the store's tables and the processors'."""

    def __init__(self) -> None:
        self.schema = FreshSchema(init=False)
        provision_sql_store(self.schema.url)
        with self.schema.connect(autocommit=True) as conn:
            conn.execute(TABLES)
        self.stores: list[SqlStore] = []

    @property
    def url(self) -> str:
        return self.schema.url

    def store(self, env: str, slug: str, clock: ManualClock) -> SqlStore:
        store = SqlStore(self.url, env=env, slug=slug, clock=clock, claim_ttl_ms=8 * DAY_MS)
        self.stores.append(store)
        return store

    def world(self, processor: Callable[[str], Processor]) -> tuple[World, Processor]:
        """A world whose store is a SqlStore of a fresh environment, and its processor."""
        env = "t" + secrets.token_hex(4)
        proc = processor(env)
        clock = ManualClock()
        store = self.store(env, proc.slug, clock)
        # The world types its store as the memory twin; any Store runs it.
        return World(clock=clock, store=store), proc  # type: ignore[arg-type]

    def rows(self, query: str, *params: object) -> list[tuple[Any, ...]]:
        with self.schema.connect(autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def history(self, env: str) -> dict[tuple[str, int], tuple[int, str]]:
        """(project, n) -> (count, key) of every task_history row of ``env``."""
        rows = self.rows("SELECT project, n, count, key FROM task_history WHERE env = %s", env)
        return {(p, n): (count, key) for p, n, count, key in rows}

    def log(self, env: str) -> list[dict[str, Any]]:
        """``env``'s task_log rows as a reader sees them, in the order they were written."""
        rows = self.rows("SELECT project, n, key FROM task_log WHERE env = %s ORDER BY seq", env)
        return [{"project": p, "n": n, "_id": key} for p, n, key in rows]

    def close_stores(self) -> None:
        for store in self.stores:
            store.close()
        self.stores.clear()

    def drop(self) -> None:
        self.close_stores()
        self.schema.drop()


class SqlPath:
    """The adversarial suite over SQL effects against the real PostgreSQL: every example a fresh
    environment in one schema. A crash is tried at the fail-points of a SQL-effect batch, the
    one inside the database's transaction (``sql.before_commit``: its statements ran, COMMIT not
    sent) among them; an abort is the database's outage at a commit."""

    boundaries = (
        "runtime.before_store_commit",
        "sql.before_commit",
        "runtime.after_store_commit",
        "runtime.after_offsets_commit",
    )
    kinds = ("40001", "40P01", "08006", "lost")

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self.env = ""

    def world(self) -> World:
        self.db.close_stores()  # the last example's: one connection at a time
        world, processor = self.db.world(FlakySql)
        self.env = processor.env  # type: ignore[attr-defined]
        return world

    def store(self) -> SqlStore:
        return self.db.stores[-1]  # the world's (one store, one connection: members take turns)

    def processor(self) -> Processor:
        return FlakySql(self.env)

    def arm_failures(self, budget: dict[str, int]) -> None:
        FlakySql.budget = budget

    def arm_crash(self, fleet: Fleet, who: int, hook: Callable[[str], None]) -> None:
        fleet.members[who].failpoint = hook
        self.store().failpoint = hook

    def abort(self, fleet: Fleet, who: int, nth: int) -> None:
        FlakySql.outage_at = {"n": nth, "kind": self.kinds[nth % len(self.kinds)]}

    def disarm(self, fleet: Fleet) -> None:
        for member in fleet.members:
            member.failpoint = lambda name: None
        self.arm_crash(fleet, 0, lambda name: None)
        FlakySql.outage_at = {}

    def effects(self, world: World) -> list[dict[str, Any]]:
        return self.db.log(self.env)


def reset() -> None:
    """The class-wide knobs of the SQL test processors back at rest."""
    TaskHistory.outages = []
    FlakySql.budget = {}
    FlakySql.outage_at = {}
