"""Wiring a subscription from settings: the Kafka transport, the store (Redis; for SQL effects,
the subscription's own PostgreSQL), the dead-letter store, the redelivery reader, the
transactional output (for Kafka effects) and the controls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import redis

from consumers.redis_conn import Wait, connect, connect_cluster
from consumers.runtime.controls import Controls, RedisAuditLog
from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import KafkaRedisDeadLetters
from consumers.runtime.kafka_transport import (
    KafkaOutput,
    KafkaOutputLog,
    KafkaReader,
    KafkaRedelivery,
    KafkaTransport,
)
from consumers.runtime.producer_lease import ProducerLease
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.runner import Runner, RuntimePolicy
from consumers.runtime.store import Store
from consumers.runtime.types import TP, EffectKind, Processor
from consumers.subscriptions.causal_router.processor import CausalRouter
from router.settings import Settings
from router.wiring.metrics import router_instruments
from router.wiring.processors import Companion
from router.wiring.provisioning import require_topics, subscription_topics
from router.wiring.state import durable_audit, rebuild_index
from streams.clock import Clock, SystemClock
from streams.errors import ConfigurationError
from streams.producer import Producer
from streams.topology import (
    dead_letter_topic,
    group_id,
    queue_name,
    redelivery_topic,
    transactional_id,
)
from streams.urls import masked


def processor_for(
    settings: Settings, spec: str, client: redis.Redis[bytes] | None, clock: Clock
) -> Processor:
    """The processor ``spec`` names (a slug, or package.module:attr), without its companions."""
    from router.wiring.processors import build_processor

    return build_processor(settings, spec, client, clock)


def policy(settings: Settings, slug: str) -> RuntimePolicy:
    on_failure = settings.failure_policies.get(slug, "dead-letter")
    if on_failure not in ("dead-letter", "block"):
        raise ConfigurationError(
            f"failure policy of {slug} must be 'dead-letter' or 'block', got {on_failure!r}"
        )
    return RuntimePolicy(
        batch_size=settings.batch_size,
        batch_size_behind=settings.batch_size_behind,
        fold_cache_projects=settings.fold_cache_projects,
        fold_cache_bytes=settings.fold_cache_kbytes * 1024,
        max_batch_failures=settings.max_batch_failures,
        parked_projects_max=settings.parked_projects_max,
        parked_drain_records=settings.parked_drain_records,
        retry_backoff_s=settings.batch_retry_backoff_s,
        retry_backoff_max_s=settings.batch_retry_backoff_max_s,
        max_envelope_bytes=settings.max_envelope_bytes,
        on_failure=on_failure,
        control_check_interval_s=settings.control_check_interval_s,
        output_search_margin_ms=int(settings.recovery_search_margin_s * 1000),
        streams=tuple(settings.topology.stream_names()),
        partitions_per_stream=settings.partitions,
    )


def redis_client(settings: Settings, *, timeout: float | None = None) -> redis.Redis[bytes]:
    """The one client the settings describe: their URL, login and TLS files; every call bounded
    by ``timeout`` (default: ``connect_timeout_s``). With ``redis_cluster`` set, a client of that
    Redis Cluster (its seed nodes; the URL's login and TLS)."""
    password = settings.redis_password
    cluster = settings.redis_cluster
    make = connect if cluster is None else partial(connect_cluster, cluster)
    return make(
        url=settings.redis_url,
        timeout=settings.connect_timeout_s if timeout is None else timeout,
        username=settings.redis_username,
        password=None if password is None else password.get_secret_value(),
        ssl_ca_file=settings.redis_ssl_ca_file,
        ssl_cert_file=settings.redis_ssl_cert_file,
        ssl_key_file=settings.redis_ssl_key_file,
    )


def store(settings: Settings, client: redis.Redis[bytes], slug: str, clock: Clock) -> RedisStore:
    return RedisStore(
        client,
        env=settings.env,
        slug=slug,
        clock=clock,
        claim_ttl_ms=settings.claim_ttl_ms,
        failure_ttl_s=settings.batch_failure_ttl_s,
        claim_buckets=settings.claim_buckets,
        claim_project_buckets=settings.claim_project_buckets,
        claim_gap_horizon=settings.claim_gap_horizon,
        wait=redis_wait(settings),
    )


def store_for(
    settings: Settings, processor: Processor, client: redis.Redis[bytes], clock: Clock
) -> Store:
    """The store a processor commits through: for SQL effects, a SqlStore on its own PostgreSQL
    (``[subscriptions.<slug>] database``), checked to hold the store's tables; Redis for every
    other effect kind."""
    if processor.effect_kind != EffectKind.SQL:
        return store(settings, client, processor.slug, clock)
    # Imported here: psycopg is loaded only by the processes of SQL-effect subscriptions.
    from consumers.runtime.sql_store import SqlStore

    sql_store = SqlStore(
        sql_database(settings, processor.slug),
        env=settings.env,
        slug=processor.slug,
        clock=clock,
        claim_ttl_ms=settings.claim_ttl_ms,
        failure_ttl_s=settings.batch_failure_ttl_s,
        connect_timeout_s=settings.connect_timeout_s,
    )
    sql_store.check()
    return sql_store


def sql_database(settings: Settings, slug: str) -> str:
    """The PostgreSQL URL of a SQL-effect subscription, from its settings' table; a missing or
    unusable one is one line naming where it goes."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    variable = f"RHUMBATRON_SUBSCRIPTIONS__{slug.upper().replace('-', '_')}__DATABASE"
    where = f"[subscriptions.{slug}] database (or {variable})"
    url = settings.subscriptions.get(slug, {}).get("database")
    if not isinstance(url, str) or not url.strip():
        got = "nothing" if url is None else repr(url)
        raise ConfigurationError(
            f"{where}: {slug} has SQL effects and needs the URL of its PostgreSQL there, e.g. "
            f"postgresql://user:password@host:5432/database; got {got}"
        )
    try:
        conninfo_to_dict(url)
    except ProgrammingError as exc:
        raise ConfigurationError(
            f"{where} = {masked(url)!r} is not a PostgreSQL URL ({str(exc).strip()}); give one "
            "like postgresql://user:password@host:5432/database"
        ) from None
    return url


def redis_wait(settings: Settings) -> Wait | None:
    """The WAIT every store commit ends with, or None (``redis_wait_replicas`` 0)."""
    if settings.redis_wait_replicas == 0:
        return None
    return Wait(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)


def dead_letters(settings: Settings, client: redis.Redis[bytes]) -> KafkaRedisDeadLetters:
    producer = Producer(settings.kafka_config())
    return KafkaRedisDeadLetters(
        producer,
        client,
        audit=durable_audit(settings, producer),
        env=settings.env,
        topic=dead_letter_topic(settings.env),
        flush_timeout=settings.flush_timeout_s,
        reason_max_bytes=settings.command_error_max_bytes,
        record_max_bytes=settings.dead_letter_record_max_bytes,
    )


def controls(
    settings: Settings, processor: Processor, client: redis.Redis[bytes], clock: Clock
) -> Controls:
    from router.wiring.archive import archive_reader

    return Controls(
        processor,
        store_for(settings, processor, client, clock),
        KafkaReader(settings.kafka_config()),
        RedisAuditLog(
            client, env=settings.env, slug=processor.slug, durable=durable_audit(settings)
        ),
        dead_letters(settings, client),
        clock,
        settings.max_envelope_bytes,
        # The long-term log for folds that need events past the stream's retention.
        archive=archive_reader(settings, client, clock),
        # A Redis that came back empty or older gets its letters back before a partition reads
        # them.
        rebuild_index=partial(rebuild_index, settings, client),
    )


def dead_letter_actions(
    settings: Settings, client: redis.Redis[bytes], clock: Clock
) -> DeadLetterActions:
    """Retry and dismiss for every dead letter: events back through their subscription's
    redelivery topic, commands back to their origin queue."""
    producer = Producer(settings.kafka_config())

    def send(
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        producer.produce(
            topic, value, key=key.decode() if key else None, headers=headers, partition=partition
        )
        producer.flush(settings.flush_timeout_s)

    return DeadLetterActions(
        dead_letters(settings, client),
        clock,
        send,
        lambda slug: require_redelivery_topic(settings, slug),
        lambda tp: settings.topology.redelivery_partition(tp.topic, tp.partition),
        lambda purpose: queue_name(purpose, settings.env),
        stale_retry_s=settings.operator_stale_retry_s,
    )


def require_redelivery_topic(settings: Settings, slug: str) -> str:
    """The subscription's redelivery topic, which must exist (``rhumbatron provision`` makes one
    for every subscription); returns its name. Creates nothing."""
    name = settings.topology.redelivery_spec(slug).name
    require_topics(settings, [name])
    return name


@dataclass
class Subscription:
    """A runnable subscription process and what it holds."""

    runner: Runner
    client: redis.Redis[bytes]
    lease: ProducerLease | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def tick(self) -> None:
        if self.lease is not None:
            self.lease.renew()

    def close(self) -> None:
        try:
            self.runner.close()
        finally:
            for close in self.closers:
                close()
            if self.lease is not None:
                self.lease.release()


def open_subscription(
    settings: Settings,
    spec: str,
    *,
    clock: Clock | None = None,
    processor: Processor | None = None,
) -> Subscription:
    """The consume process of the subscription ``spec`` names (a slug, or package.module:attr;
    or ``processor``, a test's own), subscribed, with its companions started."""
    from router.wiring.processors import check_subscription, load

    clock = clock or SystemClock()
    topology = settings.topology
    # Before anything is built (the router's outbox file, the archive's directory): an
    # environment that is not provisioned is refused having made nothing. A processor named by
    # its path alone is built first, to learn its slug.
    named = processor.slug if processor is not None else None if ":" in spec else spec
    if named is not None:
        if processor is None:
            check_subscription(settings, named)
        require_topics(settings, subscription_topics(topology, named))
    client = redis_client(settings)
    companions: list[Companion] = []
    try:
        if processor is None:
            built = load(settings, spec, clock=clock, client=client)
            processor = built.processor
            if named is None:
                require_topics(settings, subscription_topics(topology, processor.slug))
            companions = built.companions()
    except BaseException:
        client.close()
        raise
    if isinstance(processor, CausalRouter):
        router_instruments().watch(processor.stats)
    base = settings.kafka_config()
    lease = None
    output = None
    if processor.effect_kind == EffectKind.KAFKA:
        lease = ProducerLease(
            client, env=settings.env, slug=processor.slug, ttl_s=settings.producer_lease_ttl_s
        )
        n = lease.acquire()
        output = KafkaOutput(
            base,
            transactional_id=transactional_id(processor.slug, settings.env, n),
            transaction_timeout_ms=settings.transaction_timeout_ms,
        )
    transport = KafkaTransport(
        base,
        group_id=group_id(processor.slug, settings.env),
        protocol=settings.group_protocol,
        session_timeout_ms=settings.session_timeout_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        prefetch_kbytes=settings.consumer_prefetch_kbytes,
        fetch_backoff_ms=settings.consumer_fetch_backoff_ms,
        instance_id=settings.group_instance_id,
    )
    runner = Runner(
        processor,
        transport,
        store_for(settings, processor, client, clock),
        dead_letters(settings, client),
        policy(settings, processor.slug),
        clock,
        output=output,
        output_log=KafkaOutputLog(base) if output is not None else None,
        redelivery=KafkaRedelivery(base, redelivery_topic(processor.slug, settings.env)),
        controls=controls(settings, processor, client, clock),
    )
    runner.start(list(topology.subscription_reads(processor.slug).subscribed))
    subscription = Subscription(runner, client, lease)
    for held in (runner.store, runner.controls.store if runner.controls else None):
        close = getattr(held, "close", None)  # a SqlStore's connection
        if close is not None:
            subscription.closers.append(close)
    for companion in companions:
        companion.start()
        subscription.closers.append(companion.close)
    return subscription


def tp_of(settings: Settings, topic: str, partition: int) -> TP:
    if topic not in settings.topology.stream_names():
        raise ConfigurationError(f"{topic!r} is not a stream of environment {settings.env!r}")
    if not 0 <= partition < settings.partitions:
        raise ConfigurationError(
            f"partition {partition} is out of range 0..{settings.partitions - 1}"
        )
    return TP(topic, partition)
