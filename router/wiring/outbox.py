"""The outbox from settings: the one place settings become an outbox store (SQLite for a path,
PostgreSQL for a ``postgresql://`` URL), the publisher's policy and its Kafka senders."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, overload

from router.settings import Settings
from streams.clock import Clock
from streams.outbox.publisher import Publisher
from streams.outbox.sender import KafkaSender, SenderFactory
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.sqlite_schema import SqliteOptions
from streams.outbox.states import Ordering, PublisherPolicy
from streams.outbox.store import OutboxStore, is_postgres_url

if TYPE_CHECKING:  # the driver is imported where a PostgreSQL outbox is opened, not before
    from streams.outbox.postgres import PostgresOptions, PostgresOutbox


@overload
def open_outbox(
    settings: Settings, address: os.PathLike[str], *, create: bool, clock: Clock | None = None
) -> SqliteOutbox: ...


@overload
def open_outbox(
    settings: Settings, address: str, *, create: bool, clock: Clock | None = None
) -> SqliteOutbox | PostgresOutbox: ...


def open_outbox(
    settings: Settings, address: str | os.PathLike[str], *, create: bool, clock: Clock | None = None
) -> SqliteOutbox | PostgresOutbox:
    """The outbox at ``address``: a ``postgresql://`` URL is a PostgreSQL outbox (its schema made
    beforehand by ``rhumbatron outbox init``; ``create`` does not apply), anything else a SQLite
    file (``create``: made on first use)."""
    if is_postgres_url(address):
        from streams.outbox.postgres import PostgresOutbox

        return PostgresOutbox(os.fspath(address), options=postgres_options(settings), clock=clock)
    return SqliteOutbox(
        address,
        options=SqliteOptions(
            max_envelope_bytes=settings.max_envelope_bytes,
            missed_report_limit=settings.outbox_missed_report_limit,
            busy_timeout_s=settings.outbox_busy_timeout_s,
            synchronous=settings.outbox_sqlite_synchronous,
        ),
        clock=clock,
        create=create,
    )


def postgres_options(settings: Settings) -> PostgresOptions:
    from streams.outbox.postgres import PostgresOptions

    return PostgresOptions(
        max_envelope_bytes=settings.max_envelope_bytes,
        missed_report_limit=settings.outbox_missed_report_limit,
        connect_timeout_s=settings.connect_timeout_s,
        pool_size=settings.outbox_postgres_pool_size,
        keepalive_s=settings.outbox_postgres_keepalive_s,
        listen_tick_s=settings.outbox_postgres_listen_tick_s,
    )


def init_postgres_outbox(settings: Settings, url: str) -> str:
    """``rhumbatron outbox init --outbox URL``: apply the shipped schema; the line to print."""
    from streams.outbox.postgres import init_outbox

    return init_outbox(
        url,
        max_envelope_bytes=settings.max_envelope_bytes,
        connect_timeout_s=settings.connect_timeout_s,
        keepalive_s=settings.outbox_postgres_keepalive_s,
    )


def migrate_postgres_outbox(settings: Settings, url: str) -> str:
    """``rhumbatron outbox migrate --outbox URL``: move the schema to this release's version
    online (limits written from the settings); the line to print."""
    from streams.outbox.postgres import migrate_outbox

    return migrate_outbox(
        url,
        max_envelope_bytes=settings.max_envelope_bytes,
        connect_timeout_s=settings.connect_timeout_s,
        keepalive_s=settings.outbox_postgres_keepalive_s,
    )


def publisher_policy(settings: Settings) -> PublisherPolicy:
    return PublisherPolicy(
        rows_per_project=settings.outbox_rows_per_project_per_pass,
        rows_per_pass=settings.outbox_rows_per_pass,
        max_row_attempts=settings.outbox_max_row_attempts,
        backoff_initial_s=settings.outbox_backoff_initial_s,
        backoff_max_s=settings.outbox_backoff_max_s,
        poll_interval_s=settings.outbox_poll_interval_s,
        delivery_timeout_s=settings.outbox_delivery_timeout_s,
        ordering=Ordering(settings.outbox_ordering),
    )


def kafka_senders(settings: Settings, policy: PublisherPolicy) -> SenderFactory:
    base = settings.kafka_config()
    gapless = policy.ordering is Ordering.PIPELINED
    extra = {"linger.ms": settings.outbox_linger_ms}
    return lambda: KafkaSender(base, gapless=gapless, extra=extra)


def build_publisher(
    settings: Settings,
    store: OutboxStore,
    *,
    policy: PublisherPolicy | None = None,
    senders: SenderFactory | None = None,
) -> Publisher:
    policy = policy or publisher_policy(settings)
    return Publisher(
        store,
        senders or kafka_senders(settings, policy),
        stream_for=settings.topology.stream_for,
        policy=policy,
        poll_min_s=settings.outbox_poll_min_interval_s,
    )
