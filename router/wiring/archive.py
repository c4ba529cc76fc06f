"""Building the archive from settings: its object store, the audit-archiver processor, the reader
that serves replays, and the figures the demo prints.

Each environment has its own archive: ``<archive_dir>/<env>/`` locally, ``<archive_s3_prefix><env>/``
in a bucket, so expiring one environment's parts can never touch another's.
"""

from __future__ import annotations

from datetime import date

import redis

from consumers.runtime.types import TP
from consumers.subscriptions.archive.archiver import AuditArchiver, PartLimits
from consumers.subscriptions.archive.ops import count_parts as _count_parts
from consumers.subscriptions.archive.ops import verify_day
from consumers.subscriptions.archive.reader import StoreArchiveReader
from consumers.subscriptions.archive.store import LocalObjectStore, ObjectStore, S3ObjectStore
from router.settings import Settings
from router.wiring.subscription import store as runtime_store
from streams.clock import Clock, SystemClock
from streams.errors import ConfigurationError

SLUG = AuditArchiver.slug


def object_store(settings: Settings) -> ObjectStore:
    if settings.archive_store == "local":
        return LocalObjectStore(settings.in_state_dir(settings.archive_dir) / settings.env)
    if settings.archive_store == "s3":
        if not settings.archive_s3_bucket:
            raise ConfigurationError(
                "archive_store is 's3' but archive_s3_bucket is not set "
                "(RHUMBATRON_ARCHIVE_S3_BUCKET)"
            )
        access = settings.archive_s3_access_key
        secret = settings.archive_s3_secret_key
        return S3ObjectStore(
            bucket=settings.archive_s3_bucket,
            prefix=f"{settings.archive_s3_prefix}{settings.env}/",
            endpoint_url=settings.archive_s3_endpoint,
            region=settings.archive_s3_region,
            access_key=access.get_secret_value() if access else None,
            secret_key=secret.get_secret_value() if secret else None,
            timeout_s=settings.connect_timeout_s,
        )
    raise ConfigurationError(
        "archive_store is 'none': this environment keeps no archive "
        "(set RHUMBATRON_ARCHIVE_STORE=local or s3)"
    )


def stream_indexes(settings: Settings) -> dict[str, int]:
    return {name: n for n, name in enumerate(settings.topology.stream_names())}


def archiver(settings: Settings) -> AuditArchiver:
    return AuditArchiver(
        object_store(settings),
        PartLimits(
            max_events=settings.archive_part_max_events,
            max_bytes=settings.archive_part_max_bytes,
            max_age_s=settings.archive_part_max_age_s,
        ),
        stream_indexes(settings),
        max_envelope_bytes=settings.max_envelope_bytes,
        gzip_level=settings.archive_gzip_level,
    )


def archive_reader(
    settings: Settings, client: redis.Redis[bytes], clock: Clock
) -> StoreArchiveReader | None:
    """The reader replays use, or None when the environment keeps no archive. It trusts the
    archive only as far as the audit-archiver's cursor: a part is recorded with the cursor before
    it is written, so while one is pending the last part may not be readable yet."""
    if settings.archive_store == "none":
        return None
    cursors = runtime_store(settings, client, SLUG, clock)

    def archived_through(tp: TP) -> int:
        progress = cursors.load(tp)
        if progress.pending_effects:
            return -1  # a part is recorded but maybe not written: trust nothing until it is
        return progress.acked_through

    return StoreArchiveReader(
        object_store(settings), stream_indexes(settings), archived_through=archived_through
    )


def retention_days(settings: Settings) -> int:
    return (
        settings.archive_retention_days_prod
        if settings.env == "prod"
        else settings.archive_retention_days_dev
    )


def count_parts(settings: Settings, day: date | None = None) -> int:
    """Archive parts of the environment (of one day, or all): for the demo's figures."""
    return _count_parts(object_store(settings), day)


def archived_events(settings: Settings, day: date | None = None) -> int:
    """Events archived on ``day`` (default: today, UTC), read back from the parts."""
    day = day or SystemClock().now().date()
    report = verify_day(
        object_store(settings),
        day,
        max_envelope_bytes=settings.max_envelope_bytes,
        streams=stream_indexes(settings),
    )
    return report.events
