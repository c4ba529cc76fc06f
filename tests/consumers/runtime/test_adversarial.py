"""The runtime's guarantees under attack, on the in-memory twin (held to librdkafka by the
transport contract): generated logs that mix projects in a partition, with failing head events,
duplicate copies, poison records and operator retries; between steps, crashes and transaction
aborts at every fail-point, rebalances between two members, and operator moves. After healing,
the invariants are checked against an independent record kept by the test itself. The plans, the
fleet that plays them and the checks are tests/support/adversarial.py's, shared with the SQL
path's suite (test_adversarial_sql.py).

``RHUMBATRON_PROPERTY_EXAMPLES`` sets how many examples each property runs in `make test`
(default 30); the ``slow`` soak variants, run by `make test-slow`, run
``RHUMBATRON_SOAK_EXAMPLES`` (default 5,000).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.adversarial import Plan, check_exactly_once, check_moves, plans
from tests.support.runtime_harness import FlakyEffects

EXAMPLES = int(os.environ.get("RHUMBATRON_PROPERTY_EXAMPLES", "30"))
SOAK_EXAMPLES = int(os.environ.get("RHUMBATRON_SOAK_EXAMPLES", "5000"))
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=HEALTH)
SOAK = settings(max_examples=SOAK_EXAMPLES, deadline=None, suppress_health_check=HEALTH)


# Found by the soak: alpha's failures alone bring the batch to its fifth, which dead-letters
# beta 2 beside it after one failure of its own; retried, beta 2 fails five more times and is
# dead-lettered again, in a second letter (the first one retried).
REFAILED_AFTER_RETRY = Plan(
    order=[
        ("beta", 1),
        ("beta", 1),
        ("beta", 1),
        ("alpha", 1),
        ("beta", 1),
        ("beta", 1),
        ("beta", 2),
    ],
    poison_at=[],
    failures={("beta", 2): 7, ("alpha", 1): 7},
    steps=[
        ("crash", "runtime.before_store_commit", 3),
        ("run", 1),
        ("crash", "runtime.before_store_commit", 1),
        ("crash", "runtime.before_store_commit", 1),
        ("abort", 1),
        ("retry_letters",),
    ],
)


@PROPERTY
@given(plans(moves=False))
@example(REFAILED_AFTER_RETRY)
def test_every_effect_exactly_once_or_dead_lettered_in_project_order(plan: Plan) -> None:
    check_exactly_once(plan)


@pytest.mark.slow
@SOAK
@given(plans(moves=False))
def test_soak_every_effect_exactly_once_or_dead_lettered_in_project_order(plan: Plan) -> None:
    check_exactly_once(plan)


@PROPERTY
@given(plans(moves=True))
def test_operator_moves_between_failures_never_double_never_lose_and_folds_agree(
    plan: Plan,
) -> None:
    check_moves(plan)


# Found by the soak: a skip_through over a copy of an event, then a reprocess_from over the
# skipped offset. A later copy was judged stale (the skip's dead claim, at the earlier revision)
# and recorded as handled beyond the held re-run copy, so a re_reduce folded it, and the re-run
# copy was folded again when its failures ran out: beta 1 twice in the live fold.
SKIPPED_THEN_REPROCESSED = Plan(
    order=[("beta", 1)] * 5 + [("alpha", 1), ("alpha", 2)],
    poison_at=[],
    failures={("alpha", 1): 1, ("alpha", 2): 1, ("beta", 1): 2},
    steps=[("skip", 0), ("reprocess", 0, 1), ("run", 2), ("re_reduce", 0)],
)


def test_a_reprocess_over_a_skipped_copy_folds_the_event_once() -> None:
    @settings(max_examples=1, database=None, deadline=None)
    @given(st.just(SKIPPED_THEN_REPROCESSED))
    def run(plan: Plan) -> None:
        check_moves(plan)

    run()


# Found by the soak: beta 2 is dead-lettered and its letter retried; before the retry comes
# back, a reprocess_from over its offset and a skip_through of that offset. The retry applied
# beta 2 (checked against claims only) but its offset stayed in the skipped range, so a rebuild
# left out what the live fold holds.
RETRIED_THEN_REPROCESSED_AND_SKIPPED = Plan(
    order=[("alpha", 1)] * 5 + [("beta", n) for n in range(1, 6)] + [("delta", 1)],
    poison_at=[],
    failures={("beta", 1): 1, ("beta", 2): 5},
    steps=[
        ("crash", "runtime.before_read_through_commit", 1),
        ("retry_letters",),
        ("reprocess", 0, 5),
        ("skip", 0),
    ],
)


# The other order: alpha 2's retry comes back (and is applied) after the reprocess_from over its
# offset, and the skip_through then passes that offset; it must not be recorded as skipped.
RETRIED_REPROCESSED_APPLIED_THEN_SKIPPED = Plan(
    order=[("alpha", 1)] * 2 + [("alpha", 2)] + [("alpha", 1)] * 3 + [("beta", 1), ("delta", 1)],
    poison_at=[],
    failures={("alpha", 2): 7, ("alpha", 1): 2},
    steps=[
        ("crash", "runtime.before_read_through_commit", 1),
        ("retry_letters",),
        ("run", 1),
        ("reprocess", 0, 5),
        ("run", 1),
        ("skip", 0),
    ],
)


@pytest.mark.parametrize(
    "plan",
    [RETRIED_THEN_REPROCESSED_AND_SKIPPED, RETRIED_REPROCESSED_APPLIED_THEN_SKIPPED],
    ids=["skipped-then-applied", "applied-then-skipped"],
)
def test_a_retried_letter_and_a_skip_of_its_offset_leave_the_folds_equal(plan: Plan) -> None:
    @settings(max_examples=1, database=None, deadline=None)
    @given(st.just(plan))
    def run(plan: Plan) -> None:
        check_moves(plan)

    run()


@pytest.mark.slow
@SOAK
@given(plans(moves=True))
def test_soak_operator_moves_never_double_never_lose_and_folds_agree(plan: Plan) -> None:
    check_moves(plan)


@pytest.fixture(autouse=True)
def _reset_budget() -> Any:
    yield
    FlakyEffects.budget = {}
