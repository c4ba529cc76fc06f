"""Publisher throughput: rows/s of the outbox publisher, under both ordering strategies and with
10, 100 and 500 rows per project per pass, beside the raw confluent-kafka rate for the very same
rows (their envelopes read back from the outbox) in the same run; the same publish from a
PostgreSQL outbox beside them; and writer throughput (events/s committed by 8 concurrent
writers, 5 events a transaction) on both backends.

Setup (untimed) provisions the streams and writes the workload through the outbox with
concurrent writers; the timed part is ``publish --until-empty``: reading rows, sending them in
order, waiting for every acknowledgement and marking the rows published. A writers case times
the writing instead.

PostgreSQL is the server infra/local.sh runs (``make up``; its password in
``.local/postgres/password``), or ``RHUMBATRON_BENCH_POSTGRES_URL``; each case works in a schema
of its own, dropped afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from bench import raw
from bench.harness import BenchEnv, case
from router.wiring.outbox import (
    build_publisher,
    init_postgres_outbox,
    open_outbox,
    publisher_policy,
)
from streams.admin import admin_client, provision
from streams.outbox.states import Ordering
from streams.outbox.store import OutboxStore
from streams.workload import workload, write_workload

PROJECTS = 100  # with the default 50,000 events: 500 rows a project, so 500/pass can show
RAW = "outbox: raw producer, same rows"
WRITERS = 8
SQLITE_WRITERS = f"outbox: {WRITERS} writers commit, SQLite"
PASSWORD_FILE = Path(__file__).resolve().parent.parent / ".local" / "postgres" / "password"


def postgres_url() -> str:
    """The server to measure on: RHUMBATRON_BENCH_POSTGRES_URL, else the local one."""
    url = os.environ.get("RHUMBATRON_BENCH_POSTGRES_URL")
    if url:
        return url
    if not PASSWORD_FILE.exists():
        raise RuntimeError(f"no PostgreSQL to measure: {PASSWORD_FILE} is missing; run `make up`")
    password = quote(PASSWORD_FILE.read_text().strip())
    return f"postgresql://rhumbatron:{password}@127.0.0.1:5432/rhumbatron"


def _postgres_schema(env: BenchEnv) -> str:
    """A fresh schema with the outbox in it; the URL that reaches it."""
    base = postgres_url()
    schema = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    joiner = "&" if "?" in base else "?"
    url = f"{base}{joiner}options={quote(f'-csearch_path={schema}')}"
    init_postgres_outbox(env.settings, url)
    env.scratch["schema"] = (base, schema)
    return url


def _cleanup(env: BenchEnv) -> None:
    if "folder" in env.scratch:
        shutil.rmtree(env.scratch["folder"], ignore_errors=True)
    if "schema" in env.scratch:
        base, schema = env.scratch["schema"]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _open(env: BenchEnv, backend: str) -> OutboxStore:
    s = env.settings
    if backend == "postgres":
        return open_outbox(s, _postgres_schema(env), create=False)
    folder = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    env.scratch["folder"] = folder
    return open_outbox(s, folder / "outbox.db", create=True)


def _outbox(env: BenchEnv, backend: str = "sqlite") -> None:
    s = env.settings
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    store = _open(env, backend)
    write_workload(
        store,
        workload("bench-outbox", PROJECTS, env.size),
        writers=s.produce_writers,
        events_per_write=s.produce_events_per_write,
    )
    env.scratch["store"] = store


def _postgres_outbox(env: BenchEnv) -> None:
    _outbox(env, "postgres")


@case(RAW, setup=_outbox, unit="rows")
def raw_producer(env: BenchEnv) -> int:
    s = env.settings
    store = env.scratch["store"]
    conn = sqlite3.connect(store.path)
    rows = conn.execute("SELECT project_id, envelope FROM outbox ORDER BY seq").fetchall()
    conn.close()
    records = [(s.topology.stream_for(p), p, bytes(v)) for p, v in rows]
    raw.raw_produce(s.kafka_bootstrap, records)
    store.close()
    _cleanup(env)
    return len(records)


def _publish(env: BenchEnv, ordering: Ordering, rows_per_project: int) -> int:
    s = env.settings
    store = env.scratch["store"]
    policy = dataclasses.replace(
        publisher_policy(s), ordering=ordering, rows_per_project=rows_per_project
    )
    with build_publisher(s, store, policy=policy) as publisher:
        totals = publisher.run(until_empty=True)
    store.close()
    _cleanup(env)
    assert totals.published == env.size and totals.order_violations == 0
    return totals.published


def _register(ordering: Ordering, rows_per_project: int, backend: str = "sqlite") -> None:
    name = f"outbox: publish {ordering.value}, {rows_per_project}/pass"
    if backend == "postgres":
        name += ", PostgreSQL"

    def publish(env: BenchEnv) -> int:
        return _publish(env, ordering, rows_per_project)

    setup = _postgres_outbox if backend == "postgres" else _outbox
    case(name, baseline=RAW, setup=setup, unit="rows")(publish)


for _ordering in Ordering:
    for _rows in (10, 100, 500):
        _register(_ordering, _rows)
for _ordering in Ordering:
    _register(_ordering, 100, "postgres")


def _writers(env: BenchEnv) -> int:
    """8 writer threads, each project's events in transactions of produce_events_per_write."""
    s = env.settings
    store = env.scratch["store"]
    try:
        report = write_workload(
            store,
            env.scratch["drafts"],
            writers=WRITERS,
            events_per_write=s.produce_events_per_write,
        )
    finally:
        store.close()
        _cleanup(env)
    env.scratch["note"] = f"{report.writes} transactions; the ratio is to the SQLite writers"
    return report.events


def _writer_setup(backend: str) -> Callable[[BenchEnv], None]:
    def setup(env: BenchEnv) -> None:
        env.scratch["store"] = _open(env, backend)
        env.scratch["drafts"] = workload("bench-writers", PROJECTS, env.size)

    return setup


# Its own baseline (1.00x): the writers' ratio column compares PostgreSQL with SQLite, not with
# a raw client (there is none for a writer's transaction).
@case(SQLITE_WRITERS, baseline=SQLITE_WRITERS, setup=_writer_setup("sqlite"))
def sqlite_writers(env: BenchEnv) -> int:
    return _writers(env)


@case(
    f"outbox: {WRITERS} writers commit, PostgreSQL",
    baseline=SQLITE_WRITERS,
    setup=_writer_setup("postgres"),
)
def postgres_writers(env: BenchEnv) -> int:
    return _writers(env)
