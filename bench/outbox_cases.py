"""``publisher``: rows/s of the outbox publisher from a filled SQLite outbox to Kafka, beside
``raw-produce`` (bench.cases); ``publisher-postgres`` the same from a PostgreSQL outbox.

The setup (untimed, in a forked process so the workload does not count in the case's peak RSS)
writes the workload through the outbox with the settings' concurrent writers; the timed part is
``publish --until-empty``: reading the rows, sending them in order, waiting for every
acknowledgement and marking the rows published. The rows go to an environment of the run's own
(so the shared streams hold the workload once).

PostgreSQL is the server infra/local.sh runs (its password in ``.local/postgres/password``), or
``RHUMBATRON_BENCH_POSTGRES_URL``; each round works in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from bench.harness import BenchEnv, case
from bench.rows import Row, rate
from bench.runtime_cases import PROJECTS, isolated
from router.settings import Settings
from router.wiring.outbox import build_publisher, init_postgres_outbox, open_outbox
from streams.admin import admin_client, provision
from streams.workload import workload, write_workload

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
            events_per_write=settings.produce_events_per_write,
        )
    finally:
        store.close()


def _streams(env: BenchEnv) -> Settings:
    s = env.settings = Settings(**{**env.settings.model_dump(), "env": f"{env.settings.env}_o"})
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    return s


def _sqlite(env: BenchEnv) -> None:
    s = _streams(env)
    folder = Path(tempfile.mkdtemp(prefix="rh-bench-outbox-", dir=env.run_dir))
    env.scratch["cleanup"] = lambda: shutil.rmtree(folder, ignore_errors=True)
    env.scratch["address"] = str(folder / "outbox.db")
    isolated(_fill, s, env.scratch["address"], env.size)


def _postgres(env: BenchEnv) -> None:
    s = _streams(env)
    base = postgres_url()
    schema = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

    env.scratch["cleanup"] = drop
    joiner = "&" if "?" in base else "?"
    url = f"{base}{joiner}options={quote(f'-csearch_path={schema}')}"
    try:
        init_postgres_outbox(s, url)
        isolated(_fill, s, url, env.size)
    except BaseException:
        drop()
        raise
    env.scratch["address"] = url


def _publish(env: BenchEnv, name: str, backend: str) -> list[Row]:
    s = env.settings
    try:
        store = open_outbox(s, env.scratch["address"], create=False)
        started = time.perf_counter()
        with build_publisher(s, store) as publisher:
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
        )
    ]


@case("publisher", setup=_sqlite)
def publisher(env: BenchEnv) -> list[Row]:
    return _publish(env, "publisher", "SQLite")


@case("publisher-postgres", setup=_postgres)
def publisher_postgres(env: BenchEnv) -> list[Row]:
    return _publish(env, "publisher-postgres", "PostgreSQL")
