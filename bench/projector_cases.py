"""``projector``: the project-view-projector subscription on one process over the run's shared
workload, beside ``raw-consume`` of the same records (bench.runtime_cases)."""

from __future__ import annotations

from bench.harness import BenchEnv, cpu_row
from bench.rows import Row, rate
from bench.runtime_cases import consume, subscription_case
from consumers.redis_conn import connect
from consumers.subscriptions.projector.view import count_views

SLUG = "project-view-projector"


@subscription_case("projector", SLUG)
def projector(env: BenchEnv) -> list[Row]:
    run = consume(env, SLUG)
    views = count_views(connect(env.settings.redis_url, timeout=5), env.settings.env)
    return [
        rate(
            "projector",
            run.stats.records,
            run.seconds,
            "events/s",
            vs="raw-consume",
            note=f"{views} views",
        ),
        cpu_row("projector", run.cpu, run.stats.records),
    ]
