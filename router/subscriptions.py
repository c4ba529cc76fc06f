"""Building each subscription's processor from settings, by slug. One builder per subscription;
a builder gets the settings, a Redis client and the clock, and returns the processor."""

from __future__ import annotations

from collections.abc import Callable

import redis

from consumers.runtime.types import Processor
from router.settings import Settings
from streams.clock import Clock
from streams.errors import ConfigurationError

Builder = Callable[[Settings, "redis.Redis[bytes]", Clock], Processor]


def _ledger(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from consumers.subscriptions.ledger import Ledger

    return Ledger()


def _project_view(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from consumers.subscriptions.projector import ProjectViewProjector

    return ProjectViewProjector(
        feed_length=settings.project_feed_length, missing_cap=settings.project_view_missing_cap
    )


def _audit_archiver(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from router.archive import build_archiver

    return build_archiver(settings, client, clock)


def _causal_router(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> Processor:
    from router.causal_router import build

    return build(settings, client, clock)


BUILDERS: dict[str, Builder] = {
    "causal-router": _causal_router,
    "audit-archiver": _audit_archiver,
    "ledger": _ledger,
    "project-view-projector": _project_view,
}


def build_processor(
    settings: Settings, slug: str, client: redis.Redis[bytes], clock: Clock
) -> Processor:
    if slug not in BUILDERS:
        raise ConfigurationError(
            f"unknown subscription {slug!r}; known: {', '.join(sorted(BUILDERS))}"
        )
    return BUILDERS[slug](settings, client, clock)
