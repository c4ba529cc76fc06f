"""causal-router on one process against a raw confluent-kafka consume of the same topics in the
same run (the baseline case lives in bench.runtime_cases)."""

from __future__ import annotations

from bench.harness import BenchEnv, case
from bench.runtime_cases import _published
from consumers.redis_conn import connect
from consumers.subscriptions.causal_router.processor import read_router_metrics
from router.wiring.subscription import open_subscription


@case(
    "subscription: causal-router",
    baseline="runtime: raw confluent-kafka consume",
    setup=_published,
)
def causal_router(env: BenchEnv) -> int:
    subscription = open_subscription(env.settings, "causal-router")
    runner = subscription.runner
    try:
        runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
    finally:
        subscription.close()
    metrics = read_router_metrics(connect(env.settings.redis_url, timeout=5), env.settings.env)
    sent = {k.split(":", 1)[1]: v for k, v in metrics.items() if k.startswith("commands_sent:")}
    env.scratch["note"] = " ".join(f"{k}={v}" for k, v in sorted(sent.items()))
    return runner.stats.records
