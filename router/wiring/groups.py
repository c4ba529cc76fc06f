"""Which topics each consumer group of an environment reads, from the wiring that builds the
groups: ``open_subscription`` (``rhumbatron-<slug>-<env>``, the streams and its redelivery
topic), ``open_worker`` (``rhumbatron-worker-<purpose>-<env>``, its queue and retry topic; the
dead-letter consumer is the worker of the dead-letter queue) and the analytics rollup
(``rhumbatron-analytics-rollup-<env>``, the metric points). The lag report reads each group
over these topics only, so a caught-up group never shows another group's topics as its lag."""

from __future__ import annotations

from router.wiring.workers import worker_slug
from streams.errors import TopologyError
from streams.topology import GroupReads, Topology, metrics_topic

# The analytics rollup's group (faust's app id, router.wiring.analytics.rollup_app_id): it reads
# the metric points; its tables' changelogs are read by assignment and never committed.
ROLLUP_SLUG = "analytics-rollup"


def group_reads(topology: Topology, group: str) -> GroupReads:
    """``group``'s topics; a group of the environment's name that no wiring builds (a slug that
    is not a slug) is ``other``: shown on the environment's topics where it committed, as
    Kafka's own tools show a group."""
    env = topology.env
    slug = group.removeprefix("rhumbatron-").removesuffix(f"-{env}")
    for purpose in topology.queues:
        if slug == worker_slug(purpose):
            return topology.worker_reads(slug, purpose)
    if slug == ROLLUP_SLUG:
        return GroupReads(group, slug, "rollup", (metrics_topic(env),))
    try:
        return topology.subscription_reads(slug)
    except TopologyError:
        everything = (
            *topology.stream_names(),
            *topology.queue_names(),
            *(t for p in topology.queues for t in topology.retry_topics(p)),
        )
        return GroupReads(group, slug, "other", (), everything)
