"""The benchmark harness: registry, subprocess runner, table."""

from __future__ import annotations

import json
import resource
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.settings import Settings


@dataclass
class BenchEnv:
    """What a case gets: settings for a private environment shared by the cases of one run, and
    a scratch dict cases of the same run use to hand data to each other (via setup)."""

    settings: Settings
    size: int
    scratch: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[BenchEnv], int]
    baseline: str | None
    setup: Callable[[BenchEnv], None] | None
    unit: str


CASES: dict[str, Case] = {}

# Modules whose import registers cases, in table order.
CASE_MODULES = (
    "bench.cases",
    "bench.runtime_cases",
    "bench.projector_cases",
    "bench.tracing_cases",
    "bench.archive_cases",
    "bench.router_cases",
    "bench.worker_cases",
    "bench.analytics_cases",
)


def load_cases() -> None:
    import importlib

    for name in CASE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


def case(
    name: str,
    *,
    baseline: str | None = None,
    setup: Callable[[BenchEnv], None] | None = None,
    unit: str = "events",
) -> Callable[[Callable[[BenchEnv], int]], Callable[[BenchEnv], int]]:
    def register(fn: Callable[[BenchEnv], int]) -> Callable[[BenchEnv], int]:
        CASES[name] = Case(name, fn, baseline, setup, unit)
        return fn

    return register


def run_one(name: str, env_name: str, size: int) -> dict[str, Any]:
    """Run one case in this process (the child side) and return its measurements."""
    load_cases()

    settings = Settings(env=env_name, partitions=4)
    env = BenchEnv(settings=settings, size=size)
    spec = CASES[name]
    if spec.setup is not None:
        spec.setup(env)
    started = time.perf_counter()
    items = spec.fn(env)
    seconds = time.perf_counter() - started
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "name": name,
        "items": items,
        "seconds": seconds,
        "rss_mb": rss_kb / 1024,
        "note": str(env.scratch.get("note", "")),
    }


def run_all(names: list[str], size: int) -> list[dict[str, Any]]:
    env_name = "bench" + secrets.token_hex(4)
    results = []
    for name in names:
        print(f"  running {name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench",
                "--child",
                name,
                "--env",
                env_name,
                "--size",
                str(size),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            results.append(
                {"name": name, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
            )
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    remove_run(env_name)
    return results


def median_rounds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case from several interleaved rounds: its median round by rate (the lower
    middle one of an even count), the note naming every round's rate. A shared machine's load
    moves from minute to minute; interleaving spreads it over the cases alike."""
    rounds: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        rounds.setdefault(r["name"], []).append(r)
    merged = []
    for runs in rounds.values():
        failed = [r for r in runs if "error" in r]
        if failed or len(runs) == 1:
            merged.append(failed[0] if failed else runs[0])
            continue
        by_rate = sorted(runs, key=lambda r: r["items"] / r["seconds"])
        median = dict(by_rate[(len(by_rate) - 1) // 2])
        rates = "/".join(f"{r['items'] / r['seconds']:.0f}" for r in runs)
        median["note"] = f"{median.get('note', '')}; median of {len(runs)} rounds ({rates}/s)"
        merged.append(median)
    return merged


def remove_run(env_name: str) -> None:
    """Delete the run's topics and Redis keys (every case environment's name starts with the
    run's), so repeated runs do not fill the local broker."""
    from consumers.redis_conn import connect
    from streams.admin import admin_client, delete_topics

    s = Settings(env=env_name)
    base = s.kafka_config()
    admin = admin_client(base)
    topics = [t for t in admin.list_topics(timeout=10).topics if env_name in t]
    delete_topics(admin, base, topics, timeout=60)
    client = connect(s.redis_url, timeout=5)
    keys = list(client.scan_iter(match=f"*{env_name}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    print(f"  removed the run's {len(topics)} topics and {len(keys)} Redis keys", file=sys.stderr)


def table(results: list[dict[str, Any]]) -> str:
    by_name = {r["name"]: r for r in results}
    lines = [
        f"{'case':<56}{'items':>9}{'seconds':>9}{'items/s':>11}{'vs raw':>9}{'peak RSS MB':>13}  note"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['name']:<56}  FAILED: {r['error']}")
            continue
        rate = r["items"] / r["seconds"] if r["seconds"] else 0.0
        spec = CASES.get(r["name"])
        ratio = ""
        if (
            spec
            and spec.baseline
            and spec.baseline in by_name
            and "error" not in by_name[spec.baseline]
        ):
            base = by_name[spec.baseline]
            base_rate = base["items"] / base["seconds"]
            ratio = f"{rate / base_rate:.2f}x"
        elif spec and spec.baseline is None:
            ratio = "raw"
        lines.append(
            f"{r['name']:<56}{r['items']:>9}{r['seconds']:>9.2f}{rate:>11.0f}{ratio:>9}{r['rss_mb']:>13.1f}"
            f"  {r.get('note', '')}"
        )
    return "\n".join(lines)
