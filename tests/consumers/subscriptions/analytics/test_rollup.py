"""The rollup's pure parts: reading a point, refusing a bad one by name, the window listing, and the
analytics command's duration parsing."""

from __future__ import annotations

import orjson
import pytest

from consumers.subscriptions.analytics.rollup import (
    _windows,
    format_epoch,
    metric_shard,
    parse_point,
)
from streams.errors import PointError

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
