"""The audit-archiver on one process, beside the runtime's raw confluent-kafka consume of the same
kind of workload in the same run: events archived per second, parts written, bytes on disk."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.harness import BenchEnv, case
from bench.runtime_cases import _published
from router.settings import Settings
from router.wiring.archive import count_parts
from router.wiring.subscription import open_subscription


@case(
    "archive: audit-archiver subscription (gzip NDJSON parts)",
    baseline="runtime: raw confluent-kafka consume",
    setup=_published,
)
def audit_archiver(env: BenchEnv) -> int:
    with tempfile.TemporaryDirectory(prefix="rh-bench-archive-") as tmp:
        s = Settings(**{**env.settings.model_dump(), "archive_dir": tmp})
        subscription = open_subscription(s, "audit-archiver")
        runner = subscription.runner
        try:
            runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
        finally:
            subscription.close()  # closes the open parts: their writing is part of the time
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*.ndjson.gz"))
        env.scratch["note"] = (
            f"{count_parts(s)} parts, {size / 1e6:.1f} MB gz, "
            f"{runner.stats.applied} archived, {runner.stats.duplicates} duplicates"
        )
    return runner.stats.records
