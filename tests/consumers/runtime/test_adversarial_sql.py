"""The adversarial suite (tests/support/adversarial.py) over SQL effects, against the real
PostgreSQL: the same generated logs (mixed projects, failing head events, duplicates, poison,
transaction markers) and steps (crashes at every fail-point of a SQL batch, the one inside the
database's transaction included; the database's outages at a commit: serialization failures,
deadlocks, connection failures, a connection the server ended; rebalances; operator retries and
moves), checked after healing against the rows the statements wrote (``task_log``, in the order
they were written) and the folds in the database. A failing effect fails in ``process`` or, for
an even n, on the table's constraint in the database, under its SAVEPOINT.

``RHUMBATRON_SQL_PROPERTY_EXAMPLES`` sets how many examples each property runs in `make test`
(default 80); the ``slow`` soak variants, run by `make test-slow`, run
``RHUMBATRON_SQL_SOAK_EXAMPLES`` (default 1,000).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.adversarial import Plan, check_exactly_once, check_moves, plans
from tests.support.sql_effects import SqlDatabase, SqlPath, reset

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("RHUMBATRON_SQL_PROPERTY_EXAMPLES", "80"))
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SQL_SOAK_EXAMPLES", "1000"))
HEALTH = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.function_scoped_fixture,  # one schema for every example; each has its own env
]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
BOUNDARIES = SqlPath.boundaries


@pytest.fixture
def path() -> Iterator[SqlPath]:
    db = SqlDatabase()
    yield SqlPath(db)
    db.drop()
    reset()


@PROPERTY
@given(plan=plans(moves=False, boundaries=BOUNDARIES))
def test_every_sql_effect_exactly_once_or_dead_lettered_in_project_order(
    path: SqlPath, plan: Plan
) -> None:
    reset()
    check_exactly_once(plan, path)


@pytest.mark.slow
@SOAK
@given(plan=plans(moves=False, boundaries=BOUNDARIES))
def test_soak_every_sql_effect_exactly_once_or_dead_lettered_in_project_order(
    path: SqlPath, plan: Plan
) -> None:
    reset()
    check_exactly_once(plan, path)


@PROPERTY
@given(plan=plans(moves=True, boundaries=BOUNDARIES))
def test_sql_operator_moves_never_double_never_lose_and_folds_agree(
    path: SqlPath, plan: Plan
) -> None:
    reset()
    check_moves(plan, path)


@pytest.mark.slow
@SOAK
@given(plan=plans(moves=True, boundaries=BOUNDARIES))
def test_soak_sql_operator_moves_never_double_never_lose_and_folds_agree(
    path: SqlPath, plan: Plan
) -> None:
    reset()
    check_moves(plan, path)
