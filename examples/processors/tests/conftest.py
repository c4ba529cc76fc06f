"""The settings a factory is given, for the tests of a processor made from them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rhumbatron import SubscriptionSettings

# rhumbatron.testing has no maker of SubscriptionSettings yet: these two internal names are what
# `rhumbatron consume` builds them from. Nothing else here reaches past `rhumbatron`.
from router.settings import Settings
from streams.clock import SystemClock


@pytest.fixture
def subscription_settings() -> Callable[..., SubscriptionSettings]:
    """``make(slug, **table)``: what a factory is given for ``[subscriptions.<slug>]`` holding
    ``table``, in settings that have the ``notifications`` queue."""

    def make(slug: str, **table: object) -> SubscriptionSettings:
        settings = Settings(env="test", queues={"notifications": {}})
        return SubscriptionSettings(slug=slug, table=table, settings=settings, clock=SystemClock())

    return make
