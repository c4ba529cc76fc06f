"""The settings a factory is given, for the tests of a processor made from them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

from rhumbatron import SubscriptionSettings
from rhumbatron.testing import subscription_settings as made


@pytest.fixture
def subscription_settings() -> Callable[..., SubscriptionSettings]:
    """``make(slug, **table)``: what a factory is given for ``[subscriptions.<slug>]`` holding
    ``table``, in settings that have the ``notifications`` queue."""
    return partial(made, queues=["notifications"])
