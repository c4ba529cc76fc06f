"""``sql-effects``: a subscription whose effects are SQL statements into its own PostgreSQL (one
idempotent upsert an event: the latest state of its task, its change, or its project), on one
process over the run's shared workload, beside ``raw-consume`` of the same records
(bench.runtime_cases). Each batch commits its statements with its claims and cursor in one
PostgreSQL transaction (consumers.runtime.sql_store).

Its database is the local PostgreSQL (bench.outbox_cases.postgres_url), in a schema of the run's
made afresh every round with the store's tables and the processor's, and dropped after it; the
subscription is named as a team names one of its own (``[subscriptions.<slug>]``: its processor
by path, its database), so the round runs what a deployment runs.
"""

from __future__ import annotations

from typing import ClassVar

import psycopg
from psycopg import sql

from bench.harness import BenchEnv, case, cpu_row
from bench.outbox_cases import postgres_url
from bench.rows import Row, rate
from bench.runtime_cases import consume, forget_subscription, published
from consumers.runtime.sql_store import provision_sql_store
from consumers.runtime.types import (
    JSON,
    NO_EFFECTS,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    SqlStatement,
)
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.envelopes import Event

SLUG = "bench-sql-history"
CASE = "sql-effects"
TABLES = """
CREATE TABLE bench_tasks (
    task_id text PRIMARY KEY, project_id text NOT NULL, state text NOT NULL,
    slot bigint NOT NULL, updated_at timestamptz NOT NULL
);
CREATE TABLE bench_changes (
    change_id text PRIMARY KEY, project_id text NOT NULL, state text NOT NULL,
    slot bigint NOT NULL, updated_at timestamptz NOT NULL
);
CREATE TABLE bench_projects (
    project_id text PRIMARY KEY, name text NOT NULL, created_at timestamptz NOT NULL
)
"""
# A later event wins, an earlier one (a re-run, a copy) changes nothing: the upserts are
# idempotent, as a SQL effect under reprocess_from must be (docs/processors.md, "SQL effects").
_LATEST = (
    "INSERT INTO {table} ({key}, project_id, state, slot, updated_at) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT ({key}) DO UPDATE SET state = EXCLUDED.state, slot = EXCLUDED.slot, "
    "updated_at = EXCLUDED.updated_at WHERE {table}.slot < EXCLUDED.slot"
)
TASK = _LATEST.format(table="bench_tasks", key="task_id")
CHANGE = _LATEST.format(table="bench_changes", key="change_id")
PROJECT = (
    "INSERT INTO bench_projects (project_id, name, created_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (project_id) DO NOTHING"
)


class BenchHistory(BaseProcessor):
    """The latest state of every task, change and project, one upsert an event."""

    slug: ClassVar[str] = SLUG
    effect_kind: ClassVar[EffectKind] = EffectKind.SQL

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        at = event.timestamp
        if event.task_id is not None:
            params = (event.task_id, event.project_id, event.event_type, event.slot, at)
            return Effects(sql=[SqlStatement(TASK, params)])
        if event.change_id is not None:
            params = (event.change_id, event.project_id, event.event_type, event.slot, at)
            return Effects(sql=[SqlStatement(CHANGE, params)])
        if event.event_type == "project.created":
            name = str(event.payload.get("name", event.project_id))
            return Effects(sql=[SqlStatement(PROJECT, (event.project_id, name, at))])
        return NO_EFFECTS


def _settings(env: BenchEnv) -> Settings:
    """The run's settings with the subscription's table: its processor and its database."""
    base = postgres_url()
    joiner = "&" if "?" in base else "?"
    url = f"{base}{joiner}options=-csearch_path%3D{_schema(env)}"
    table = {"processor": "bench.sql_cases:BenchHistory", "database": url}
    return Settings(**{**env.settings.model_dump(), "subscriptions": {SLUG: table}})


def _schema(env: BenchEnv) -> str:
    return f"{env.settings.env}_sqlfx"  # the run's name in it: the run's clean-up finds it


def _fresh_database(env: BenchEnv) -> None:
    """The round's schema made anew: the store's tables, the processor's, nothing in them."""
    name = sql.Identifier(_schema(env))
    with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(name))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
    settings = _settings(env)
    url = settings.subscriptions[SLUG]["database"]
    provision_sql_store(url)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(TABLES)


def _setup(env: BenchEnv) -> None:
    published(env)
    settings = _settings(env)
    forget_subscription(settings, SLUG)
    provision_environment(settings)  # its redelivery topic
    _fresh_database(env)


def _teardown(env: BenchEnv) -> None:
    forget_subscription(env.settings, SLUG)
    with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(_schema(env)))
        )


def _rows(url: str) -> tuple[int, int, int]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bench_tasks), (SELECT count(*) FROM bench_changes), "
            "(SELECT count(*) FROM bench_projects)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@case(CASE, setup=_setup, teardown=_teardown)
def sql_effects(env: BenchEnv) -> list[Row]:
    settings = _settings(env)
    run = consume(env, SLUG, settings)
    tasks, changes, projects = _rows(settings.subscriptions[SLUG]["database"])
    note = (
        f"one upsert an event into PostgreSQL, committed with claims and cursor; "
        f"{tasks} tasks, {changes} changes, {projects} projects"
    )
    return [
        rate(CASE, run.stats.records, run.seconds, "events/s", vs="raw-consume", note=note),
        cpu_row(CASE, run.cpu, run.stats.records),
    ]
