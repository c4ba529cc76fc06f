"""``causal-router``: the causal-router subscription on one process over the run's shared workload,
beside ``raw-consume`` of the same records (bench.runtime_cases)."""

from __future__ import annotations

from bench.harness import BenchEnv, cpu_row
from bench.rows import Row, rate
from bench.runtime_cases import consume, subscription_case
from consumers.redis_conn import connect
from consumers.subscriptions.causal_router.processor import read_router_metrics

SLUG = "causal-router"


@subscription_case("causal-router", SLUG)
def causal_router(env: BenchEnv) -> list[Row]:
    run = consume(env, SLUG)
    metrics = read_router_metrics(connect(env.settings.redis_url, timeout=5), env.settings.env)
    sent = {k.split(":", 1)[1]: v for k, v in metrics.items() if k.startswith("commands_sent:")}
    note = "commands sent " + " ".join(f"{k}={v}" for k, v in sorted(sent.items()))
    return [
        rate(
            "causal-router", run.stats.records, run.seconds, "events/s", vs="raw-consume", note=note
        ),
        cpu_row("causal-router", run.cpu, run.stats.records),
    ]
