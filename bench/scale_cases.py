"""Scale: the project-view-projector's rate with 100,000 projects (a view per project: more keys,
fewer events per key) beside its rate with 500 (the ``projector`` row, the same number of events),
and its resident memory after 50,000 and after 1,000,000 events, which must stay flat (nothing kept
per event or per project grows without bound in the process; measured once a run, in round 1).

The events are produced in setup, untimed, with the bench's raw producer path
(``send_to_streams``), each set into an environment of its own. A rate is timed like the
``projector`` row: from the subscription's start (its group join included) to its last event.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.harness import BenchEnv, case
from bench.latency_cases import fresh_settings, remove_environment, settings_environ
from bench.rows import Row, rate
from bench.runtime_cases import forget_subscription
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from streams.producer import Producer, send_to_streams
from streams.workload import workload

ROOT = Path(__file__).resolve().parents[1]
SLUG = "project-view-projector"
TENANT = "tenant-bench"
FEW_PROJECTS = 500
MANY_PROJECTS = 100_000
RSS_EARLY = 50_000  # events after which the first RSS sample is taken
RSS_EVENTS = 1_000_000
RSS_EVENTS_QUICK = 200_000
PUBLISHED = "scale-published"  # the marker file in the run's folder
PUBLISH_CHUNK = 100_000  # events built and sent at a time, so setup's own memory stays bounded


def publish(s: Settings, projects: int, count: int) -> None:
    """``count`` events over ``projects`` projects into the environment's streams, built and sent
    ``PUBLISH_CHUNK`` at a time (a million built events at once would be gigabytes), each
    project's slots running on from one chunk to the next."""
    provision_environment(s, subscriptions=[SLUG])
    producer = Producer(s.kafka_config())
    drafts = workload(uuid.uuid4().hex[:6], projects, count)
    start_at = datetime.now(UTC)
    next_slot: dict[str, int] = {}
    for start in range(0, count, PUBLISH_CHUNK):
        events = []
        for n, draft in enumerate(drafts[start : start + PUBLISH_CHUNK], start):
            slot = next_slot.get(draft.project_id, 0) + 1
            next_slot[draft.project_id] = slot
            moment = start_at + timedelta(milliseconds=n)
            events.append(draft.to_event(tenant_id=TENANT, timestamp=moment, slot=slot))
        send_to_streams(
            producer,
            events,
            stream_for=s.topology.stream_for,
            max_bytes=s.max_envelope_bytes,
            flush_timeout=300,
        )
        print(f"    scale: published {start + len(events)}/{count}", file=sys.stderr, flush=True)


def publish_apart(s: Settings, projects: int, count: int) -> None:
    """:func:`publish` in a process of its own: the case's process then holds only what the
    projector holds (memory freed by Python is not always given back, and the RSS rows read it)."""
    subprocess.run(
        [sys.executable, "-m", "bench.scale_cases", str(projects), str(count)],
        cwd=ROOT,
        env=settings_environ(s),
        check=True,
    )


def current_rss_mb() -> float:
    """This process's resident set now (``/proc/self/statm``; ru_maxrss only ever grows)."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_projector(
    s: Settings, count: int, *, sample_at: int | None = None
) -> tuple[float, float | None, float]:
    """Run the projector over ``count`` events: (seconds, RSS MB once ``sample_at`` events were
    handled, RSS MB at the end)."""
    subscription = open_subscription(s, SLUG)
    runner = subscription.runner
    early: list[float] = []

    def should_stop() -> bool:
        if sample_at is not None and not early and runner.stats.records >= sample_at:
            early.append(current_rss_mb())
        return runner.stats.records >= count

    started = time.perf_counter()
    try:
        runner.run(should_stop=should_stop, tick=subscription.tick)
        seconds = time.perf_counter() - started
        end = current_rss_mb()
    finally:
        subscription.close()
    if runner.stats.records < count:
        raise RuntimeError(f"the projector handled {runner.stats.records} of {count} events")
    return seconds, (early[0] if early else None), end


# -- throughput at 100,000 projects (500 is the projector row) -----------------------------------


def _publish_many_projects(env: BenchEnv) -> None:
    """The scale environment (``<run>_scale``), its events published in the run's first round;
    a later round finds them there and none of the projector's state of an earlier one."""
    s = env.scratch["scale"] = Settings(
        **{**env.settings.model_dump(), "env": f"{env.settings.env}_scale"}
    )
    marker = env.run_dir / PUBLISHED
    if not marker.exists():
        publish_apart(s, MANY_PROJECTS, env.size)
        marker.write_text(str(env.size))
    forget_subscription(s, SLUG)


def _forget_projector(env: BenchEnv) -> None:
    forget_subscription(env.scratch["scale"], SLUG)


@case("scale", setup=_publish_many_projects, teardown=_forget_projector)
def scale(env: BenchEnv) -> list[Row]:
    """Row scale-100k, beside the projector row (the same events over 500 projects); the harness
    makes scale-projects, their ratio round by round, when both ran."""
    s: Settings = env.scratch["scale"]
    seconds, _, _ = run_projector(s, env.size)
    views = min(MANY_PROJECTS, env.size)
    return [
        rate(
            "scale-100k",
            env.size,
            seconds,
            "events/s",
            vs="projector",
            note=f"project-view-projector, {env.size} events over {views} projects (about "
            f"{env.size / views:.0f} events a view), one process, timed from its start",
        )
    ]


# -- memory after 50,000 and after 1,000,000 events ----------------------------------------------


def _rss_events(env: BenchEnv) -> int:
    return RSS_EVENTS_QUICK if env.quick else RSS_EVENTS


def _publish_many(env: BenchEnv) -> None:
    s = fresh_settings(env, "rss")
    env.scratch["scale-rss"] = s
    publish_apart(s, FEW_PROJECTS, _rss_events(env))


@case("scale-rss", setup=_publish_many, once=True)
def scale_rss(env: BenchEnv) -> list[Row]:
    """Rows rss-50k-mb and rss-1m-mb: the projector's resident memory now, not its peak."""
    s: Settings = env.scratch["scale-rss"]
    count = _rss_events(env)
    try:
        _, early, end = run_projector(s, count, sample_at=RSS_EARLY)
    finally:
        remove_environment(s)
    assert early is not None  # count > RSS_EARLY, and run_projector checked all were handled
    quick = f" (--quick: {count} events, not {RSS_EVENTS})" if count != RSS_EVENTS else ""
    note = (
        f"project-view-projector over {count} events of {FEW_PROJECTS} projects{quick}; "
        "current RSS from /proc/self/statm, sampled at the poll that passed the mark"
    )
    return [
        Row("rss-50k-mb", early, "MB", note=note),
        Row("rss-1m-mb", end, "MB", vs="rss-50k-mb", note=note),
    ]


if __name__ == "__main__":
    # publish_apart's process: settings from RHUMBATRON_* (settings_environ).
    publish(Settings(), int(sys.argv[1]), int(sys.argv[2]))
