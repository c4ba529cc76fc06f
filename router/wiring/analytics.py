"""The analytics rollup from settings: its faust configuration and points topic, reading its web
view (a metric's or a project's per-minute windows), and counting the points on the topic as a
``read_committed`` reader sees them."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from consumers.subscriptions.analytics.projector import METRIC_NAMES
from consumers.topic_reader import read_committed
from router.settings import Settings
from streams.admin import admin_client, ensure_topics
from streams.errors import ConfigurationError, Unreachable
from streams.topology import metrics_topic

if TYPE_CHECKING:
    import faust

    from consumers.subscriptions.analytics.rollup import RollupConfig


def rollup_app_id(settings: Settings) -> str:
    return f"rhumbatron-analytics-rollup-{settings.env}"


def rollup_address(settings: Settings) -> str:
    return f"http://{settings.analytics_rollup_host}:{settings.analytics_rollup_port}"


def rollup_config(settings: Settings) -> RollupConfig:
    """The rollup's configuration; it logs in to Kafka with the login and TLS settings of the
    librdkafka configuration every other client uses (``rollup_security``)."""
    from consumers.subscriptions.analytics.rollup import RollupConfig, rollup_security

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
        datadir=str(settings.in_state_dir(settings.analytics_rollup_dir) / settings.env),
        session_timeout_s=settings.session_timeout_ms / 1000,
        producer_buffer=settings.analytics_rollup_producer_buffer,
        security=rollup_security(settings.kafka_config()),
    )


def declare_rollup_topics(settings: Settings, app: faust.App) -> list[str]:
    """Create the rollup's changelog and leader topics as faust would, and return (the names
    created) once every partition of them is served: its consumer must find them in the broker's
    metadata when it joins (``consumers.subscriptions.analytics.rollup.internal_topics``)."""
    from consumers.subscriptions.analytics.rollup import internal_topics

    base = settings.kafka_config()
    return ensure_topics(
        admin_client(base), base, internal_topics(app), timeout=settings.connect_timeout_s
    )


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
