"""acme-task-counts: completed and failed tasks per project, in Redis."""

from __future__ import annotations

from acme_processors.counts import TaskCounts
from task_events import lifecycle

from rhumbatron.testing import assert_exactly_once, event, run

EVENTS = [
    *lifecycle("acme-web", "t1", "completed", first_slot=1),
    *lifecycle("acme-web", "t2", "failed", first_slot=4),
    *lifecycle("acme-api", "t3", "completed", first_slot=1),
    *lifecycle("acme-web", "t4", "completed", first_slot=7),
]


def test_counts_per_project() -> None:
    result = run(TaskCounts, EVENTS)
    assert result.redis_of("acme-web")["task-counts:acme-web"] == {
        "completed": "2",
        "failed": "1",
    }
    assert result.redis_of("acme-api")["task-counts:acme-api"] == {
        "completed": "1",
        "failed": "0",
    }
    assert result.folds == {
        "acme-web": {"completed": 2, "failed": 1},
        "acme-api": {"completed": 1, "failed": 0},
    }


def test_only_outcomes_count() -> None:
    result = run(TaskCounts, [event("task.created", "acme-web", slot=1, task_id="t1")])
    assert result.applied == []
    assert result.folds == {}


def test_a_reprocess_arrives_at_the_same_counts() -> None:
    clean = run(TaskCounts, EVENTS)
    reprocessed = run(TaskCounts, EVENTS, operator_move=("reprocess", len(EVENTS) // 2))
    assert {a.cursor_revision for a in reprocessed.applied} == {0, 1}
    assert reprocessed.redis == clean.redis


def test_exactly_once_whatever_happens() -> None:
    assert_exactly_once(TaskCounts, EVENTS)
