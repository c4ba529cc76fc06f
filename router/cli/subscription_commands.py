"""Subcommands of the subscription runtime: consume, operator controls, ledger."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from consumers.runtime.runner_base import Stats
from consumers.subscriptions.ledger import read_ledger
from router.cli.common import (
    non_negative_float,
    non_negative_int,
    operator_name,
    print_json,
    stop_on_signals,
)
from router.cli.observed import observed
from router.cli.progress import (
    LagProbe,
    ProgressReporter,
    group_topics,
    start_line,
)
from router.settings import Settings
from router.wiring.processors import slug_of
from router.wiring.subscription import (
    controls,
    open_subscription,
    processor_for,
    redis_client,
    tp_of,
)
from streams import failpoints
from streams.clock import SystemClock

# A fail-point on every turn of the consume loop (``RHUMBATRON_FAILPOINTS=consume.tick@N:hang``:
# the loop wedged, which the liveness probe must see).
TICK = "consume.tick"


def consume(settings: Settings, args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    slug = slug_of(settings, args.subscription)
    with observed(settings, slug) as health:
        subscription = open_subscription(settings, args.subscription)
        reads = settings.topology.subscription_reads(slug)
        start_line(f"consume {slug}", settings, group=reads.group, topics=group_topics(reads))
        stats = subscription.runner.stats
        lag = LagProbe(settings, reads)

        def sample() -> str:
            return (
                f"consume {slug}: {stats.records} records, {stats.applied} applied, "
                f"{stats.dead_lettered} dead-lettered, lag {lag()}"
            )

        def tick() -> None:
            failpoints.hit(TICK)
            health.beat()
            health.ready = True  # subscribed (its topics checked, its stores connected), polling
            subscription.tick()

        try:
            with ProgressReporter(sample, settings.progress_interval_s):
                stats = subscription.runner.run(
                    until_idle_s=args.until_idle, should_stop=stop.is_set, tick=tick
                )
        finally:
            subscription.close()
    print(consume_summary(slug, stats), file=sys.stderr)
    return 0


def consume_summary(slug: str, stats: Stats) -> str:
    """What the runner's counters mean, said in full: every record read is applied, skipped as
    a copy already applied, poison (dead-lettered at once), not of a type the subscription
    reads, or held back (behind a failure: it comes again) or already done before a restart.
    A failed batch is one dead letter however many events it holds."""
    accounted = stats.applied + stats.duplicates + stats.filtered + stats.poison
    again = max(stats.records - accounted, 0)
    batches = stats.dead_lettered - stats.poison
    return (
        f"{slug}: {stats.records} records, {stats.applied} applied, {stats.duplicates} "
        f"duplicates, {stats.dead_lettered} dead-lettered ({stats.poison} poison, {batches} "
        f"failed batches), {stats.filtered} not for this subscription, {again} held back or "
        f"already done; {stats.failures} failed batch attempts"
    )


def _controls(settings: Settings, args: argparse.Namespace) -> Any:
    client = redis_client(settings)
    clock = SystemClock()
    return controls(
        settings, processor_for(settings, args.subscription, client, clock), client, clock
    )


def re_reduce(settings: Settings, args: argparse.Namespace) -> int:
    tp = tp_of(settings, args.topic, args.partition)
    c = _controls(settings, args)
    through = c.store.load(tp).acked_through
    start_line(
        f"re-reduce {args.subscription} {tp.topic}[{tp.partition}] through offset {through}",
        settings,
        topics=[tp.topic],
    )

    def sample() -> str:
        # The fold reports no figures while it reads: the line says it is still at work.
        return f"re-reduce {args.subscription} {tp.topic}[{tp.partition}]: folding"

    with ProgressReporter(sample, settings.progress_interval_s):
        projects = c.re_reduce(
            tp,
            who=operator_name(getattr(args, "who", None)),
            why=args.reason or "operator re-reduce",
        )
    print(
        f"re-reduced {args.topic}[{args.partition}] for {args.subscription}: {projects} projects in the fold"
    )
    return 0


def reprocess_from(settings: Settings, args: argparse.Namespace) -> int:
    progress = _controls(settings, args).reprocess_from(
        tp_of(settings, args.topic, args.partition),
        args.offset,
        args.expected_revision,
        who=operator_name(getattr(args, "who", None)),
        why=args.reason,
    )
    print(
        f"{args.subscription} {args.topic}[{args.partition}] reprocesses from {args.offset} at revision {progress.cursor_revision}"
    )
    return 0


def skip_through(settings: Settings, args: argparse.Namespace) -> int:
    progress = _controls(settings, args).skip_through(
        tp_of(settings, args.topic, args.partition),
        args.offset,
        who=operator_name(getattr(args, "who", None)),
        why=args.reason,
    )
    print(
        f"{args.subscription} {args.topic}[{args.partition}] acknowledged through {progress.acked_through}"
    )
    return 0


def progress(settings: Settings, args: argparse.Namespace) -> int:
    c = _controls(settings, args)
    out = {}
    for topic in settings.topology.stream_names():
        for partition in range(settings.partitions):
            tp = tp_of(settings, topic, partition)
            out[str(tp)] = c.store.load(tp).as_fields()
    print_json(out)
    return 0


def ledger(settings: Settings, args: argparse.Namespace) -> int:
    applied = read_ledger(redis_client(settings), settings.env)
    if args.json:
        print_json(applied)
        return 0
    projects: dict[str, list[int]] = applied["projects"]
    if not projects:
        print(f"no ledger entries: the ledger subscription applied nothing in '{settings.env}'")
        return 0
    width = max(len("PROJECT"), *(len(p) for p in projects))
    print(f"{'PROJECT':<{width}}  {'APPLIED':>7}  SLOTS")
    for project, slots in projects.items():
        print(f"{project:<{width}}  {len(slots):>7}  {_ranges(slots)}")
    repeated = sum(1 for n in applied["counts"].values() if n > 1)
    print(
        f"{sum(len(s) for s in projects.values())} events applied over {len(projects)} projects; "
        f"{repeated} applied more than once"
    )
    return 0


def _ranges(slots: list[int]) -> str:
    """``1 2 3 5 7 8`` → ``1-3, 5, 7-8``, in applied order (an out-of-order slot starts a run)."""
    runs: list[list[int]] = []
    for slot in slots:
        if runs and slot == runs[-1][1] + 1:
            runs[-1][1] = slot
        else:
            runs.append([slot, slot])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


_WHO = "operator name for the audit log (default: the login name)"
_CONTROL_ARGS = {
    "offset": "the stream offset",
    "expected-revision": "the cursor revision you saw (subscription progress); refused if it moved",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("consume", help="run a subscription (one process of its consumer group)")
    p.add_argument(
        "--subscription",
        required=True,
        help="a subscription's slug — the product's project-view-projector, causal-router, "
        "audit-archiver, analytics-projector; ledger, the runtime's drill; one installed "
        "(entry points rhumbatron.subscriptions) or of the settings ([subscriptions.<slug>]) — "
        "or a package.module:attr naming a processor class or factory (docs/processors.md)",
    )
    p.add_argument(
        "--until-idle",
        type=non_negative_float,
        metavar="SECONDS",
        help="exit once nothing was consumed, paused for retry or in flight for this long",
    )
    p.set_defaults(handler=consume)

    ctl = sub.add_parser(
        "subscription", help="operator controls per topic-partition (audited)"
    ).add_subparsers(dest="action", required=True)
    for name, handler, what, extra in (
        (
            "re-reduce",
            re_reduce,
            "rebuild a partition's fold through its acknowledged cursor (no effects run)",
            (),
        ),
        (
            "reprocess-from",
            reprocess_from,
            "apply a partition's events again from an offset",
            ("offset", "expected-revision"),
        ),
        ("skip-through", skip_through, "acknowledge a partition through an offset", ("offset",)),
        ("progress", progress, "every partition's cursor, as JSON", ()),
    ):
        p = ctl.add_parser(name, help=what)
        p.add_argument(
            "--subscription",
            required=True,
            help="the subscription's slug, or its package.module:attr",
        )
        if name != "progress":
            p.add_argument("--topic", required=True, help="the stream")
            p.add_argument(
                "--partition", type=non_negative_int, required=True, help="the stream's partition"
            )
            p.add_argument("--who", help=_WHO)
            p.add_argument(
                "--reason",
                required=name in ("skip-through", "reprocess-from"),
                help="why, for the audit log",
            )
        for arg in extra:
            p.add_argument(
                f"--{arg}", type=non_negative_int, required=True, help=_CONTROL_ARGS[arg]
            )
        if name == "progress":
            p.add_argument(
                "--json", action="store_true", help="print JSON (this command always does)"
            )
        p.set_defaults(handler=handler)

    p = sub.add_parser("ledger", help="what the ledger subscription applied, per project in order")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=ledger)
