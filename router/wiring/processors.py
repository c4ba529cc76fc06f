"""Building each subscription's processor from settings, by slug. One builder per subscription;
a builder gets the settings, a Redis client and the clock, and returns the processor.

The product has four subscriptions: ``project-view-projector``, ``causal-router``,
``audit-archiver`` and ``analytics-projector``. ``ledger`` is the runtime's drill and test
subscription (it records what it applied and fails on purpose on drill events), not a product
subscription.

A subscription may also have a *companion*: work that lives and dies with its consume process
(the router's outbox publisher and maintenance tick). ``rhumbatron consume`` starts it after the
processor is built and stops it when the loop ends; commands that only build a processor (the
operator controls) never start it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import redis

from consumers.runtime.types import Processor
from router.settings import Settings
from streams.clock import Clock
from streams.errors import ConfigurationError

Builder = Callable[[Settings, "redis.Redis[bytes]", Clock], Processor]


class Companion(Protocol):
    def start(self) -> None: ...

    def close(self) -> None: ...


CompanionBuilder = Callable[[Settings, "redis.Redis[bytes]", Clock, Processor], Companion]


def _ledger(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from consumers.subscriptions.ledger import Ledger

    return Ledger()


def _project_view(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from consumers.subscriptions.projector.processor import ProjectViewProjector

    return ProjectViewProjector(
        feed_length=settings.project_feed_length, missing_cap=settings.project_view_missing_cap
    )


def _audit_archiver(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from router.wiring.archive import build_archiver

    return build_archiver(settings, client, clock)


def _causal_router(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from router.wiring.causal import build

    return build(settings, client, clock)


def _causal_router_companion(
    settings: Settings, client: redis.Redis[bytes], clock: Clock, processor: Processor
) -> Companion:
    from router.wiring.causal import companion

    return companion(settings, client, clock, processor)


def _analytics_projector(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from consumers.subscriptions.analytics.projector import AnalyticsProjector
    from streams.topology import metrics_topic

    return AnalyticsProjector(metrics_topic(settings.env))


BUILDERS: dict[str, Builder] = {
    "analytics-projector": _analytics_projector,
    "causal-router": _causal_router,
    "audit-archiver": _audit_archiver,
    "ledger": _ledger,
    "project-view-projector": _project_view,
}


COMPANIONS: dict[str, CompanionBuilder] = {
    "causal-router": _causal_router_companion,
}


def build_companion(
    settings: Settings, slug: str, client: redis.Redis[bytes], clock: Clock, processor: Processor
) -> Companion | None:
    builder = COMPANIONS.get(slug)
    return builder(settings, client, clock, processor) if builder else None


def build_processor(
    settings: Settings, slug: str, client: redis.Redis[bytes], clock: Clock
) -> Processor:
    if slug not in BUILDERS:
        raise ConfigurationError(
            f"unknown subscription {slug!r}; known: {', '.join(sorted(BUILDERS))}"
        )
    return BUILDERS[slug](settings, client, clock)
