"""``analytics``: the analytics-projector subscription on one process over the run's shared
workload, beside ``raw-consume`` of the same records (bench.runtime_cases): events turned into
metric points, written to the points topic in its transactions."""

from __future__ import annotations

from bench.harness import BenchEnv, cpu_row
from bench.rows import Row, rate
from bench.runtime_cases import consume, subscription_case

SLUG = "analytics-projector"


@subscription_case("analytics", SLUG)
def analytics(env: BenchEnv) -> list[Row]:
    run = consume(env, SLUG)
    return [
        rate(
            "analytics",
            run.stats.records,
            run.seconds,
            "events/s",
            vs="raw-consume",
            note=f"{run.stats.applied} applied",
        ),
        cpu_row("analytics", run.cpu, run.stats.records),
    ]
