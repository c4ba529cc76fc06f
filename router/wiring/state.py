"""The durable copy of the operator state (the audit topic) and the rebuild of Redis from it
(consumers/runtime/state_rebuild.py), wired from settings."""

from __future__ import annotations

import logging

import redis

from consumers.runtime.audit_records import KafkaAudit, Progress
from consumers.runtime.state_rebuild import RebuildReport, marker_key, rebuild_redis
from router.settings import Settings
from router.wiring.provisioning import missing_topics
from streams.producer import Producer
from streams.topology import audit_topic

log = logging.getLogger("rhumbatron.state")


def durable_audit(settings: Settings, producer: Producer | None = None) -> KafkaAudit:
    """The audit topic; ``producer``: one the caller already has (acks=all, idempotent, as every
    producer of ours)."""
    return KafkaAudit(
        producer if producer is not None else Producer(settings.kafka_config()),
        settings.kafka_config(),
        topic=audit_topic(settings.env),
        flush_timeout=settings.flush_timeout_s,
        read_timeout=settings.connect_timeout_s,
    )


def ensure_state(
    settings: Settings, client: redis.Redis[bytes], progress: Progress | None = None
) -> RebuildReport | None:
    """At the start of a process that owns the dead-letter index: rebuild it and the audit logs
    if Redis came back empty (no marker, records on the audit topic); None when nothing was
    lost (or the topic is not provisioned yet: ``rhumbatron provision`` makes it)."""
    if client.exists(marker_key(settings.env)) or _no_audit_topic(settings):
        return None
    return rebuild_redis(
        client,
        settings.env,
        durable_audit(settings),
        lock_s=settings.state_rebuild_lock_s,
        progress=progress,
        only_if_lost=True,
    )


def rebuild_index(settings: Settings, client: redis.Redis[bytes], everything: bool) -> None:
    """Before a first fold reads its letters: :func:`ensure_state`, or with ``everything``
    (a Redis restored from an older copy, which holds the marker) :func:`rebuild_state`."""
    if not everything:
        ensure_state(settings, client)
    elif not _no_audit_topic(settings):
        rebuild_state(settings, client)


def _no_audit_topic(settings: Settings) -> bool:
    topic = audit_topic(settings.env)
    if not missing_topics(settings, [topic]):
        return False
    log.warning(
        "the audit topic %s does not exist: the dead-letter index and the audit logs have no "
        "durable copy to be rebuilt from; run rhumbatron provision",
        topic,
    )
    return True


def rebuild_state(
    settings: Settings, client: redis.Redis[bytes], progress: Progress | None = None
) -> RebuildReport:
    """Rebuild whatever Redis lacks, marker or not (``rhumbatron state rebuild-index``)."""
    report = rebuild_redis(
        client,
        settings.env,
        durable_audit(settings),
        lock_s=settings.state_rebuild_lock_s,
        progress=progress,
    )
    assert report is not None  # only an only_if_lost call returns None
    return report
