"""One contract each for the causal router's daily caps (consumers/subscriptions/causal_router/
budget.py): the classifier-call counter (``DailyCounter``) and the per-change command budget
(``CommandBudget``). Subclasses provide the factories; the in-memory twins run them in unit tests,
the Redis caps against real Redis. Two objects a subclass makes within one test (with the same
cap) stand for two router processes of one environment: they share one count."""

from __future__ import annotations

from functools import partial

from consumers.subscriptions.causal_router.budget import CommandBudget, DailyCounter
from tests.support.threads import all_at_once

CALLS = "classifier-calls:2026-03-02"
DAY = "2026-03-02"


class DailyCounterContract:
    def make_counter(self) -> DailyCounter:
        raise NotImplementedError

    def test_a_new_counter_starts_at_one_and_returns_each_new_value(self) -> None:
        counter = self.make_counter()
        assert [counter.incr(CALLS) for _ in range(3)] == [1, 2, 3]

    def test_each_name_counts_apart(self) -> None:
        # The name carries the day: a new day starts from one.
        counter = self.make_counter()
        counter.incr(CALLS)
        counter.incr(CALLS)
        assert counter.incr("classifier-calls:2026-03-03") == 1
        assert counter.incr(CALLS) == 3

    def test_two_routers_share_the_count(self) -> None:
        one, two = self.make_counter(), self.make_counter()
        assert [one.incr(CALLS), two.incr(CALLS), one.incr(CALLS)] == [1, 2, 3]

    def test_concurrent_increments_each_get_their_own_value(self) -> None:
        # The cap compares the returned value with calls_per_day: two callers must never both
        # see the last allowed value.
        counters = [self.make_counter() for _ in range(2)]
        seen = all_at_once([partial(counters[n % 2].incr, CALLS) for n in range(16)])
        assert sorted(seen) == list(range(1, 17))
        assert counters[0].incr(CALLS) == 17


class CommandBudgetContract:
    def make_budget(self, cap: int) -> CommandBudget:
        raise NotImplementedError

    def test_a_change_gets_cap_commands_a_day_and_no_more(self) -> None:
        budget = self.make_budget(3)
        assert [budget.admit("p", "c1", DAY, f"cmd_{n}") for n in range(5)] == [
            True,
            True,
            True,
            False,
            False,
        ]

    def test_an_admitted_command_is_admitted_again_without_counting_twice(self) -> None:
        # A retried batch re-emits the same command ids.
        budget = self.make_budget(2)
        assert budget.admit("p", "c1", DAY, "cmd_a")
        assert budget.admit("p", "c1", DAY, "cmd_a")
        assert budget.admit("p", "c1", DAY, "cmd_b")
        assert not budget.admit("p", "c1", DAY, "cmd_c")
        assert budget.admit("p", "c1", DAY, "cmd_a")  # still admitted once the cap is used up
        assert budget.admit("p", "c1", DAY, "cmd_b")

    def test_a_refused_command_stays_refused(self) -> None:
        budget = self.make_budget(1)
        assert budget.admit("p", "c1", DAY, "cmd_a")
        assert not budget.admit("p", "c1", DAY, "cmd_b")
        assert not budget.admit("p", "c1", DAY, "cmd_b")  # a refusal takes no place either

    def test_a_cap_of_zero_admits_nothing(self) -> None:
        budget = self.make_budget(0)
        assert not budget.admit("p", "c1", DAY, "cmd_a")
        assert not budget.admit("p", None, DAY, "cmd_a")

    def test_each_change_project_and_day_has_its_own_budget(self) -> None:
        budget = self.make_budget(1)
        assert budget.admit("p", "c1", DAY, "cmd_a")
        assert budget.admit("p", "c2", DAY, "cmd_b")
        assert budget.admit("p", "c1", "2026-03-03", "cmd_c")
        assert budget.admit("q", "c1", DAY, "cmd_d")
        # Commands with no change (index.build for a project) count under the project.
        assert budget.admit("p", None, DAY, "cmd_e")
        assert not budget.admit("p", None, DAY, "cmd_f")
        assert not budget.admit("p", "c1", DAY, "cmd_g")

    def test_project_and_change_cannot_spell_each_other(self) -> None:
        budget = self.make_budget(1)
        assert budget.admit("a|b", "c", DAY, "cmd_a")
        assert budget.admit("a", "b|c", DAY, "cmd_b")
        assert budget.admit("a|b|c", None, DAY, "cmd_c")

    def test_admit_all_answers_as_one_admit_after_another(self) -> None:
        # A batch's commands: two of one change (the second past its cap of 2, with an id
        # already admitted beside it), one of another, one with no change, one of another
        # project and one of the next day (their own caps).
        budget = self.make_budget(2)
        assert budget.admit("p", "c1", DAY, "cmd_a")
        wanted = [
            ("p", "c1", DAY, "cmd_b"),
            ("p", "c1", DAY, "cmd_c"),
            ("p", "c2", DAY, "cmd_d"),
            ("p", None, DAY, "cmd_e"),
            ("q", "c1", DAY, "cmd_c"),
            ("p", "c1", "2026-03-03", "cmd_c"),
            ("p", "c1", DAY, "cmd_a"),
        ]
        assert budget.admit_all(wanted) == [True, False, True, True, True, True, True]
        assert budget.admit_all([]) == []
        assert not budget.admit("p", "c1", DAY, "cmd_f")
        assert budget.admit("p", "c2", DAY, "cmd_d")  # admitted once, as by admit

    def test_two_routers_share_one_budget(self) -> None:
        one, two = self.make_budget(2), self.make_budget(2)
        assert one.admit("p", "c1", DAY, "cmd_a")
        assert two.admit("p", "c1", DAY, "cmd_b")
        assert not one.admit("p", "c1", DAY, "cmd_c")
        assert two.admit("p", "c1", DAY, "cmd_a")

    def test_concurrent_admissions_never_pass_the_cap(self) -> None:
        budgets = [self.make_budget(5) for _ in range(2)]
        admitted = all_at_once(
            [partial(budgets[n % 2].admit, "p", "c1", DAY, f"cmd_{n}") for n in range(16)]
        )
        assert admitted.count(True) == 5
        winners = [f"cmd_{n}" for n, ok in enumerate(admitted) if ok]
        assert all(budgets[0].admit("p", "c1", DAY, w) for w in winners)
        assert not budgets[1].admit("p", "c1", DAY, "cmd_late")
