"""Analytics subcommands: ``analytics-rollup`` runs the faust rollup worker over the metric points
topic; ``analytics`` reads a metric's (or a project's) per-minute windows from the rollup's web
view; ``analytics-points`` counts the points on the topic as a ``read_committed`` reader sees
them. The rollup's configuration and the readers are in :mod:`router.wiring.analytics`."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from typing import TYPE_CHECKING

import orjson

from consumers.subscriptions.analytics.projector import METRIC_NAMES
from router.cli.common import parse_duration, print_json
from router.cli.observed import observed
from router.settings import Settings
from router.wiring.analytics import (
    declare_rollup_topics,
    point_counts,
    read_metric,
    read_project,
    rollup_address,
    rollup_config,
)
from router.wiring.provisioning import require_topics
from streams.errors import ConfigurationError
from streams.files import private_dir
from streams.topology import metrics_topic

if TYPE_CHECKING:
    pass


# -- the worker ----------------------------------------------------------------------------------
# How often the rollup's worker beats (well inside the default health_stale_s of 60 s).
BEAT_INTERVAL_S = 5.0


def analytics_rollup(settings: Settings, args: argparse.Namespace) -> int:
    try:
        from consumers.subscriptions.analytics.rollup import build_app, run_worker
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"the rollup needs faust-streaming ({exc.name} is not installed); install the "
            "'analytics' extra: pip install -e '.[analytics]'"
        ) from exc
    require_port_free(settings.analytics_rollup_host, settings.analytics_rollup_port)
    require_topics(settings, [metrics_topic(settings.env)])
    config = rollup_config(settings)
    private_dir(config.datadir)
    print(
        f"analytics rollup '{config.app_id}' over {config.points_topic}, "
        f"web view at {rollup_address(settings)} ({config.guarantee})",
        file=sys.stderr,
        flush=True,
    )
    with observed(settings, "analytics-rollup", needs=("kafka",)) as health:
        app = build_app(config)
        declare_rollup_topics(settings, app)  # served before its consumer joins its group

        # The health beat from the worker's own event loop: a loop that hangs stops it.
        @app.timer(interval=BEAT_INTERVAL_S)  # type: ignore[untyped-decorator]
        async def beat() -> None:
            health.beat()
            health.ready = True  # the worker runs: its agents and web view are up

        run_worker(app, loglevel=args.log_level)
    return 0


def require_port_free(host: str, port: int) -> None:
    """Refuse, naming the setting, a web port another process listens on: faust would fail to
    bind it only once its worker had started, with a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(f"analytics_rollup_host {host!r} does not resolve: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as faust's server binds
        try:
            sock.bind(address)
        except OSError as exc:
            raise ConfigurationError(
                f"the rollup cannot serve its web view on {host}:{port}: {exc.strerror} (another "
                "rollup of this environment?); choose another port with "
                "RHUMBATRON_ANALYTICS_ROLLUP_PORT"
            ) from exc


# -- reading the web view ------------------------------------------------------------------------


def analytics(settings: Settings, args: argparse.Namespace) -> int:
    since_s = parse_duration(args.since, option="--since")
    now = time.time()
    if args.project:
        view = read_project(settings, args.project, since_s, now=now, metric=args.metric)
    else:
        if args.metric is None:
            raise ConfigurationError("give --metric NAME, or --project ID (with or without it)")
        view = read_metric(settings, args.metric, since_s, now=now)
    if args.json:
        print_json(view)
        return 0
    title = view.get("metric") or "all metrics"
    where = f" of project {args.project}" if args.project else ""
    print(f"{title}{where} since {view['since']} ({view['windowSeconds']}s windows)")
    if not view["windows"]:
        print("  no windows in that time")
    for w in view["windows"]:
        value = w["count"] if "count" in w else orjson.dumps(w["counts"]).decode()
        print(f"  {w['start']}  {value}")
    if "total" in view:
        print(f"  total {view['total']}")
    return 0


# -- counting the points -------------------------------------------------------------------------


def points_cmd(settings: Settings, args: argparse.Namespace) -> int:
    counts = point_counts(settings)
    if args.json:
        print_json(counts)
    else:
        print(f"{counts['points']} points from {counts['events']} events")
        if not counts["byMetric"]:
            print("  no points on the topic")
        for metric, n in counts["byMetric"].items():
            print(f"  {metric:<32} {n}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "analytics-rollup",
        help="run the faust rollup of the metric points into per-minute windows (web view)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="the worker's log level (default: warning)",
    )
    p.set_defaults(handler=analytics_rollup)

    p = sub.add_parser("analytics", help="per-minute counts of a metric, read from the rollup")
    p.add_argument("--metric", help=f"one of: {', '.join(sorted(METRIC_NAMES))}")
    p.add_argument("--project", help="a project's windows instead of the metric's overall ones")
    p.add_argument("--since", default="1h", help="how far back: 90s, 30m, 2h, 1d (default 1h)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=analytics)

    p = sub.add_parser(
        "analytics-points", help="count the metric points on the topic (read_committed)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=points_cmd)
