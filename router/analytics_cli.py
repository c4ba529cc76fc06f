"""Analytics subcommands: ``analytics-rollup`` runs the faust rollup worker over the metric points
topic; ``analytics`` reads a metric's (or a project's) per-minute windows from the rollup's web
view. ``count_points`` counts the points on the topic as a ``read_committed`` reader sees them."""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from consumers.subscriptions.analytics import METRIC_NAMES
from consumers.topic_reader import read_committed
from router.settings import Settings
from streams.admin import admin_client, provision
from streams.errors import ConfigurationError, Unreachable
from streams.topology import metrics_topic

if TYPE_CHECKING:
    from consumers.subscriptions.analytics_rollup import RollupConfig

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> int:
    """``30m``, ``2h``, ``1d``, ``90s`` → seconds."""
    match = _DURATION.match(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ConfigurationError(
            f"--since must be a positive duration such as 90s, 30m, 2h or 1d, got {text!r}"
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def rollup_app_id(settings: Settings) -> str:
    return f"rhumbatron-analytics-rollup-{settings.env}"


def rollup_address(settings: Settings) -> str:
    return f"http://{settings.analytics_rollup_host}:{settings.analytics_rollup_port}"


def rollup_config(settings: Settings) -> RollupConfig:
    from consumers.subscriptions.analytics_rollup import RollupConfig

    return RollupConfig(
        app_id=rollup_app_id(settings),
        bootstrap=settings.kafka_bootstrap,
        points_topic=metrics_topic(settings.env),
        partitions=settings.partitions,
        replication_factor=settings.replication_factor,
        window_s=settings.analytics_window_s,
        window_retention_s=settings.analytics_window_retention_s,
        guarantee=settings.analytics_rollup_guarantee,
        host=settings.analytics_rollup_host,
        port=settings.analytics_rollup_port,
        datadir=str(Path(settings.analytics_rollup_dir) / settings.env),
        session_timeout_s=settings.session_timeout_ms / 1000,
    )


def provision_points_topic(settings: Settings) -> None:
    base = settings.kafka_config()
    topic = metrics_topic(settings.env)
    provision(
        admin_client(base),
        base,
        [s for s in settings.topology.internal_specs() if s.name == topic],
        topology=settings.topology,
        timeout=settings.connect_timeout_s,
    )


# -- the worker ----------------------------------------------------------------------------------
def analytics_rollup(settings: Settings, args: argparse.Namespace) -> int:
    try:
        from consumers.subscriptions.analytics_rollup import build_app, run_worker
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"the rollup needs faust-streaming ({exc.name} is not installed); install the "
            "'analytics' extra: pip install -e '.[analytics]'"
        ) from exc
    provision_points_topic(settings)
    config = rollup_config(settings)
    Path(config.datadir).mkdir(parents=True, exist_ok=True)
    print(
        f"analytics rollup '{config.app_id}' over {config.points_topic}, "
        f"web view at {rollup_address(settings)} ({config.guarantee})",
        file=sys.stderr,
        flush=True,
    )
    run_worker(build_app(config), loglevel=args.log_level)
    return 0


# -- reading the web view ------------------------------------------------------------------------
def fetch_view(settings: Settings, path: str, query: dict[str, str] | None = None) -> Any:
    """GET a rollup web view; errors name the address and what to do."""
    address = rollup_address(settings)
    url = address + path
    if query:
        url += "?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())
    timeout = settings.analytics_query_timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            detail = orjson.loads(body).get("error", body.decode(errors="replace"))
        except orjson.JSONDecodeError:
            detail = body.decode(errors="replace").strip()
        if exc.code == 503:
            raise Unreachable(
                "analytics rollup",
                address,
                "it is running but not ready yet (recovering its tables); try again shortly",
            ) from exc
        raise ConfigurationError(f"the rollup at {address} answered {exc.code}: {detail}") from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(
            "analytics rollup",
            address,
            f"{reason}; is `rhumbatron analytics-rollup` running for environment "
            f"'{settings.env}' (analytics_rollup_host/analytics_rollup_port)?",
        ) from exc


def read_metric(settings: Settings, metric: str, since_s: int, *, now: float) -> Any:
    _check_since(settings, since_s)
    if metric not in METRIC_NAMES:
        raise ConfigurationError(
            f"unknown metric {metric!r}; known: {', '.join(sorted(METRIC_NAMES))}"
        )
    view = fetch_view(
        settings, f"/analytics/metric/{quote(metric)}/", {"since": f"{now - since_s:.3f}"}
    )
    if view["partitions"] != list(range(view["partitionsTotal"])):
        # A metric's windows are kept per points partition; a worker that does not own them all
        # (several workers, or a rebalance under way) would under-count.
        raise Unreachable(
            "analytics rollup",
            rollup_address(settings),
            f"it owns points partitions {view['partitions']} of {view['partitionsTotal']}, "
            "so its per-metric counts would be partial; run one rollup worker per environment "
            "and retry once its rebalance settled",
        )
    return view


def read_project(
    settings: Settings, project: str, since_s: int, *, now: float, metric: str | None = None
) -> Any:
    _check_since(settings, since_s)
    view = fetch_view(
        settings,
        f"/analytics/project/{quote(project, safe='')}/",
        {"since": f"{now - since_s:.3f}"},
    )
    if metric is not None:
        if metric not in METRIC_NAMES:
            raise ConfigurationError(
                f"unknown metric {metric!r}; known: {', '.join(sorted(METRIC_NAMES))}"
            )
        view["metric"] = metric
        view["windows"] = [
            {"start": w["start"], "end": w["end"], "count": w["counts"][metric]}
            for w in view["windows"]
            if w["counts"].get(metric)
        ]
        view["total"] = sum(w["count"] for w in view["windows"])
    return view


def _check_since(settings: Settings, since_s: int) -> None:
    keep = settings.analytics_window_retention_s
    if since_s > keep:
        raise ConfigurationError(
            f"--since {since_s}s reaches past what the rollup keeps ({keep}s, "
            "analytics_window_retention_s); ask for less, or raise the setting"
        )


def analytics(settings: Settings, args: argparse.Namespace) -> int:
    since_s = parse_duration(args.since)
    now = time.time()
    if args.project:
        view = read_project(settings, args.project, since_s, now=now, metric=args.metric)
    else:
        if args.metric is None:
            raise ConfigurationError("give --metric NAME, or --project ID (with or without it)")
        view = read_metric(settings, args.metric, since_s, now=now)
    if args.json:
        sys.stdout.write(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    title = view.get("metric") or "all metrics"
    where = f" of project {args.project}" if args.project else ""
    print(f"{title}{where} since {view['since']} ({view['windowSeconds']}s windows)")
    for w in view["windows"]:
        value = w["count"] if "count" in w else orjson.dumps(w["counts"]).decode()
        print(f"  {w['start']}  {value}")
    if "total" in view:
        print(f"  total {view['total']}")
    return 0


# -- counting the points -------------------------------------------------------------------------
def scan_points(settings: Settings, visit: Callable[[bytes], None]) -> int:
    """Read the points topic from its start to its end as a ``read_committed`` reader (points of
    aborted transactions are not seen), calling ``visit`` with each value; returns the count."""
    return read_committed(
        settings.kafka_config(),
        [metrics_topic(settings.env)],
        lambda message: visit(message.value() or b""),
        timeout_s=settings.analytics_count_timeout_s,
    )


def count_points(settings: Settings) -> int:
    """How many metric points the environment's points topic holds (``read_committed``)."""
    return scan_points(settings, lambda value: None)


def point_counts(settings: Settings) -> dict[str, Any]:
    """Points by metric, and how many distinct events they come from."""
    by_metric: dict[str, int] = {}
    events: set[str] = set()

    def visit(value: bytes) -> None:
        point = orjson.loads(value)
        by_metric[point["metric"]] = by_metric.get(point["metric"], 0) + 1
        events.add(point["eventId"])

    total = scan_points(settings, visit)
    return {"points": total, "events": len(events), "byMetric": dict(sorted(by_metric.items()))}


def points_cmd(settings: Settings, args: argparse.Namespace) -> int:
    counts = point_counts(settings)
    if args.json:
        sys.stdout.write(orjson.dumps(counts, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(f"{counts['points']} points from {counts['events']} events")
        for metric, n in counts["byMetric"].items():
            print(f"  {metric:<32} {n}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "analytics-rollup",
        help="run the faust rollup of the metric points into per-minute windows (web view)",
    )
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(handler=analytics_rollup)

    p = sub.add_parser("analytics", help="per-minute counts of a metric, read from the rollup")
    p.add_argument("--metric", help=f"one of: {', '.join(sorted(METRIC_NAMES))}")
    p.add_argument("--project", help="a project's windows instead of the metric's overall ones")
    p.add_argument("--since", default="1h", help="how far back: 90s, 30m, 2h, 1d (default 1h)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=analytics)

    p = sub.add_parser(
        "analytics-points", help="count the metric points on the topic (read_committed)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=points_cmd)
