"""Which topics each command needs, and the one place an environment's topics are created.

Runtime commands (``consume``, ``worker``, ``dead-letter-consumer``, ``publish``, the operator
server's retries) never create topics: creating needs rights a consumer's identity should not
hold, and a mistyped ``RHUMBATRON_ENV`` would quietly make a whole new environment. They check
instead (:func:`require_topics`) and refuse in one line naming what is missing and what to run.
``rhumbatron provision`` (and the demo, through it) creates the whole plan:
:func:`environment_specs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from consumers.runtime.types import EffectKind
from router.settings import Settings
from streams.admin import ProvisionReport, admin_client, ensure_reachable, provision
from streams.errors import NotProvisioned
from streams.topology import TopicSpec, Topology
from streams.urls import masked


def environment_specs(
    topology: Topology, subscriptions: Iterable[str] | None = None
) -> list[TopicSpec]:
    """The whole plan: the streams, the command queues and the internal topics, each queue's
    retry topic, the redelivery topic of every subscription (``subscriptions``: by default the
    installed ones; the settings' own are :func:`router.wiring.processors.subscription_slugs`),
    and the pump's checkpoint topic."""
    from router.wiring.processors import installed

    slugs = sorted(installed() if subscriptions is None else set(subscriptions))
    return [
        *topology.all_specs(),
        topology.pump_spec(),
        *(spec for purpose in topology.queues for spec in topology.retry_specs(purpose)),
        *(topology.redelivery_spec(slug) for slug in slugs),
    ]


def provision_environment(
    settings: Settings, *, subscriptions: Iterable[str] = ()
) -> ProvisionReport:
    """Create what is missing of :func:`environment_specs` for every subscription of the
    settings (and ``subscriptions``, a test's own processors) and align what exists
    (idempotent)."""
    from router.wiring.processors import subscription_slugs

    base = settings.kafka_config()
    slugs = {*subscription_slugs(settings), *subscriptions}
    return provision(
        admin_client(base),
        base,
        environment_specs(settings.topology, slugs),
        topology=settings.topology,
        timeout=settings.connect_timeout_s,
    )


def provision_databases(settings: Settings, specs: Iterable[str] = ()) -> list[str]:
    """The runtime's tables in the database of every SQL-effect subscription of the settings
    (and of ``specs``, named by their path alone), made if missing (idempotent); returns what
    it provisioned, one line each."""
    from router.wiring.processors import effect_kinds, load
    from router.wiring.subscription import sql_database

    kinds = effect_kinds(settings)
    for spec in specs:
        processor = load(settings, spec).processor
        kinds[processor.slug] = processor.effect_kind
    done = []
    for slug, kind in kinds.items():
        if kind != EffectKind.SQL:
            continue
        from consumers.runtime.sql_store import provision_sql_store

        url = sql_database(settings, slug)
        provision_sql_store(url, connect_timeout_s=settings.connect_timeout_s)
        done.append(f"{slug}: its tables in {masked(url)}")
    return done


def subscription_topics(topology: Topology, slug: str) -> list[str]:
    """What one subscription process touches: the streams it reads, its redelivery topic, the
    dead-letter topic, and the queues and metrics topic the Kafka-effect subscriptions write."""
    return [s.name for s in topology.all_specs()] + [topology.redelivery_spec(slug).name]


def pump_topics(topology: Topology) -> list[str]:
    """What the feed pump touches: the streams it writes and its checkpoint topic."""
    return [*topology.stream_names(), topology.pump_spec().name]


def worker_topics(topology: Topology, purpose: str, *, streams: bool = False) -> list[str]:
    """What a command worker touches: every queue (more work, the dead-letter queue), its retry
    topics, the dead-letter store's topic; with ``streams`` (the dead-letter consumer, whose task
    events go out through the router's outbox) the streams too."""
    return [
        *(topology.stream_names() if streams else []),
        *topology.queue_names(),
        *topology.retry_topics(purpose),
        *(s.name for s in topology.internal_specs()),
    ]


def missing_topics(settings: Settings, names: Sequence[str]) -> list[str]:
    """Those of ``names`` the broker does not have; raises Unreachable if it does not answer."""
    base = settings.kafka_config()
    metadata = ensure_reachable(admin_client(base), base, settings.connect_timeout_s)
    return [name for name in names if name not in metadata.topics]


def require_topics(settings: Settings, names: Sequence[str]) -> None:
    """Return if every one of ``names`` exists; else raise :class:`NotProvisioned` naming the
    missing ones. Creates nothing."""
    missing = missing_topics(settings, names)
    if missing:
        raise NotProvisioned(settings.env, missing, compact_names(missing))


_NUMBERED = re.compile(r"^(\D*)(\d+)(.*)$")


def compact_names(names: Sequence[str]) -> str:
    """Names joined by ``, `` with runs of consecutive numbers folded, in the order given:
    ``rhumbatron_events_00_dev … rhumbatron_events_07_dev`` → ``rhumbatron_events_00-07_dev``."""
    out: list[str] = []
    run: tuple[str, str, int, int, int] | None = None  # prefix, suffix, width, first, last

    def flush() -> None:
        if run is not None:
            prefix, suffix, width, first, last = run
            numbers = (
                f"{first:0{width}d}" if first == last else f"{first:0{width}d}-{last:0{width}d}"
            )
            out.append(f"{prefix}{numbers}{suffix}")

    for name in names:
        match = _NUMBERED.match(name)
        if match is None:
            flush()
            run = None
            out.append(name)
            continue
        prefix, digits, suffix = match.groups()
        number = int(digits)
        if run is not None and run[:3] == (prefix, suffix, len(digits)) and number == run[4] + 1:
            run = (prefix, suffix, len(digits), run[3], number)
            continue
        flush()
        run = (prefix, suffix, len(digits), number, number)
    flush()
    return ", ".join(out)


def topics_phrase(names: Sequence[str]) -> str:
    """``rhumbatron_events_00-07_dev, rhumbatron_redelivery_ledger_dev (9)``: for start lines."""
    return f"{compact_names(names)} ({len(names)})"
