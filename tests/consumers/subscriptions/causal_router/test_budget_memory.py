"""The daily-cap contracts against the in-memory twins the router's unit tests use."""

from __future__ import annotations

from consumers.subscriptions.causal_router.budget import (
    CommandBudget,
    DailyCounter,
    MemoryCommandBudget,
    MemoryDailyCounter,
)
from tests.contracts.caps import CommandBudgetContract, DailyCounterContract


class TestMemoryDailyCounter(DailyCounterContract):
    """One process: every "router" of a test shares the same twin."""

    def setup_method(self) -> None:
        self.counter = MemoryDailyCounter()

    def make_counter(self) -> DailyCounter:
        return self.counter


class TestMemoryCommandBudget(CommandBudgetContract):
    def setup_method(self) -> None:
        self.budgets: dict[int, MemoryCommandBudget] = {}

    def make_budget(self, cap: int) -> CommandBudget:
        return self.budgets.setdefault(cap, MemoryCommandBudget(cap))
