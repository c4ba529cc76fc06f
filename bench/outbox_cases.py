"""``publisher``: rows/s of the outbox publisher from a filled SQLite outbox to Kafka, beside
``raw-produce`` (bench.cases); ``publisher-postgres`` the same from a PostgreSQL outbox.

The first round fills one outbox of each backend for the run (untimed, in a forked process so
the workload does not count in the case's peak RSS), writing the workload through the outbox with
the settings' concurrent writers, 100 events a transaction; every round publishes a copy of it.
The timed part is ``publish --until-empty``: reading the rows, sending them in order, waiting
for every acknowledgement and marking the rows published. The rows go to an environment of the
run's own (so the shared streams hold the workload once).

PostgreSQL is the server infra/local.sh runs (its password in ``.local/postgres/password``), or
``RHUMBATRON_BENCH_POSTGRES_URL``; each round works in a schema of its own, dropped afterwards
(the run's schemas carry its name; the harness drops any left at the end of the run).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from bench.harness import BenchEnv, CpuMeter, case, cpu_row, own_streams
from bench.rows import Row, rate
from bench.runtime_cases import PROJECTS, isolated
from router.settings import Settings
from router.wiring.outbox import build_publisher, init_postgres_outbox, open_outbox
from streams.workload import workload, write_workload

# Events a writer transaction appends while the bench fills an outbox (untimed setup): the
# product's 5 (produce_events_per_write) made filling 500,000 rows take minutes a backend.
FILL_EVENTS_PER_WRITE = 100
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


def _fill(settings: Settings, address: str, size: int) -> None:
    store = open_outbox(settings, address, create=True)
    try:
        write_workload(
            store,
            workload(settings.env, PROJECTS, size),
            writers=settings.produce_writers,
            events_per_write=FILL_EVENTS_PER_WRITE,
        )
    finally:
        store.close()


def _sqlite(env: BenchEnv) -> None:
    """A copy of the run's filled SQLite outbox (filled once per run, by the first round)."""
    s = own_streams(env, "o")
    template = env.run_dir / "outbox-template.db"
    if not template.exists():
        filling = env.run_dir / "outbox-filling.db"
        isolated(_fill, s, str(filling), env.size)
        filling.rename(template)
    folder = Path(tempfile.mkdtemp(prefix="rh-bench-outbox-", dir=env.run_dir))
    env.scratch["cleanup"] = lambda: shutil.rmtree(folder, ignore_errors=True)
    env.scratch["address"] = str(folder / "outbox.db")
    with sqlite3.connect(template) as source, sqlite3.connect(env.scratch["address"]) as copy:
        source.backup(copy)


def _schema_url(base: str, schema: str) -> str:
    joiner = "&" if "?" in base else "?"
    return f"{base}{joiner}options={quote(f'-csearch_path={schema}')}"


def _create_schema(settings: Settings, base: str, schema: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    url = _schema_url(base, schema)
    init_postgres_outbox(settings, url)
    return url


def drop_run_schemas(env_name: str) -> int:
    """Drop every PostgreSQL schema of the run (their names carry the run's); how many."""
    with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as conn:
        schemas = [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"%{env_name}%",)
            )
        ]
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return len(schemas)


def _copy_schema(base: str, template: str, schema: str) -> None:
    """The rows of every table of ``template`` into the same, freshly made tables of ``schema``
    (their triggers off while copying: the rows already have their slots), the identity
    sequences moved past the copied rows. A table the schema's own setup filled is left; one it
    does not make (the workload writers' table) is made like the template's."""
    ident = sql.Identifier
    with psycopg.connect(base) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (template,),
            )
        ]
        for table in tables:
            target = sql.SQL("{}.{}").format(ident(schema), ident(table))
            exists = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}"',)).fetchone()
            if not exists or exists[0] is None:  # a writer's own table, made by the workload
                conn.execute(
                    sql.SQL("CREATE TABLE {} (LIKE {}.{} INCLUDING ALL)").format(
                        target, ident(template), ident(table)
                    )
                )
            if conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(target)).fetchone():
                continue
            conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(target))
            conn.execute(
                sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM {}.{}").format(
                    target, ident(template), ident(table)
                )
            )
            conn.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER USER").format(target))
        identities = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND is_identity = 'YES'",
            (schema,),
        ).fetchall()
        for table, column in identities:
            conn.execute(
                sql.SQL(
                    "SELECT setval(pg_get_serial_sequence(%s, %s), "
                    "COALESCE((SELECT MAX({}) FROM {}.{}), 0) + 1, false)"
                ).format(ident(column), ident(schema), ident(table)),
                (f"{schema}.{table}", column),
            )


def _postgres(env: BenchEnv) -> None:
    """A copy of the run's filled PostgreSQL outbox (filled once per run, by the first round),
    in a schema of its own."""
    s = own_streams(env, "o")
    base = postgres_url()
    template = f"bench_{env.settings.env}_template"
    marker = env.run_dir / "outbox-template-postgres"
    if not marker.exists():
        url = _create_schema(s, base, template)
        isolated(_fill, s, url, env.size)
        marker.write_text(template)
    schema = f"bench_{env.settings.env}_{secrets.token_hex(4)}"

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    env.scratch["cleanup"] = drop
    try:
        url = _create_schema(s, base, schema)
        _copy_schema(base, template, schema)
    except BaseException:
        drop()
        raise
    env.scratch["address"] = url


def _publish(env: BenchEnv, name: str, backend: str) -> list[Row]:
    s = env.settings
    try:
        store = open_outbox(s, env.scratch["address"], create=False)
        started = time.perf_counter()
        with CpuMeter() as meter, build_publisher(s, store) as publisher:
            totals = publisher.run(until_empty=True)
        seconds = time.perf_counter() - started
        store.close()
    finally:
        env.scratch["cleanup"]()
    if totals.published != env.size or totals.order_violations:
        raise RuntimeError(
            f"{name}: published {totals.published} of {env.size} rows, "
            f"{totals.order_violations} order violations"
        )
    return [
        rate(
            name,
            totals.published,
            seconds,
            "rows/s",
            vs="raw-produce",
            note=f"{backend} outbox, {s.outbox_ordering} ordering, "
            f"{s.outbox_rows_per_project_per_pass}/project/pass",
        ),
        cpu_row(name, meter.use, totals.published, "rows"),
    ]


@case("publisher", setup=_sqlite)
def publisher(env: BenchEnv) -> list[Row]:
    return _publish(env, "publisher", "SQLite")


@case("publisher-postgres", setup=_postgres)
def publisher_postgres(env: BenchEnv) -> list[Row]:
    return _publish(env, "publisher-postgres", "PostgreSQL")
