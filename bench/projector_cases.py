"""project-view-projector on one process against a raw confluent-kafka consume of the same topics
in the same run (the baseline case lives in bench.runtime_cases)."""

from __future__ import annotations

from bench.harness import BenchEnv, case
from bench.runtime_cases import _published
from consumers.redis_conn import connect
from consumers.subscriptions.projector.view import count_views
from router.wiring.subscription import open_subscription


@case(
    "subscription: project-view-projector",
    baseline="runtime: raw confluent-kafka consume",
    setup=_published,
)
def project_view_projector(env: BenchEnv) -> int:
    subscription = open_subscription(env.settings, "project-view-projector")
    runner = subscription.runner
    try:
        runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
    finally:
        subscription.close()
    views = count_views(connect(env.settings.redis_url, timeout=5), env.settings.env)
    env.scratch["note"] = f"{views} views"
    return runner.stats.records
