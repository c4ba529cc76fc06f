"""Publisher throughput: rows/s of the outbox publisher, under both ordering strategies and with
10, 100 and 500 rows per project per pass, beside the raw confluent-kafka rate for the very same
rows (their envelopes read back from the outbox) in the same run.

Setup (untimed) provisions the streams and writes the workload through the outbox with
concurrent writers; the timed part is ``publish --until-empty``: reading rows, sending them in
order, waiting for every acknowledgement and marking the rows published.
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
import tempfile
from pathlib import Path

from bench import raw
from bench.harness import BenchEnv, case
from router.wiring.outbox import build_publisher, open_outbox, publisher_policy
from streams.admin import admin_client, provision
from streams.outbox.states import Ordering
from streams.workload import workload, write_workload

PROJECTS = 100  # with the default 50,000 events: 500 rows a project, so 500/pass can show
RAW = "outbox: raw producer, same rows"


def _outbox(env: BenchEnv) -> None:
    s = env.settings
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    folder = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    store = open_outbox(s, folder / "outbox.db", create=True)
    write_workload(
        store,
        workload("bench-outbox", PROJECTS, env.size),
        writers=s.produce_writers,
        events_per_write=s.produce_events_per_write,
    )
    env.scratch["store"] = store
    env.scratch["folder"] = folder


@case(RAW, setup=_outbox, unit="rows")
def raw_producer(env: BenchEnv) -> int:
    s = env.settings
    store = env.scratch["store"]
    conn = sqlite3.connect(store.path)
    rows = conn.execute("SELECT project_id, envelope FROM outbox ORDER BY seq").fetchall()
    conn.close()
    records = [(s.topology.stream_for(p), p, bytes(v)) for p, v in rows]
    raw.raw_produce(s.kafka_bootstrap, records)
    shutil.rmtree(env.scratch["folder"], ignore_errors=True)
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
    shutil.rmtree(env.scratch["folder"], ignore_errors=True)
    assert totals.published == env.size and totals.order_violations == 0
    return totals.published


def _register(ordering: Ordering, rows_per_project: int) -> None:
    name = f"outbox: publish {ordering.value}, {rows_per_project}/pass"

    def publish(env: BenchEnv) -> int:
        return _publish(env, ordering, rows_per_project)

    case(name, baseline=RAW, setup=_outbox, unit="rows")(publish)


for _ordering in Ordering:
    for _rows in (10, 100, 500):
        _register(_ordering, _rows)
