"""``archiver``: the audit-archiver subscription on one process over the run's shared workload,
beside ``raw-consume`` of the same records (bench.runtime_cases): events archived per second into
gzip NDJSON parts in a folder of its own; closing the open parts is part of the time."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.harness import BenchEnv, cpu_row
from bench.rows import Row, rate
from bench.runtime_cases import consume, subscription_case
from router.settings import Settings
from router.wiring.archive import count_parts

SLUG = "audit-archiver"


@subscription_case("archiver", SLUG)
def archiver(env: BenchEnv) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="rh-bench-archive-") as tmp:
        s = Settings(**{**env.settings.model_dump(), "archive_dir": tmp})
        run = consume(env, SLUG, s)
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*.ndjson.gz"))
        note = f"{count_parts(s)} parts, {size / 1e6:.1f} MB gz"
    return [
        rate("archiver", run.stats.records, run.seconds, "events/s", vs="raw-consume", note=note),
        cpu_row("archiver", run.cpu, run.stats.records),
    ]
