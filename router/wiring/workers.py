"""Building workers from settings: the queue's policy, its topics, the Kafka transport and
transactional output, the Redis ledger and counters; the dead-letter consumer with the router's
outbox and its publisher; the figures the demo and operators read."""

from __future__ import annotations

import atexit
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from pydantic import SecretStr

from consumers.runtime.dead_letters import LetterKind
from consumers.runtime.kafka_transport import KafkaOutput, KafkaTransport
from consumers.runtime.producer_lease import ProducerLease
from router.settings import Settings, webhook_keys
from router.wiring.metrics import worker_instruments
from router.wiring.probes import ProcessHealth
from router.wiring.provisioning import require_topics, worker_topics
from router.wiring.subscription import dead_letters, redis_client, redis_wait
from router.workers.dead_letter_consumer import DeadLetterRecorder
from router.workers.helpers import RedisIndexStates, RedisWorkflowRegistry
from router.workers.model import CommandHandler, WorkerPolicy
from router.workers.stores import RedisCommandLedger, RedisWorkerMetrics, read_metrics
from router.workers.worker import Worker, WorkerStats
from streams.admin import admin_client, provision
from streams.clock import Clock, SystemClock
from streams.errors import ConfigurationError
from streams.topology import group_id, transactional_id

if TYPE_CHECKING:
    from router.workers.http_handler import HttpHandler

DEAD_LETTER_QUEUE = "dead-letter"


def worker_policy(settings: Settings, purpose: str) -> WorkerPolicy:
    if purpose not in settings.queues:
        raise ConfigurationError(
            f"no queue policy for {purpose!r} in settings.queues; known: "
            f"{', '.join(sorted(settings.queues))}"
        )
    queue = settings.queues[purpose]
    return WorkerPolicy(
        purpose=purpose,
        env=settings.env,
        batch=queue.batch,
        retries=queue.retries,
        retry_delay_s=queue.retry_delay_s,
        max_in_flight=queue.max_in_flight,
        dead_letter=queue.dead_letter,
        queues=settings.topology.queues,
        max_deliveries=settings.max_command_deliveries,
        max_envelope_bytes=settings.max_envelope_bytes,
        poll_interval_s=settings.worker_poll_interval_s,
        error_max_bytes=settings.command_error_max_bytes,
        transaction_max_commands=settings.worker_transaction_max_commands,
        transaction_max_ms=settings.worker_transaction_max_ms,
        retry_tiers_s=tuple(settings.retry_tiers_s),
        max_retry_delay_s=settings.max_retry_delay_s,
        handler_timeout_s=queue.handler_timeout_s,
        max_abandoned_handlers=settings.max_abandoned_handlers,
        ordered=queue.ordered,
        max_project_backlog=queue.max_project_backlog,
        max_held_projects=queue.max_held_projects,
    )


def worker_slug(purpose: str) -> str:
    """The worker's name in group ids, transactional ids and producer leases."""
    return f"worker-{purpose}"


def provision_queues(settings: Settings, purposes: list[str], *, streams: bool = False) -> None:
    """The queues, their retry topics and the dead-letter store's topic, and with ``streams``
    the event streams; idempotent. For tests that set up only a worker's topics: the runtime
    never calls it (``rhumbatron provision`` creates the whole environment)."""
    base = settings.kafka_config()
    topology = settings.topology
    provision(
        admin_client(base),
        base,
        [
            *(topology.stream_specs() if streams else []),
            *topology.queue_specs(),
            *topology.internal_specs(),
            *(spec for p in purposes for spec in topology.retry_specs(p)),
        ],
        topology=topology,
        timeout=settings.connect_timeout_s,
    )


@dataclass
class WorkerProcess:
    """A runnable worker and what it holds."""

    worker: Worker
    client: redis.Redis[bytes]
    lease: ProducerLease
    closers: list[Callable[[], None]] = field(default_factory=list)

    def tick(self) -> None:
        self.lease.renew()

    def close(self) -> None:
        try:
            self.worker.close()
        finally:
            for close in self.closers:
                close()
            self.lease.release()


def open_worker(
    settings: Settings,
    purpose: str,
    handler: CommandHandler,
    *,
    clock: Clock | None = None,
    client: redis.Redis[bytes] | None = None,
    streams: bool = False,
) -> WorkerProcess:
    """A worker on ``purpose``'s queue; refused (creating nothing) unless every topic it touches
    exists, the streams too with ``streams`` (the dead-letter consumer's task events)."""
    clock = clock or SystemClock()
    client = client or redis_client(settings)
    policy = worker_policy(settings, purpose)
    require_topics(settings, worker_topics(settings.topology, purpose, streams=streams))
    base = settings.kafka_config()
    slug = worker_slug(purpose)
    handler.setup(purpose, settings.env, client)
    lease = ProducerLease(client, env=settings.env, slug=slug, ttl_s=settings.producer_lease_ttl_s)
    n = lease.acquire()
    output = KafkaOutput(
        base,
        transactional_id=transactional_id(slug, settings.env, n),
        transaction_timeout_ms=settings.transaction_timeout_ms,
    )
    transport = KafkaTransport(
        base,
        group_id=group_id(slug, settings.env),
        protocol=settings.group_protocol,
        session_timeout_ms=settings.session_timeout_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        prefetch_kbytes=settings.consumer_prefetch_kbytes,
        fetch_backoff_ms=settings.consumer_fetch_backoff_ms,
        instance_id=settings.group_instance_id,
    )
    worker = Worker(
        policy,
        handler,
        transport,
        output,
        RedisCommandLedger(
            client,
            env=settings.env,
            ttl_ms=settings.queue_retention_ms + settings.command_dedupe_margin_ms,
            wait=redis_wait(settings),
        ),
        clock,
        metrics=RedisWorkerMetrics(client, env=settings.env),
        group=group_id(slug, settings.env),
    )
    worker.start()
    worker_instruments().watch(purpose, worker.stats)
    process = WorkerProcess(worker, client, lease)
    close = getattr(handler, "close", None)
    if callable(close):
        process.closers.append(close)
    return process


def check_http_url(url: str) -> str:
    parts = urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or any(c.isspace() or not c.isprintable() for c in url)
    ):
        raise ConfigurationError(
            f"HTTP handler {url!r}: must be an http:// or https:// URL with a host"
        )
    return url


def http_handler(settings: Settings, url: str, secrets: SecretStr | None = None) -> HttpHandler:
    """The HTTP handler of ``url``, signing with ``secrets`` (a queue's own, from
    ``fleet_workers``) or ``http_handler_secrets``; refused without one."""
    # Imported here: httpx is loaded by the processes that POST, not by every command.
    from router.workers.http_handler import HttpHandler

    check_http_url(url)
    given = secrets or settings.http_handler_secrets
    if given is None:
        raise ConfigurationError(
            f"HTTP handler {url}: no signing secret; set RHUMBATRON_HTTP_HANDLER_SECRETS "
            "(whsec_ and base64, as the receiver has it)"
        )
    try:
        keys = webhook_keys(given.get_secret_value(), "RHUMBATRON_HTTP_HANDLER_SECRETS: ")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        return HttpHandler(
            url,
            keys,
            timeout_s=settings.http_handler_timeout_s,
            max_response_bytes=settings.http_handler_max_response_bytes,
            max_connections=settings.http_handler_max_connections,
            ca_file=settings.http_handler_ca_file,
            cert_file=settings.http_handler_cert_file,
            key_file=settings.http_handler_key_file,
        )
    except (OSError, ssl.SSLError) as exc:  # a missing or unreadable PEM file
        raise ConfigurationError(
            f"HTTP handler {url}: RHUMBATRON_HTTP_HANDLER_CA_FILE / _CERT_FILE / _KEY_FILE "
            f"({settings.http_handler_ca_file}, {settings.http_handler_cert_file}, "
            f"{settings.http_handler_key_file}) cannot be used: {exc}"
        ) from None


def serve_worker(
    process: WorkerProcess,
    *,
    until_idle_s: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    health: ProcessHealth | None = None,
) -> WorkerStats:
    """Runs an opened worker until ``should_stop()`` (or idle for ``until_idle_s``), renewing its
    producer lease and beating its health on every loop (ready once it polls), then closes it:
    the one loop the CLI, the fleet's members and a team's own process share."""

    def tick() -> None:
        if health is not None:
            health.beat()
            health.ready = True  # subscribed to its queue (and retry topics), polling
        process.tick()

    try:
        return process.worker.run(until_idle_s=until_idle_s, should_stop=should_stop, tick=tick)
    finally:
        process.close()


def open_dead_letter_consumer(
    settings: Settings, *, clock: Clock | None = None, publish: bool = True
) -> WorkerProcess:
    """The dead-letter consumer, and (with ``publish``) a publisher thread for the router's
    outbox — the router's own, reused: the outbox lease lets one process publish at a time."""
    from router.wiring.causal import RouterCompanion, open_router_outbox

    clock = clock or SystemClock()
    require_topics(settings, worker_topics(settings.topology, DEAD_LETTER_QUEUE, streams=True))
    client = redis_client(settings)
    outbox = open_router_outbox(settings)
    recorder = DeadLetterRecorder(
        dead_letters(settings, client),
        outbox,
        clock,
        default_tenant=settings.dead_letter_tenant_id,
    )
    process = open_worker(
        settings, DEAD_LETTER_QUEUE, recorder, clock=clock, client=client, streams=True
    )
    if publish:
        companion = RouterCompanion(
            settings.model_copy(update={"maintenance_enabled": False}), client, clock, outbox
        )
        companion.start()
        atexit.register(companion.close)
        process.closers.append(companion.close)
    return process


def index_states(settings: Settings, client: redis.Redis[bytes]) -> RedisIndexStates:
    return RedisIndexStates(client, env=settings.env)


def workflow_registry(settings: Settings, client: redis.Redis[bytes]) -> RedisWorkflowRegistry:
    return RedisWorkflowRegistry(client, env=settings.env, ttl_s=settings.workflow_instance_ttl_s)


def worker_figures(settings: Settings, client: redis.Redis[bytes]) -> dict[str, Any]:
    """What the workers did, for the demo and operators: each queue's counters (summed over its
    worker processes) and the command dead letters by status and origin queue."""
    letters = [d for d in dead_letters(settings, client).list() if d.kind == LetterKind.COMMAND]
    return {
        "queues": read_metrics(client, settings.env),
        "command_dead_letters": {
            "by_status": dict(sorted(Counter(d.status for d in letters).items())),
            "by_origin_queue": dict(
                sorted(Counter(d.origin_queue or "?" for d in letters).items())
            ),
        },
    }
