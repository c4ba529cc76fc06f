"""SQL effects through the runner: a processor whose effects are statements into its own
PostgreSQL (TaskHistory: an upsert into ``task_history`` with a CHECK constraint, an append to
``task_log``), on the in-memory transport with the real SqlStore. A constraint violation fails
only its event and holds its project while the others apply; an outage (SQLSTATE classes 08 and
40, a lost connection) is retried after a backoff and counts no failure; a zombie's commit
changes nothing; the operator's re-reduce, reprocess-from and skip-through work on it, and an
idempotent upsert converges when reprocess-from runs the statements again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumers.runtime.sql_store import SqlStore
from consumers.runtime.types import TP
from tests.support.runtime_harness import PROJECTS_SHARING, event
from tests.support.sql_effects import SqlDatabase, TaskHistory, reset

pytestmark = pytest.mark.integration

ALPHA, BETA = PROJECTS_SHARING  # one stream partition: alpha's failure is beta's batch's too


@pytest.fixture
def db() -> Iterator[SqlDatabase]:
    database = SqlDatabase()
    yield database
    database.drop()
    reset()


def _history(db: SqlDatabase, proc: TaskHistory) -> set[tuple[str, int]]:
    return set(db.history(proc.env))


def test_a_constraint_violation_fails_its_event_only_and_dead_letters_it_after_five(
    db: SqlDatabase,
) -> None:
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    for project, n in [(ALPHA, 1), (ALPHA, 2), (BETA, 1), (ALPHA, 3), (BETA, 2)]:
        world.publish(event(project, n, fail=(project, n) == (ALPHA, 2)))
    runner = world.runner(proc)
    tp = world.tp_of(ALPHA)
    runner.run_once(timeout=0)
    # alpha 2 violated the CHECK: alpha 3 is held back behind it; beta's events, after it in
    # the partition, are applied; the fold holds neither alpha 2 nor alpha 3.
    assert _history(db, proc) == {(ALPHA, 1), (BETA, 1), (BETA, 2)}
    assert world.store.all_states(tp)[ALPHA]["seen"] == [1]
    assert runner.stats.failures == 1 and runner.stats.applied == 3
    assert runner.parts[tp].retry_at is not None
    world.drain(runner, tick=10.0)
    letters = world.dead.list()
    assert [(len(x.entries), x.attempts) for x in letters] == [(1, 5)]
    assert letters[0].entries[0].event_id == event(ALPHA, 2).event_id
    assert "CheckViolation" in letters[0].error and "task_history" in letters[0].error
    assert _history(db, proc) == {(ALPHA, 1), (ALPHA, 3), (BETA, 1), (BETA, 2)}
    assert world.store.all_states(tp)[ALPHA]["seen"] == [1, 3]
    assert [r["n"] for r in db.log(proc.env) if r["project"] == ALPHA] == [1, 3]


def test_under_block_a_failing_event_is_retried_forever_and_skip_through_passes_it(
    db: SqlDatabase,
) -> None:
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    world.publish(event(ALPHA, 1))
    failing = world.publish(event(ALPHA, 2, fail=True))
    world.publish(event(ALPHA, 3))
    runner = world.runner(proc, on_failure="block")
    tp = world.tp_of(ALPHA)
    for _ in range(12):
        runner.run_once(timeout=0)
        world.clock.advance(10.0)
    assert runner.stats.failures > 5 and world.dead.list() == []
    assert _history(db, proc) == {(ALPHA, 1)}
    world.controls(proc).skip_through(tp, failing, who="oncall", why="a bad row, fixed by hand")
    world.drain(runner, tick=10.0)
    assert _history(db, proc) == {(ALPHA, 1), (ALPHA, 3)}
    assert world.store.all_states(tp)[ALPHA]["seen"] == [1, 3]


@pytest.mark.parametrize("kind", ["40001", "40P01", "08006", "lost"])
def test_an_outage_commits_nothing_counts_no_failure_and_is_read_again_after_a_backoff(
    db: SqlDatabase, kind: str
) -> None:
    """A serialization failure, a deadlock, a connection failure, a connection the server
    ended: the batch's first try meets it."""
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    for project, n in [(ALPHA, 1), (BETA, 1), (ALPHA, 2)]:
        world.publish(event(project, n))
    TaskHistory.outages = [kind]
    runner = world.runner(proc)
    tp = world.tp_of(ALPHA)
    runner.run_once(timeout=0)
    assert _history(db, proc) == set() and world.store.load(tp).acked_through == -1
    assert runner.parts[tp].retry_at is not None and runner.parts[tp].outages == 1
    assert runner.run_once(timeout=0) == 0  # the backoff is not over: nothing is read
    world.drain(runner, tick=10.0)
    assert _history(db, proc) == {(ALPHA, 1), (ALPHA, 2), (BETA, 1)}
    assert len(db.log(proc.env)) == 3  # each event's statements ran once, in the last try
    assert runner.stats.failures == 0 and world.dead.list() == []
    assert runner.parts[tp].outages == 0
    assert world.store.all_states(tp)[ALPHA]["seen"] == [1, 2]


def test_a_zombie_commit_changes_nothing_and_it_drops_the_partition(db: SqlDatabase) -> None:
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    world.publish(event(ALPHA, 1))
    runner = world.runner(proc)
    world.drain(runner)
    tp = world.tp_of(ALPHA)
    # Another process (a store of its own) takes the partition: a new owner epoch.
    newer = db.store(proc.env, proc.slug, world.clock)
    newer.acquire(tp)
    world.publish(event(ALPHA, 2))
    runner.run_once(timeout=0)
    assert runner.stats.fenced == 1 and tp not in runner.parts
    assert _history(db, proc) == {(ALPHA, 1)} and newer.load(tp).acked_through == 0
    assert newer.all_states(tp)[ALPHA]["seen"] == [1]


def test_re_reduce_rebuilds_the_fold_and_runs_no_statement(db: SqlDatabase) -> None:
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    for n in (1, 2, 3):
        world.publish(event(ALPHA, n))
    runner = world.runner(proc)
    world.drain(runner)
    tp = world.tp_of(ALPHA)
    live = world.store.all_states(tp)
    assert world.controls(proc).re_reduce(tp, who="oncall", why="check") == 1
    assert world.store.all_states(tp) == live and len(db.log(proc.env)) == 3
    world.drain(runner)  # the owner notices the rebuilt fold and goes on from it
    world.publish(event(ALPHA, 4))
    world.drain(runner)
    assert world.store.all_states(tp)[ALPHA]["seen"] == [1, 2, 3, 4]


def test_reprocess_from_runs_the_statements_again_and_an_idempotent_upsert_converges(
    db: SqlDatabase,
) -> None:
    """``task_history``'s ``INSERT … ON CONFLICT DO UPDATE`` ends with the same rows after the
    re-run (new idempotency keys: a new cursor revision); ``task_log``'s plain INSERT holds
    every event twice, which is why the docs ask for upserts."""
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    for project, n in [(ALPHA, 1), (BETA, 1), (ALPHA, 2), (BETA, 2)]:
        world.publish(event(project, n))
    runner = world.runner(proc)
    world.drain(runner)
    tp = world.tp_of(ALPHA)
    before = db.history(proc.env)
    folds = world.store.all_states(tp)
    progress = world.store.load(tp)
    world.controls(proc).reprocess_from(tp, 0, progress.cursor_revision, who="op", why="replay")
    world.drain(runner)
    after = db.history(proc.env)
    assert {k: count for k, (count, _) in after.items()} == {
        k: count for k, (count, _) in before.items()
    }
    assert all(after[k][1] != before[k][1] for k in before)  # written again, at revision 1
    assert len(db.log(proc.env)) == 2 * len(before)
    assert world.store.all_states(tp) == folds
    assert world.store.load(tp).cursor_revision == progress.cursor_revision + 1


def test_a_second_store_on_the_database_sees_the_first_ones_rows(db: SqlDatabase) -> None:
    """The operator's controls build a store of their own (router.wiring.subscription): it
    reads the cursor and folds the running subscription wrote."""
    world, proc = db.world(TaskHistory)
    assert isinstance(proc, TaskHistory)
    world.publish(event(ALPHA, 1))
    world.drain(world.runner(proc))
    other: SqlStore = db.store(proc.env, proc.slug, world.clock)
    tp: TP = world.tp_of(ALPHA)
    assert other.load(tp).acked_through == 0 and other.all_states(tp) == {
        ALPHA: {"count": 1, "seen": [1]}
    }
