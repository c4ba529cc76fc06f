"""The rollup's pure parts: reading a point, refusing a bad one by name, the window listing, the
analytics command's duration parsing, and the topics it declares before its worker starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast
from unittest.mock import AsyncMock

import faust
import orjson
import pytest
from faust.transport.drivers.aiokafka import Transport

from consumers.subscriptions.analytics.rollup import (
    RollupConfig,
    _windows,
    build_app,
    format_epoch,
    internal_topics,
    metric_shard,
    parse_point,
)
from streams.errors import PointError
from streams.topology import TopicSpec

GOOD = {
    "metric": "task_started",
    "projectId": "proj-1",
    "changeId": None,
    "taskId": "t1",
    "eventId": "evt_" + "0" * 32,
    "time": "2026-03-01T12:00:59.999Z",
    "value": 1,
}


def test_a_point_is_read_with_its_own_time() -> None:
    point = parse_point(orjson.dumps(GOOD))
    assert (point.metric, point.project_id) == ("task_started", "proj-1")
    assert format_epoch(point.timestamp) == "2026-03-01T12:00:59.999Z"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "empty record"),
        (b"{not json", "not JSON"),
        (b"[1]", "expected a JSON object, got list"),
        (orjson.dumps(GOOD | {"metric": "tasks"}), "unknown metric 'tasks'"),
        (orjson.dumps(GOOD | {"projectId": ""}), "projectId must be a non-empty string"),
        (orjson.dumps(GOOD | {"time": "2026-03-01 12:00"}), "time must be UTC"),
        (orjson.dumps(GOOD | {"value": 2}), "value must be 1, got 2"),
        (orjson.dumps(GOOD | {"value": True}), "value must be 1, got True"),
    ],
)
def test_a_bad_point_is_refused_naming_what_is_wrong(raw: bytes | None, message: str) -> None:
    with pytest.raises(PointError, match=message):
        parse_point(raw)


def test_windows_of_a_key_from_since_oldest_first() -> None:
    data = {
        (metric_shard("task_ready", 0), (120.0, 179.9)): 2,
        (metric_shard("task_ready", 0), (60.0, 119.9)): 5,
        (metric_shard("task_ready", 1), (60.0, 119.9)): 7,
        (metric_shard("task_ready", 0), (0.0, 59.9)): 1,
    }
    assert _windows(data, "task_ready@0", 60.0) == [(60.0, 119.9, 5), (120.0, 179.9, 2)]
    assert _windows(data, "task_ready@1", 0.0) == [(60.0, 119.9, 7)]


# -- the rollup's own topics ----------------------------------------------------------------------
def _config(tmp_path: Path, partitions: int = 3, replication: int = 2) -> RollupConfig:
    return RollupConfig(
        app_id="rhumbatron-analytics-rollup-unit",
        bootstrap="127.0.0.1:9",
        points_topic="rhumbatron_event_metrics_unit",
        partitions=partitions,
        replication_factor=replication,
        window_s=60,
        window_retention_s=3 * 86_400,
        guarantee="exactly_once",
        host="127.0.0.1",
        port=6067,
        datadir=str(tmp_path),
        session_timeout_s=6.0,
    )


def _declared_by_faust(app: faust.App) -> dict[str, TopicSpec]:
    """What faust's own declaration of the app's internal topics asks the broker for: each topic's
    ``declare()`` run against a recording producer, its cleanup flags and retention turned into
    topic configuration by faust's aiokafka transport."""
    asked: dict[str, TopicSpec] = {}

    class Recording:
        async def create_topic(self, **kw: Any) -> None:
            retention = int(kw["retention"] * 1000) if kw["retention"] else None
            config = Transport._topic_config(
                cast(Any, None), retention, kw["compacting"], kw["deleting"]
            )
            config.update(kw["config"] or {})
            asked[kw["topic"]] = TopicSpec(
                kw["topic"],
                kw["partitions"],
                kw["replication"],
                {k: str(v) for k, v in config.items()},
                kind="internal",
            )

    async def declare_all() -> None:
        topics = [t.changelog_topic for t in app.tables.values()]
        topics.append(cast(Any, app)._leader_assignor._leader_topic)
        for topic in topics:
            topic._get_producer = AsyncMock(return_value=Recording())
            await topic.declare()

    asyncio.run(declare_all())
    return asked


@pytest.mark.parametrize(("partitions", "replication"), [(2, 1), (8, 3)])
def test_the_rollup_declares_its_topics_as_faust_would(
    tmp_path: Path, partitions: int, replication: int
) -> None:
    app = build_app(_config(tmp_path, partitions, replication))
    mine = {spec.name: spec for spec in internal_topics(app)}
    assert mine == _declared_by_faust(app)
    prefix = "rhumbatron-analytics-rollup-unit-"
    assert sorted(mine) == [
        f"{prefix}__assignor-__leader",
        f"{prefix}by_metric-changelog",
        f"{prefix}by_project-changelog",
        f"{prefix}invalid-changelog",
    ]
    windowed = mine[f"{prefix}by_metric-changelog"]
    assert windowed.partitions == partitions and windowed.replication_factor == replication
    assert windowed.config == {"cleanup.policy": "compact,delete", "retention.ms": "259200000"}
    assert mine[f"{prefix}invalid-changelog"].config == {"cleanup.policy": "compact"}
    assert mine[f"{prefix}__assignor-__leader"].partitions == 1
