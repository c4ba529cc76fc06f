"""The one settings model. Every limit lives here with its default, and every field
can be set from the environment as ``RHUMBATRON_<FIELD>`` (e.g. ``RHUMBATRON_ENV=prod``,
``RHUMBATRON_KAFKA_BOOTSTRAP=host:9092``). Every limit has its bounds here too, so a wrong value is
refused when the settings load, naming its variable, not somewhere later by luck.

A command queue's policy field is ``RHUMBATRON_QUEUES__<QUEUE>__<FIELD>``, the queue's name in
capitals with ``_`` for its hyphens (``RHUMBATRON_QUEUES__AGENT_WAKEUPS__RETRIES=5``); it, and a
whole ``RHUMBATRON_QUEUES`` JSON object, change only the fields they name and keep every other
queue's and field's default. A name that is no built-in queue adds a queue of the settings' own
(``[queues.payments]`` in the file, ``RHUMBATRON_QUEUES__PAYMENTS__RETRIES=5``), named as
``streams.topology.check_queue`` allows.

Nothing else in the code carries these numbers: ``streams`` and ``consumers`` take them as
arguments, built here (``kafka_config``, ``topology``).
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import logging
import os
import re
import socket
import tomllib
from collections.abc import Iterable
from contextvars import ContextVar
from functools import cached_property
from importlib.resources.abc import Traversable
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretBytes,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, to_jsonable_python
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from streams.errors import ConfigurationError, TopologyError
from streams.kafka_config import GUARANTEED
from streams.topology import (
    QUEUE_PURPOSES,
    Topology,
    check_env,
    check_queue,
    check_slug,
    queue_refusal,
)
from streams.urls import masked

DAY_MS = 86_400_000
# The shortest operator token accepted: 32 characters of token_urlsafe are 192 bits.
OPERATOR_TOKEN_MIN_CHARS = 32


def _reveal(value: Any) -> Any:
    """``value`` with every secret in it, however deep, in clear."""
    if isinstance(value, (SecretStr, SecretBytes)):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_reveal(v) for v in value]
    return value


# host:port, or [IPv6]:port, optionally after a listener's scheme (PLAINTEXT://, SSL:// ...).
_BROKER = re.compile(r"^(?:[A-Za-z_]+://)?(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")
_TIME_OF_DAY = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
# A Kubernetes resource quantity: "500m", "0.5", "256Mi", "1G".
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# URLs that may carry a password (an outbox address may be a postgresql:// URL; a list field
# is masked item by item).
_URL_FIELDS = ("redis_url", "classifier_url", "router_outbox_path", "operator_outboxes")


def _masked_field(name: str | None, value: Any) -> Any:
    """``value`` of the field ``name`` as it may be shown: a URL field without its password."""
    if name not in _URL_FIELDS:
        return value
    if isinstance(value, str):
        return masked(value)
    if isinstance(value, list):
        return [masked(v) if isinstance(v, str) else v for v in value]
    return value


# The kafka_* settings and the librdkafka property each one sets (None: used by the builder).
_KAFKA_PROPERTIES: dict[str, str | None] = {
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_file": "ssl.ca.location",
    "kafka_ssl_cert_file": "ssl.certificate.location",
    "kafka_ssl_key_file": "ssl.key.location",
    "kafka_ssl_key_password": "ssl.key.password",
    "kafka_oauth_token_url": "sasl.oauthbearer.token.endpoint.url",
    "kafka_oauth_client_id": "sasl.oauthbearer.client.id",
    "kafka_oauth_client_secret": "sasl.oauthbearer.client.secret",
    "kafka_oauth_scope": "sasl.oauthbearer.scope",
}
# librdkafka properties a setting of ours owns: a pass-through of one is refused, naming it.
_OWNED_PROPERTIES: dict[str, str] = {
    **{prop: name for name, prop in _KAFKA_PROPERTIES.items() if prop},
    "bootstrap.servers": "kafka_bootstrap",
    "metadata.broker.list": "kafka_bootstrap",
    "security.protocol": "kafka_security_protocol",
    "sasl.mechanisms": "kafka_sasl_mechanism",
    "sasl.oauthbearer.method": "kafka_sasl_mechanism",
    "ssl.endpoint.identification.algorithm": "kafka_ssl_endpoint_identification",
    "socket.connection.setup.timeout.ms": "connect_timeout_s",
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "session_timeout_ms",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "transaction.timeout.ms": "transaction_timeout_ms",
    "message.max.bytes": "max_envelope_bytes",
}
_KAFKA_PROPERTY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")


def webhook_keys(secrets: str, where: str) -> list[bytes]:
    """The HMAC keys of space-separated Standard Webhooks secrets (``whsec_`` + base64); a
    wrong one is named by its position, never shown, after ``where`` (a prefix, e.g. "x: ")."""
    keys: list[bytes] = []
    for n, secret in enumerate(secrets.split(), 1):
        body = secret.removeprefix("whsec_")
        try:
            key = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not secret.startswith("whsec_") or len(key) < 16:
            raise ValueError(
                f"{where}secret {n} is not whsec_ followed by the base64 of at least 16 bytes"
            )
        keys.append(key)
    if not keys:
        raise ValueError(f"{where}no secret given")
    return keys


class QueuePolicy(BaseModel):
    """One command queue's delivery policy (docs/queues.md)."""

    # A misspelt field would otherwise be dropped and its default used without a word.
    model_config = ConfigDict(extra="forbid")

    batch: int = Field(ge=1)
    retries: int = Field(ge=0)
    retry_delay_s: float = Field(ge=0)
    # Commands one worker process runs at once; each is a thread (concurrency: its old name).
    max_in_flight: int = Field(
        1, ge=1, le=1024, validation_alias=AliasChoices("max_in_flight", "concurrency")
    )
    dead_letter: str | None = "dead-letter"  # purpose of the dead-letter queue, or None
    # A handler still running after this long is a failed attempt (None: no bound); below
    # max_poll_interval_ms, past which the group would drop the worker anyway.
    handler_timeout_s: float | None = Field(None, gt=0)
    # Each project's commands run in arrival order: a failed attempt waits in the worker (not
    # on a retry topic) and holds the project's later commands back (docs/handlers.md).
    ordered: bool = False
    # On an ordered queue, per partition: a held project's later commands kept in memory, and
    # the projects held at once (their state rides in the group's offset metadata); at either
    # bound the partition pauses until a held command settles.
    max_project_backlog: int = Field(100, ge=1, le=10_000)
    max_held_projects: int = Field(64, ge=1, le=128)

    @field_validator("dead_letter")
    @classmethod
    def _dead_letter_named_as_a_queue(cls, value: str | None) -> str | None:
        # That it is one of the settings' queues is checked where they are all known.
        if value is not None:
            try:
                check_queue(value)
            except TopologyError as exc:
                raise ValueError(f"dead_letter: {exc}") from None
        return value


class WorkerTarget(BaseModel):
    """What one queue's workers in the fleet run, in full: your handler, or a service to POST
    to with its own signing secrets (else ``http_handler_secrets``)."""

    model_config = ConfigDict(extra="forbid")

    handler: str | None = None  # package.module:attr, or an installed handler's name
    http: str | None = None  # the URL of a service that follows the HTTP contract
    http_secrets: SecretStr | None = None  # this queue's signing secrets, space-separated

    @model_validator(mode="after")
    def _one_target(self) -> WorkerTarget:
        if (self.handler is None) == (self.http is None):
            raise ValueError("name exactly one of handler and http")
        if self.http_secrets is not None:
            if self.http is None:
                raise ValueError("http_secrets goes with http")
            webhook_keys(self.http_secrets.get_secret_value(), "http_secrets: ")
        return self

    @property
    def argv(self) -> tuple[str, ...]:
        """The worker command's options for it."""
        return ("--http", self.http) if self.http is not None else ("--handler", self.handler or "")


def worker_target(value: str | WorkerTarget) -> WorkerTarget:
    """A ``fleet_workers`` value as a target: a URL is a service to POST to, anything else a
    handler."""
    if isinstance(value, WorkerTarget):
        return value
    if value.startswith(("http://", "https://")):
        return WorkerTarget(http=value)
    return WorkerTarget(handler=value)


def _queue_variable(purpose: str) -> str:
    """How a queue is spelt in a variable's name: ``agent-wakeups`` -> ``AGENT_WAKEUPS``."""
    return purpose.upper().replace("-", "_")


def _new_queue_policy() -> QueuePolicy:
    """The policy a queue of the settings' own starts from: what its table gives is laid over
    it."""
    return QueuePolicy(batch=10, retries=3, retry_delay_s=30)


def _queue_policies() -> dict[str, QueuePolicy]:
    return {
        "agent-wakeups": QueuePolicy(batch=10, retries=3, retry_delay_s=30),
        "integration": QueuePolicy(batch=10, retries=3, retry_delay_s=30),
        "indexing": QueuePolicy(batch=1, retries=3, retry_delay_s=30, dead_letter=None),
        "dead-letter": QueuePolicy(batch=5, retries=5, retry_delay_s=60, dead_letter=None),
        "verification": QueuePolicy(batch=5, retries=3, retry_delay_s=30),
        "release": QueuePolicy(batch=5, retries=3, retry_delay_s=30),
    }


def queue_order(queues: Iterable[str]) -> tuple[str, ...]:
    """The queues' names: the built-in ones in their order, then the settings' own sorted, so
    the order never depends on which source named a queue."""
    names = set(queues)
    return (*(q for q in QUEUE_PURPOSES if q in names), *sorted(names - set(QUEUE_PURPOSES)))


def _default_state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "rhumbatron"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RHUMBATRON_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    # -- where things are --------------------------------------------------------------------------
    env: str = "dev"
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="where this host keeps its files: the local archive, the router's outbox, the "
        "rollup's data, pid and token files (a relative archive_dir, router_outbox_path or "
        "analytics_rollup_dir is under it). Default: $XDG_STATE_HOME/rhumbatron, else "
        "~/.local/state/rhumbatron — never the working directory; `make demo` and `make test` "
        "use the checkout's .local",
    )
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="host:port[,host:port ...]")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="redis://[user:password@]host[:port]/db, rediss://... (TLS) or unix://path; "
        "a secret when it holds a password: shown masked (user:****@host) everywhere",
    )
    redis_username: str | None = Field(
        None, description="the ACL user Redis logs in as; wins over a user in redis_url"
    )
    redis_password: SecretStr | None = Field(
        None, description="the password Redis logs in with; wins over one in redis_url"
    )
    redis_ssl_ca_file: str | None = Field(
        None,
        description="rediss:// only: the CA bundle (PEM) the server's certificate is checked "
        "against; unset: the system's CAs",
    )
    redis_ssl_cert_file: str | None = Field(
        None,
        description="rediss:// only: a client certificate (PEM), for a server that asks for one",
    )
    redis_ssl_key_file: str | None = Field(
        None, description="rediss:// only: the client certificate's key (PEM), when it is apart"
    )
    redis_cluster: str | None = Field(
        None,
        description="host:port[,host:port ...]: seed nodes of a Redis Cluster; when set, the "
        "runtime, the workers and every store use it (redis.cluster.RedisCluster) instead of "
        "redis_url's host and port (the login and TLS settings still apply). Every key of one "
        "(subscription, partition) shares a hash tag, so a partition's commit is one slot",
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="replicas that must acknowledge every store commit (Redis WAIT, on the "
        "primary that holds the commit's keys) before it counts as done; fewer within "
        "redis_wait_timeout_ms fails the commit, which is retried. 0: no WAIT (asynchronous "
        "replication: a failover may lose the last acknowledged commits, see docs/operations.md)",
    )
    redis_wait_timeout_ms: int = Field(
        1000,
        gt=0,
        le=60_000,
        description="how long a commit waits for redis_wait_replicas acknowledgements",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="bound on reaching Kafka or Redis")
    flush_timeout_s: float = Field(
        30.0,
        gt=0,
        description="bound on a producer's flush of a few records (dead letters, retries, the "
        "router's commands, the demo's drill); also the margin past the transaction timeout "
        "within which the router's queues must be read to their end",
    )

    # -- how Kafka is reached: security (docs/kafka-security.md) -----------------------------------
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="librdkafka's security.protocol"
    )
    kafka_sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None
    ) = Field(
        None,
        description="SASL_* only: sasl.mechanism. PLAIN and SCRAM-SHA-256/512 are tested; "
        "OAUTHBEARER (OIDC client credentials, kafka_oauth_*) is configuration only, untested",
    )
    kafka_sasl_username: str | None = Field(None, description="PLAIN/SCRAM: the user")
    kafka_sasl_password: SecretStr | None = Field(None, description="PLAIN/SCRAM: the password")
    kafka_ssl_ca_file: str | None = Field(
        None,
        description="SSL/SASL_SSL: the CA bundle (PEM) the brokers' certificates are checked "
        "against; unset: the system's CAs",
    )
    kafka_ssl_cert_file: str | None = Field(
        None, description="SSL/SASL_SSL: a client certificate (PEM), for brokers that ask for one"
    )
    kafka_ssl_key_file: str | None = Field(
        None, description="SSL/SASL_SSL: the client certificate's key (PEM)"
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        None, description="SSL/SASL_SSL: the password of an encrypted client key"
    )
    kafka_ssl_endpoint_identification: bool = Field(
        True,
        description="SSL/SASL_SSL: check the broker's certificate names the host it was reached "
        "at (ssl.endpoint.identification.algorithm https); false only for a test CA without names",
    )
    kafka_oauth_token_url: str | None = Field(
        None,
        pattern=r"^https?://[^/\s]+",
        description="OAUTHBEARER: the OIDC token endpoint (sasl.oauthbearer.token.endpoint.url)",
    )
    kafka_oauth_client_id: str | None = Field(None, description="OAUTHBEARER: the client id")
    kafka_oauth_client_secret: SecretStr | None = Field(
        None, description="OAUTHBEARER: the client secret"
    )
    kafka_oauth_scope: str | None = Field(None, description="OAUTHBEARER: the scope asked for")
    kafka: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="any other librdkafka property, for every client: RHUMBATRON_KAFKA__<PROPERTY> "
        "with __ for its dots (RHUMBATRON_KAFKA__SOCKET__KEEPALIVE__ENABLE=true), or a JSON "
        "object in RHUMBATRON_KAFKA. It wins over Rhumbatron's own tuning defaults (linger.ms, "
        "compression.type ...); the properties its guarantees rest on, and those set by the "
        "kafka_* settings above, are refused. Values are kept as secrets (never shown)",
    )

    # -- topology (docs/architecture.md) -----------------------------------------------------------
    streams: int = Field(
        8, ge=1, description="event streams per environment (part of the wire contract)"
    )
    partitions: int = Field(4, ge=1, description="partitions per event stream")
    replication_factor: int = Field(1, ge=1)
    # Kafka's retention.ms also takes -1 (forever), but claims live the stream's retention plus a
    # margin (claim_ttl_ms), so a stream here always has a finite one.
    stream_retention_ms: int = Field(7 * DAY_MS, ge=1)
    queue_retention_ms: int = Field(1 * DAY_MS, ge=1)
    queue_partitions: int = Field(4, ge=1)
    dead_letter_retention_ms: int = Field(30 * DAY_MS, ge=1)
    max_streams_per_env: int = Field(20, ge=1, le=100, description="stream indexes are 00-99")

    # -- envelopes (docs/events.md) ----------------------------------------------------------------
    max_envelope_bytes: int = Field(
        256 * 1024, ge=1024, le=1_000_000_000, description="librdkafka's message.max.bytes cap"
    )

    # -- outbox and publisher (docs/outbox.md) -----------------------------------------------------
    outbox_rows_per_project_per_pass: int = Field(100, ge=1)
    outbox_max_row_attempts: int = Field(10, ge=1)
    outbox_backoff_initial_s: float = Field(1.0, gt=0)
    outbox_backoff_max_s: float = Field(300.0, gt=0)
    outbox_poll_interval_s: float = Field(
        0.5, gt=0, description="longest the publisher waits between passes over an idle outbox"
    )
    outbox_poll_min_interval_s: float = Field(
        0.005,
        gt=0,
        le=60,
        description="the publisher's wait after a pass that sent rows: each idle pass doubles "
        "it up to outbox_poll_interval_s, so a steady stream of writes from other processes is "
        "picked up within a few milliseconds and an idle outbox is polled as before; at most "
        "outbox_poll_interval_s",
    )
    outbox_ordering: Literal["serial", "pipelined"] = Field(
        "pipelined",
        description="per-project order on Kafka: one row in flight per project (serial), or a "
        "project's whole window under the gapless guarantee (pipelined); docs/outbox.md",
    )
    outbox_delivery_timeout_s: float = Field(
        30.0, gt=0, description="a record unacknowledged this long means Kafka is unavailable"
    )
    outbox_linger_ms: float = Field(
        1.0,
        ge=0,
        le=900_000,  # librdkafka's range for linger.ms
        description="the publisher producer's linger.ms: serial ordering waits on every "
        "acknowledgement, so a short linger pays (measured in docs/outbox.md)",
    )
    outbox_rows_per_pass: int = Field(
        20_000, ge=1, description="cap on one publisher pass over all projects (memory bound)"
    )
    outbox_missed_report_limit: int = Field(
        1000, ge=0, description="most missed events an append reports back (bump-and-report)"
    )
    outbox_busy_timeout_s: float = Field(
        30.0, gt=0, description="how long an outbox write queues for the SQLite write lock"
    )
    outbox_sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        "FULL", description="FULL: a commit survives power loss; NORMAL: a process crash only"
    )
    outbox_stats_row_limit: int = Field(
        100, ge=1, description="failed rows and held projects listed by outbox stats"
    )
    outbox_postgres_pool_size: int = Field(
        8,
        ge=1,
        description="PostgreSQL outbox: most pooled connections of one process (its writers "
        "and its publisher's passes; the publisher's lease and listener have their own)",
    )
    outbox_postgres_keepalive_s: float = Field(
        10.0,
        gt=0,
        description="PostgreSQL outbox: TCP keepalive idle and interval of every connection, so "
        "a silent server (a network partition) is noticed within about three times this",
    )
    outbox_postgres_listen_tick_s: float = Field(
        0.25,
        gt=0,
        description="PostgreSQL outbox: how often the publisher's LISTEN thread looks up from "
        "its wait for commits (to check the lease and to stop)",
    )
    publisher_standby_poll_s: float = Field(
        2.0,
        ge=0.05,
        le=300,
        description="a `rhumbatron publish` that finds its outbox's publisher lease held stands "
        "by (ready, not publishing) and tries the lease again this often; it takes over within "
        "about this long of the holder going (docs/outbox.md)",
    )
    progress_interval_s: float = Field(
        5.0,
        gt=0,
        validation_alias=AliasChoices(
            "progress_interval_s",
            "rhumbatron_progress_interval_s",
            "rhumbatron_outbox_progress_interval_s",
        ),
        description="how often a long-running command (consume, worker, dead-letter-consumer, "
        "publish, re-reduce, archive sweeps) prints its progress; the old name "
        "RHUMBATRON_OUTBOX_PROGRESS_INTERVAL_S still works",
    )
    produce_writers: int = Field(
        4, ge=1, description="concurrent writer threads of produce --outbox and the demo"
    )
    produce_events_per_write: int = Field(
        5, ge=1, description="events one synthetic writer transaction appends"
    )
    produce_flush_timeout_s: float = Field(
        60.0,
        gt=0,
        description="bound on flushing a synthetic workload `produce` sends straight to the "
        "streams (all of it, 10,000 events in the demo)",
    )
    demo_idle_s: float = Field(
        10.0,
        gt=0,
        description="the demo stops reading the streams after this long with nothing new",
    )
    demo_max_wait_s: float = Field(
        300.0, gt=0, description="longest the demo reads the streams back before it reports"
    )
    demo_beat_interval_s: float = Field(
        1.0,
        gt=0,
        description="how often the demo, waiting on its child processes, beats its own /healthz "
        "(keep it well under health_stale_s)",
    )
    group_join_timeout_s: float = Field(
        30.0,
        gt=0,
        description="how long past its idle bound a reader of the streams (the demo) may wait "
        "for its first partitions before Kafka is reported unreachable",
    )

    # -- subscription runtime (docs/guarantees.md) -------------------------------------------------
    batch_size: int = Field(500, ge=1, description="records per poll of a subscription")
    batch_size_behind: int = Field(
        5_000,
        ge=1,
        le=50_000,
        description="records per poll of a subscription while it is behind (its last poll "
        "brought a full batch_size): fewer, larger store round trips to catch up; at least "
        "batch_size",
    )
    fold_cache_projects: int = Field(
        2_000,
        ge=1,
        le=10_000_000,
        description="projects' folds a subscription process keeps in memory between polls, over "
        "all its partitions (each partition an equal share; those written longest ago go first "
        "and are read back from Redis by a later event): bounds a reducing subscription's memory "
        "whatever the number of projects (a causal-router fold at its history bound is ~150 KB "
        "in memory)",
    )
    fold_cache_kbytes: int = Field(
        8_192,
        ge=0,
        le=16_777_216,
        description="KB of folds (their encoded size, as written to Redis) a subscription process "
        "keeps in memory between polls, over all its partitions (each partition an equal share; "
        "those written longest ago go first and are read back from Redis by a later event; 0: "
        "no bound but fold_cache_projects): bounds memory where folds are large, as the causal "
        "router's are (~40 KB encoded, ~150 KB in memory at its history bound), while keeping "
        "many small ones",
    )
    consumer_prefetch_kbytes: int = Field(
        2_048,
        ge=64,
        le=2_097_151,
        description="KB of records a subscription's or worker's consumer fetches ahead of its "
        "polls (librdkafka's queued.max.messages.kbytes, counted as fetched, compressed; at its "
        "own default, 65,536, a ledger peaked at 382 MB over 500,000 events, at 2,048 at 109 MB, "
        "as fast with consumer_fetch_backoff_ms at 10)",
    )
    consumer_fetch_backoff_ms: int = Field(
        10,
        ge=0,
        le=300_000,
        description="ms a consumer waits before fetching a partition again once its prefetch is "
        "full (librdkafka's fetch.queue.backoff.ms; at its own default, 1,000, a consumer with a "
        "small prefetch idled between fetches)",
    )
    max_batch_failures: int = Field(5, ge=1, description="failures of a batch before dead-letter")
    parked_projects_max: int = Field(
        1_000,
        ge=1,
        le=1_000_000,
        description="projects one partition of a subscription may hold parked (an event of "
        "theirs is of a version newer than the subscription's code knows; each costs one small "
        "entry in the partition's cursor, however many of its events wait): past it the "
        "partition stops at the event that would park one more, retried after a backoff and "
        "logged as an error, until the consumer is upgraded or this is raised",
    )
    parked_drain_records: int = Field(
        50_000,
        ge=1,
        le=10_000_000,
        description="records of a partition an upgraded consumer re-reads per loop turn to "
        "apply the events its parked projects hold back (then it polls, and goes on the next "
        "turn): bounds how long one turn keeps the consumer from polling",
    )
    batch_retry_backoff_s: float = Field(1.0, gt=0)
    batch_retry_backoff_max_s: float = Field(60.0, gt=0)
    claim_retention_margin_ms: int = Field(
        1 * DAY_MS,
        ge=0,
        description="claims are kept the stream's retention plus this (see claim_ttl_ms)",
    )
    claim_buckets: int = Field(
        1024,
        ge=1,
        le=65_536,
        description="small Redis hashes each partition's claims of one day are spread over; "
        "each stays compact (a listpack, about 23 bytes a claim) up to Redis's "
        "hash-max-listpack-entries (512 by default) claims, so the default keeps 10,000 to about "
        "400,000 events a partition a day under 32 bytes a claim; past that claims stay correct "
        "but more of the hashes turn into hashtables (more bytes a claim: raise it), below it "
        "the keys themselves weigh more per claim",
    )
    claim_project_buckets: int = Field(
        4,
        ge=1,
        le=65_536,
        description="small Redis hashes a partition's slot claims are spread over, per outbox "
        "and cursor revision (outbox events: one record a project, its base slot, about 25 "
        "bytes plus its id in a compact hash); each stays compact (a listpack) up to Redis's "
        "hash-max-listpack-entries projects (512 by default), so the default keeps up to about "
        "2,000 projects a partition compact: above that raise it to the projects a partition "
        "holds divided by 256; each hash also costs its key, about 150 bytes",
    )
    claim_gap_horizon: int = Field(
        1_000,
        ge=8,
        le=1_000_000,
        description="slots a project's slot claims handle past a gap (a row still parked in "
        "its outbox, or a reprocess) before the gap is recorded as missing and the record "
        "shrinks back: a gap keeps a 4-byte fingerprint for each slot handled past it until "
        "then; a late event inside a missing gap is still applied",
    )
    batch_failure_ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        description="how long a batch's failure count is kept after its last failure; past it "
        "the count starts again from zero",
    )
    group_protocol: str = Field("classic", pattern="^(classic|consumer)$")
    # librdkafka's ranges; the consumer's heartbeat is max(session/5, 500 ms) and must stay below
    # the session timeout, hence the floor of 1 s.
    session_timeout_ms: int = Field(10_000, ge=1000, le=3_600_000)
    max_poll_interval_ms: int = Field(300_000, ge=1, le=86_400_000)
    control_check_interval_s: float = Field(1.0, ge=0, description="0: check every batch")
    # Longer than any single blocking call of the loop (broker calls are bounded at 10 s, a
    # transaction's commit at 30 s), so only a truly stalled process loses its producer lease.
    producer_lease_ttl_s: int = Field(
        60,
        ge=1,
        validation_alias=AliasChoices(
            "producer_lease_ttl_s",
            "rhumbatron_producer_lease_ttl_s",
            "rhumbatron_worker_slot_ttl_s",
        ),
        description="seconds a process's producer lease (the number in its transactional id) "
        "lives without renewal; RHUMBATRON_PRODUCER_LEASE_TTL_S, or the old name "
        "RHUMBATRON_WORKER_SLOT_TTL_S, which still works",
    )
    transaction_timeout_ms: int = Field(
        30_000,
        ge=1000,
        le=2_147_483_647,
        description="librdkafka's range; the broker caps it at its transaction.max.timeout.ms",
    )
    recovery_search_margin_s: float = Field(
        60.0,
        ge=0,
        description="when a pending copy's transaction marker is gone, how far before the "
        "copy's store time recovery reads its output topics (clock skew between hosts)",
    )
    # slug -> "dead-letter" (default) or "block" (retry forever; skip_through the only escape)
    failure_policies: dict[str, Literal["dead-letter", "block"]] = Field(default_factory=dict)
    # -- subscriptions of your own (docs/processors.md) --------------------------------------------
    subscriptions: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="[subscriptions.<slug>]: one subscription's table — `processor` (a "
        "package.module:attr, or the name of an installed subscription; default: the slug), "
        "`database` (a SQL-effect subscription's PostgreSQL), and the keys its own settings "
        "model reads; RHUMBATRON_SUBSCRIPTIONS__<SLUG>__<KEY>",
    )

    # -- the four subscriptions (docs/router.md) ---------------------------------------------------
    project_feed_length: int = Field(50, ge=1)
    classifier_calls_per_day: int = Field(200, ge=0, description="0: the local heuristic only")
    classifier_threshold: float = Field(0.7, ge=0, le=1)
    classifier_url: str | None = Field(None, pattern=r"^https?://[^/\s]+")
    classifier_key: SecretStr | None = None
    classifier_timeout_s: float = Field(2.0, gt=0)
    agents_per_change: int = Field(
        8,
        ge=1,
        description="agent slots per change: the most tasks of one change in flight (dispatched "
        "or started) at once; the causal router holds the rest until a task frees its agent slot",
    )
    commands_per_change_per_day: int = Field(1000, ge=1)
    maintenance_at_utc: str = Field("04:17", description="HH:MM, 00:00 to 23:59, in UTC")
    archive_dir: str = Field(
        "archive", min_length=1, description="the local archive (relative: under state_dir)"
    )
    archive_part_max_events: int = Field(5000, ge=1)
    archive_part_max_bytes: int = Field(8 * 1024 * 1024, ge=1)
    archive_part_max_age_s: float = Field(60.0, gt=0)
    archive_retention_days_dev: int = Field(30, ge=1)
    archive_retention_days_prod: int = Field(365, ge=1)

    # -- project-view-projector --------------------------------------------------------------------
    project_view_missing_cap: int = Field(
        1000,
        ge=1,
        description="most missing slots a project's view records; past it the view says "
        "missingOverflow instead of growing",
    )

    # -- audit-archiver ----------------------------------------------------------------------------
    archive_store: Literal["local", "s3", "none"] = Field(
        "local",
        description="where archive parts go: a local directory (archive_dir/<env>), an "
        "S3-compatible bucket (archive_s3_*; pip install 'rhumbatron[s3]'), or none (no archive: "
        "the audit-archiver refuses to start and replays cannot reach past the stream)",
    )
    archive_gzip_level: int = Field(6, ge=1, le=9, description="gzip level of archive parts")
    archive_s3_endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^/\s]+",
        description="S3-compatible endpoint URL; None: AWS's own",
    )
    archive_s3_bucket: str | None = None
    archive_s3_prefix: str = Field(
        "", description="key prefix in the bucket; the environment's name is appended"
    )
    archive_s3_region: str = "us-east-1"
    archive_s3_access_key: SecretStr | None = None
    archive_s3_secret_key: SecretStr | None = None
    archive_progress_step_pct: int = Field(
        10, ge=1, le=100, description="archive expire/verify print progress every this many %"
    )

    # -- causal-router -----------------------------------------------------------------------------
    command_ttl_s: float = Field(
        3600.0, gt=0, description="validity of a router command: deadline = created_at + this"
    )
    router_outbox_path: str = Field(
        "outbox-{env}.sqlite",
        min_length=1,
        description="the outbox the router writes its decisions to (candidate.stale), published "
        "by a thread of its consume process: a SQLite file, or a postgresql:// URL (a secret, "
        "shown masked) when the writers' outbox is on PostgreSQL; {env} stands for the "
        "environment's name; a relative path is under state_dir. Default: "
        "the environment's outbox, which the demo's writers use too, so each project's slots "
        "stay one dense sequence (slots are allocated per outbox)",
    )
    router_publish_outbox: bool = Field(
        True,
        description="the causal router's consume process publishes its outbox "
        "(router_outbox_path); the fleet turns it off when a publisher member publishes the "
        "same outbox (the maintenance tick runs either way)",
    )
    router_fold_history: int = Field(
        50, ge=1, description="finished changes and retired candidates one project's fold keeps"
    )
    router_max_resources_per_event: int = Field(
        1000, ge=1, description="resource paths one event may name; more is refused as invalid"
    )
    router_counter_ttl_s: int = Field(
        2 * 86_400, ge=86_400, description="lifetime of a per-day cap counter (outlives its day)"
    )
    classifier_max_answer_bytes: int = Field(
        64 * 1024, ge=64, description="largest classifier answer read; a bigger one is an error"
    )
    maintenance_enabled: bool = Field(
        True, description="whether this router process runs the daily maintenance tick"
    )
    maintenance_commands_per_tick: int = Field(
        500, ge=1, description="most commands (sweep, cleanup, purge) one maintenance tick sends"
    )
    maintenance_check_interval_s: float = Field(
        30.0, gt=0, description="how often a router process checks whether the tick is due"
    )
    maintenance_lock_ttl_s: int = Field(
        3600, ge=1, description="how long a started tick keeps other processes from repeating it"
    )

    # -- analytics ---------------------------------------------------------------------------------
    metrics_retention_ms: int = Field(
        30 * DAY_MS, ge=1, description="retention of the metric points topic (its own dataset)"
    )
    analytics_window_s: int = Field(
        60, ge=1, description="the rollup's tumbling window (per-minute by default)"
    )
    analytics_window_retention_s: int = Field(
        7 * 86_400,
        ge=60,
        description="how long the rollup keeps a window (by wall-clock time) before it expires",
    )
    analytics_rollup_guarantee: Literal["exactly_once", "at_least_once"] = Field(
        "exactly_once",
        description="faust's processing guarantee for the rollup; at_least_once also reads "
        "uncommitted points (docs/analytics.md)",
    )
    analytics_rollup_host: str = Field(
        "127.0.0.1", min_length=1, description="the rollup's web view address"
    )
    analytics_rollup_port: int = Field(6067, ge=1, le=65535, description="the rollup's web port")
    analytics_rollup_dir: str = Field(
        "analytics",
        description="the rollup worker's data directory, one per env below it (relative: under "
        "state_dir)",
    )
    analytics_rollup_producer_buffer: int = Field(
        100,
        ge=100,
        le=1000,
        description="table changes the rollup may hold for its producer before it holds back "
        "points until they are sent and logs 'producer buffer full' (faust's producer buffer; "
        "docs/analytics.md says what raising it costs)",
    )
    analytics_query_timeout_s: float = Field(
        5.0, gt=0, description="bound on one request of `rhumbatron analytics` to the rollup"
    )
    analytics_count_timeout_s: float = Field(
        30.0, gt=0, description="bound on reading the points topic to count its points"
    )

    # -- command queues (docs/queues.md) -----------------------------------------------------------
    queues: dict[str, QueuePolicy] = Field(
        default_factory=_queue_policies,
        description="each queue's policy; what is given is merged onto the defaults (see the "
        "module docstring for the RHUMBATRON_QUEUES__<QUEUE>__<FIELD> form); a name that is no "
        "built-in queue adds a queue of your own (docs/queues.md)",
    )
    max_command_deliveries: int = Field(4, ge=1)
    http_handler_secrets: SecretStr | None = Field(
        None,
        description="the signing secrets of HTTP handlers (rhumbatron worker --http), "
        "space-separated, each whsec_ and base64 (Standard Webhooks); every one signs, so a "
        "rotation adds the new secret, then removes the old once receivers have it",
    )
    http_handler_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="the longest an HTTP handler's request may take"
    )
    http_handler_ca_file: str | None = Field(
        None, description="CA bundle to verify HTTP handlers' TLS certificates (unset: system's)"
    )
    http_handler_cert_file: str | None = Field(
        None, description="client certificate (PEM) presented to HTTP handlers, for mutual TLS"
    )
    http_handler_key_file: str | None = Field(
        None, description="the client certificate's key (PEM)"
    )
    http_handler_max_response_bytes: int = Field(
        1_048_576,
        ge=1024,
        le=64 * 1_048_576,
        description="the largest reply body an HTTP handler may send (past it: a failed attempt)",
    )
    http_handler_max_connections: int = Field(
        64, ge=1, le=10_000, description="pooled connections per HTTP handler"
    )
    max_abandoned_handlers: int = Field(
        4,
        ge=1,
        le=1000,
        description="timed-out handlers (handler_timeout_s) still running in one worker "
        "process before it exits for its supervisor to restart it (a thread cannot be stopped)",
    )
    retry_tiers_s: list[int] = Field(
        default_factory=lambda: [60, 600, 3600],
        max_length=8,
        description="the delays of each queue's retry tiers (whole seconds, ascending): a "
        "handler's Retry(delay_s=...) waits on the first tier at or above its delay (the queue's "
        "own retry delay is the tier below them all); each tier is a retry topic of its own",
    )
    max_retry_delay_s: float = Field(
        3600.0,
        ge=0,
        le=7 * 86_400,
        description="the longest wait a handler's Retry(delay_s=...) gets (the tiers above it "
        "are not used for it)",
    )

    # -- command workers ---------------------------------------------------------------------------
    worker_poll_interval_s: float = Field(
        0.5, gt=0, description="longest a command worker waits in one poll when nothing is due"
    )
    worker_transaction_max_commands: int = Field(
        500,
        ge=1,
        le=100_000,
        description="most commands a command worker settles in one Kafka transaction: it keeps "
        "handling chunks of the queue's batch and commits when it holds this many, when "
        "worker_transaction_max_ms has passed since its first chunk, or when a poll brings "
        "nothing more (a transaction holds at least one whole chunk)",
    )
    worker_transaction_max_ms: int = Field(
        100,
        ge=1,
        le=60_000,
        description="longest a command worker holds settled commands before committing their "
        "transaction (their retries, dead letters and offsets become visible then)",
    )
    command_dedupe_margin_ms: int = Field(
        DAY_MS,
        ge=0,
        description="a completed command id is remembered for the queue retention plus this",
    )
    command_error_max_bytes: int = Field(
        1000,
        ge=64,
        description="longest error text carried in a retry or dead-letter header (a retried "
        "command's error header, a dead letter's on the dead-letter topic)",
    )
    workflow_instance_ttl_s: int = Field(
        30 * 86_400, ge=60, description="how long the workflow-instance registry keeps an instance"
    )
    dead_letter_record_max_bytes: int = Field(
        900_000,
        ge=16 * 1024,
        description="largest record the dead-letter store writes on its topic; an entry that "
        "would be larger (a record a producer not ours wrote near the broker's limit) goes there "
        "without its value and headers, which the letter's Redis index keeps whole. Below the "
        "producer's message.max.bytes (librdkafka's default 1,000,000)",
    )
    dead_letter_tenant_id: str = Field(
        "tenant-default",
        description="tenant of the task.blocked / task.failed events the dead-letter consumer "
        "writes when the command's payload names no tenantId (commands carry no tenant)",
    )

    # -- feed pump (docs/pump.md) ------------------------------------------------------------------
    pump_batch_max_events: int = Field(
        100, ge=1, le=10_000, description="most events in one batch (one Kafka transaction)"
    )
    pump_batch_max_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="most envelope bytes in one batch; at least max_envelope_bytes",
    )
    pump_page_size: int = Field(
        500, ge=1, le=100_000, description="most lines the pump asks the feed for at once"
    )
    pump_page_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="most bytes of one page the pump reads before it stops (a feed answering "
        "more is misconfigured)",
    )
    pump_poll_interval_s: float = Field(
        5.0, gt=0, description="how long a long-running pump waits once caught up"
    )
    pump_request_timeout_s: float = Field(
        30.0, gt=0, description="how long one feed request may take"
    )
    pump_backoff_s: float = Field(
        1.0, gt=0, description="first wait after a transient feed or Kafka failure (doubling)"
    )
    pump_backoff_max_s: float = Field(
        60.0, gt=0, description="longest wait between tries after transient failures"
    )
    pump_legacy_key: str = Field(
        "last_sequence",
        min_length=1,
        description="the Redis key an earlier pump kept its bare sequence under (migrated "
        "only with an attested corpus id and lineage: docs/pump.md)",
    )

    # -- the fleet (rhumbatron fleet: docs/operations.md) ------------------------------------------
    fleet_subscriptions: dict[str, int] = Field(
        default_factory=lambda: {
            "project-view-projector": 1,
            "causal-router": 1,
            "audit-archiver": 1,
            "analytics-projector": 1,
            "ledger": 0,
        },
        description="processes the fleet runs per subscription (0: none); at most the "
        "subscription's partitions, as a process past them would own none",
    )
    fleet_workers: dict[str, str | WorkerTarget] = Field(
        default_factory=dict,
        description="queue purpose -> what its command workers run: a handler as rhumbatron "
        "worker --handler takes it (package.module:attr, or an installed handler's name), an "
        "http(s):// URL to POST each command to (rhumbatron worker --http), or "
        "{handler = ...} / {http = ..., http_secrets = ...} (that queue's own signing secrets); "
        "a queue not named has no workers in the fleet",
    )
    fleet_worker_processes: int = Field(
        1, ge=1, le=64, description="worker processes the fleet runs per queue it names"
    )
    fleet_outboxes: list[str] = Field(
        default_factory=list,
        description="outboxes the fleet runs a publisher for (SQLite paths or postgresql:// "
        "URLs); --outbox adds to them",
    )
    fleet_feed: str | None = Field(
        None, description="the upstream feed's URL: the fleet runs its pump; unset: no pump"
    )
    fleet_operator_server: bool = Field(True, description="the fleet runs rhumbatron serve")
    fleet_dead_letter_consumer: bool = Field(
        True, description="the fleet runs the dead-letter consumer"
    )
    fleet_analytics_rollup: bool = Field(
        True, description="the fleet runs the faust analytics rollup"
    )
    fleet_restart_backoff_s: float = Field(
        1.0, gt=0, description="wait before a crashed member's first restart (doubling)"
    )
    fleet_restart_backoff_max_s: float = Field(
        30.0, gt=0, description="longest wait before restarting a crashed member"
    )
    fleet_max_restarts: int = Field(
        5,
        ge=0,
        le=1000,
        description="restarts of one member within fleet_restart_window_s before the fleet "
        "gives up on it: it stops every member and exits 1",
    )
    fleet_restart_window_s: float = Field(
        600.0, gt=0, description="the window fleet_max_restarts counts a member's restarts in"
    )
    fleet_stop_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="how long the fleet waits for its members to stop after SIGTERM (each "
        "finishes its batch, commits, closes its parts, leaves its group) before it kills "
        "the rest",
    )
    fleet_instance_held_wait_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="static membership under group_protocol 'consumer': the wait before "
        "starting again a member whose group.instance.id the group still holds for its killed "
        "predecessor (it exits 75); such restarts do not count in fleet_max_restarts",
    )
    fleet_instance_held_max_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="how long a member's group.instance.id may stay held (each restart "
        "refused) before the fleet gives up on it, as on a crashing member",
    )
    fleet_metrics_port_base: int | None = Field(
        None,
        ge=1,
        le=65000,
        description="the fleet's members' /metrics, /healthz and /readyz ports: the first "
        "member listens on this port, the next on the one after, ...; unset: none",
    )
    fleet_static_membership: bool = Field(
        False,
        description="each subscription and worker process of the fleet is a static group member "
        "(group_instance_id: fleet_instance_prefix and its name): restarted within "
        "session_timeout_ms it gets its partitions back with no rebalance (docs/operations.md)",
    )
    fleet_instance_prefix: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="what starts the fleet's static member ids, unique per host of an "
        "environment (default: the host name)",
    )
    fleet_scale_lag: int = Field(
        10_000,
        ge=1,
        description="rhumbatron fleet manifests: the consumer-group lag per process at which "
        "a subscription's KEDA ScaledObject adds one (up to its partitions)",
    )
    fleet_keda: bool = Field(
        True,
        description="rhumbatron fleet manifests: a KEDA ScaledObject per subscription (and the "
        "TriggerAuthentication it logs in with); off: the replicas stay as fleet_subscriptions says",
    )
    fleet_pod_monitor: bool = Field(
        True,
        description="rhumbatron fleet manifests: a PodMonitor for the Prometheus Operator "
        "scraping every pod's /metrics (the pods carry prometheus.io/* annotations either way)",
    )
    fleet_pod_cpu_request: str = Field(
        "500m", pattern=_QUANTITY, description="rhumbatron fleet manifests: each pod's CPU request"
    )
    fleet_pod_memory_request: str = Field(
        "256Mi",
        pattern=_QUANTITY,
        description="rhumbatron fleet manifests: each pod's memory request",
    )
    fleet_pod_memory_limit: str = Field(
        "512Mi",
        pattern=_QUANTITY,
        description="rhumbatron fleet manifests: each pod's memory limit",
    )
    group_instance_id: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="this process's static membership id in its consumer group "
        "(group.instance.id), unique in the group; unset: a dynamic member",
    )
    process_name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="this process's name in its fleet (the fleet sets it): in its Kafka "
        "client.id, so the group's members name their processes",
    )

    # -- operator surface --------------------------------------------------------------------------
    operator_host: str = Field("127.0.0.1", min_length=1)
    operator_port: int = Field(8642, ge=0, le=65535, description="0: any free port")
    operator_token: SecretStr | None = Field(
        None, description="bearer token of every change (and of every read); unset: none allowed"
    )
    operator_read_token: SecretStr | None = Field(
        None,
        description="bearer token of the reads that return payloads (dead letters, failures, "
        "outboxes, lag, views); the operator token reads too. Unset: only the operator token reads",
    )
    operator_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header names the operator server answers (any port), against DNS "
        "rebinding, as JSON: '[\"ops.internal\"]'. Empty: operator_host, localhost, 127.0.0.1, "
        "[::1]",
    )
    # -- operator surface (issue 6) ----------------------------------------------------------------
    operator_outboxes: list[str] = Field(
        default_factory=list,
        description="outboxes the operator surface reports (states, failed rows, held "
        "projects): SQLite files or postgresql:// URLs (shown masked), as JSON: "
        'RHUMBATRON_OPERATOR_OUTBOXES=\'["a.sqlite","postgresql://app@db/orders"]\'. Empty: the '
        "router's outbox (router_outbox_path) and the fleet's (fleet_outboxes). A file that does not exist yet shows as absent",
    )
    operator_refresh_s: float = Field(
        3.0, gt=0, description="how often the operator page refreshes itself"
    )
    operator_page_size: int = Field(
        200, ge=1, description="most dead letters one listing returns (newest first)"
    )
    operator_stale_retry_s: float = Field(
        300.0,
        gt=0,
        description="a dead letter stuck in 'retrying' this long (its sender died) may be retried again",
    )
    state_rebuild_lock_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="how long one process holds the lock of the rebuild of the dead-letter "
        "index and the audit logs from the audit topic (docs/reliability.md: What survives Redis "
        "loss); a process that starts meanwhile waits this long at most, then rebuilds too "
        "(harmless: the rebuild is idempotent)",
    )
    operator_dead_letter_scan_limit: int = Field(
        10_000,
        ge=1,
        description="most dead letters a listing reads from the store before it filters them "
        "by kind, subscription or queue",
    )
    operator_recent_failures: int = Field(
        20, ge=1, description="dead letters, and failed outbox rows, the recent failures show"
    )
    operator_health_timeout_s: float = Field(
        3.0, gt=0, description="bound on one health probe of Kafka or of Redis"
    )
    operator_text_max_chars: int = Field(
        2000, ge=1, description="longest operator name or reason an action accepts"
    )
    # -- operator surface (issue 11): named operators, bulk actions --------------------------------
    operator_token_name: str = Field(
        "operator",
        description="the operator the audit log names for a change made with operator_token",
    )
    operator_tokens: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="more operators, each with a write token of their own, as JSON: "
        'RHUMBATRON_OPERATOR_TOKENS=\'{"alice": "<32+ characters>"}\'; the audit log names the '
        "operator whose token made the change. Each token at least 32 characters",
    )
    operator_bulk_limit: int = Field(
        1000, ge=1, description="most dead letters one bulk retry or dismiss acts on"
    )
    # -- every long-running process ----------------------------------------------------------------
    gc_young_threshold: int = Field(
        50_000,
        ge=100,
        le=10_000_000,
        description="allocations between collections of the Python cycle collector's youngest "
        "generation in a long-running process, which also freezes what it built at start-up "
        "(Python's default, 700, had a subscription collecting hundreds of times a second: a "
        "quarter to a third of its CPU); memory is freed by reference counting either way, "
        "only cyclic garbage waits for a collection",
    )
    # -- observability (issue 13, docs/observability.md): exporters come from the standard
    # -- OTEL_* variables; these are the parts OpenTelemetry has no variable for -------------------
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of traces sampled where a trace starts (the outbox writer, produce); "
        "every later span follows its parent. OTEL_TRACES_SAMPLER/OTEL_TRACES_SAMPLER_ARG win",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="port of a long-running process's own /metrics, /healthz and /readyz "
        "(0: any free port, printed at start); unset: no endpoint",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        min_length=1,
        pattern=r"^[A-Za-z0-9.:_-]+$",
        description="address the process's metrics endpoint listens on (a host name or an IP "
        "address, no scheme or port)",
    )
    probe_timeout_s: float = Field(
        3.0,
        gt=0,
        le=60,
        description="/readyz: how long each dependency check (a broker's metadata, a Redis "
        "PING) may take before the process counts as not ready",
    )
    health_stale_s: float = Field(
        60.0,
        gt=0,
        description="/healthz answers 503 once the process's main loop has not come round for "
        "this long",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: one readable line per record; json: one JSON object per line with "
        "trace and span ids, subscription, topic, partition and offset where they apply",
    )

    @field_validator("operator_token_name")
    @classmethod
    def _operator_name(cls, value: str) -> str:
        # It goes to every audit record of that operator's actions: a plain, short word.
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}", value):
            raise ValueError(
                f"an operator name is 1 to 64 letters, digits or . _ @ + - (starting with a "
                f"letter or digit), got {value[:80]!r}"
            )
        return value

    @field_validator("operator_tokens")
    @classmethod
    def _named_tokens(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, token in value.items():
            cls._operator_name(name)
            if not token.get_secret_value():
                raise ValueError(f"operator {name!r} has an empty token")
            try:
                cls._long_enough(token)
            except ValueError as exc:
                raise ValueError(f"operator {name!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _pump_batches_fit(self) -> Settings:
        if self.pump_batch_max_bytes < self.max_envelope_bytes:
            raise ValueError(
                f"RHUMBATRON_PUMP_BATCH_MAX_BYTES={self.pump_batch_max_bytes} is below "
                f"RHUMBATRON_MAX_ENVELOPE_BYTES={self.max_envelope_bytes}: a batch must hold "
                "the largest envelope"
            )
        if self.pump_backoff_max_s < self.pump_backoff_s:
            raise ValueError(
                f"RHUMBATRON_PUMP_BACKOFF_MAX_S={self.pump_backoff_max_s:g} is below "
                f"RHUMBATRON_PUMP_BACKOFF_S={self.pump_backoff_s:g}"
            )
        return self

    @model_validator(mode="after")
    def _handler_timeouts_fit(self) -> Settings:
        for purpose, queue in self.queues.items():
            timeout = queue.handler_timeout_s
            if timeout is not None and timeout * 1000 >= self.max_poll_interval_ms:
                raise ValueError(
                    f"RHUMBATRON_QUEUES__{_queue_variable(purpose)}__HANDLER_TIMEOUT_S={timeout:g} "
                    f"is not below RHUMBATRON_MAX_POLL_INTERVAL_MS={self.max_poll_interval_ms} "
                    "(ms): a handler that long would get the worker dropped from its group first"
                )
        return self

    @field_validator("http_handler_secrets")
    @classmethod
    def _webhook_secrets(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            webhook_keys(value.get_secret_value(), "")  # the error names the variable already
        return value

    @model_validator(mode="after")
    def _retry_tiers_ascend(self) -> Settings:
        tiers = self.retry_tiers_s
        if any(t < 1 for t in tiers) or any(a >= b for a, b in pairwise(tiers)):
            raise ValueError(
                f"RHUMBATRON_RETRY_TIERS_S={tiers}: each tier is a whole number of seconds >= 1, "
                "in ascending order with none twice (e.g. [60, 600, 3600])"
            )
        return self

    @model_validator(mode="after")
    def _operators_apart(self) -> Settings:
        # One token, one operator: the audit log names whoever holds the token that acted.
        if self.operator_token_name in self.operator_tokens:
            raise ValueError(
                f"operator {self.operator_token_name!r} is named twice: by "
                "RHUMBATRON_OPERATOR_TOKEN_NAME and in RHUMBATRON_OPERATOR_TOKENS; give each "
                "operator one name and one token"
            )
        named = [(self.operator_token_name, self.operator_token)]
        named += list(self.operator_tokens.items())
        named.append(("the read token", self.operator_read_token))
        seen: dict[str, str] = {}
        for name, token in named:
            secret = token.get_secret_value() if token is not None else ""
            if not secret:
                continue
            if secret in seen:
                raise ValueError(
                    f"{seen[secret]!r} and {name!r} have the same token; each operator (and "
                    "the read token) needs a token of its own"
                )
            seen[secret] = name
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: what the code passes, the environment, then the config file (if any).
        elsewhere = _ELSEWHERE.get()
        if elsewhere is not None:  # another host's settings: its file alone
            return (init_settings, ConfigFile(settings_cls, elsewhere))
        path = config_file()
        if path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, ConfigFile(settings_cls, path))

    # -- checks of a value's form, and across fields -----------------------------------------------
    @field_validator("env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        return check_env(value)

    @field_validator("operator_token", "operator_read_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        # Empty is the same as unset; anything shorter than this is guessable over HTTP.
        length = 0 if value is None else len(value.get_secret_value())
        if 0 < length < OPERATOR_TOKEN_MIN_CHARS:
            raise ValueError(
                f"a token must be at least {OPERATOR_TOKEN_MIN_CHARS} characters, got {length}; "
                "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        # A relative state dir would depend on the working directory, which is what it is for
        # avoiding: it is made absolute once, here, from where the settings were read.
        return value.expanduser().absolute()

    @field_validator("maintenance_at_utc")
    @classmethod
    def _time_of_day(cls, value: str) -> str:
        if not _TIME_OF_DAY.match(value):
            raise ValueError("expected a time of day HH:MM, 00:00 to 23:59")
        return value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _brokers(cls, value: str) -> str:
        for broker in value.split(","):
            found = _BROKER.match(broker.strip())
            if found is None or not 0 < int(found.group(1)) <= 65535:
                raise ValueError(
                    f"expected host:port[,host:port ...] with ports 1-65535, got {broker!r}"
                )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        url = urlsplit(value)
        if url.scheme not in _REDIS_SCHEMES:
            raise ValueError(
                f"expected a URL with scheme {', '.join(_REDIS_SCHEMES)} "
                "(redis://host[:port]/db, rediss://..., unix:///path)"
            )
        try:
            url.port  # noqa: B018 -- a port that is not a number raises only when read
        except ValueError as exc:
            raise ValueError(f"expected a port of 0-65535: {exc}") from None
        if url.scheme == "unix" and not url.path:
            raise ValueError("expected unix:///path/to/redis.sock")
        if url.scheme != "unix" and not url.hostname:
            raise ValueError(f"expected a host: {url.scheme}://host[:port]/db")
        return value

    @field_validator("redis_cluster")
    @classmethod
    def _redis_cluster(cls, value: str | None) -> str | None:
        if value is None:
            return None
        nodes = [n.strip() for n in value.split(",")]
        for node in nodes:
            host, _, port = node.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(
                    f"expected host:port[,host:port ...] (the cluster's seed nodes) with ports "
                    f"1-65535, got {node!r}"
                )
        return ",".join(nodes)

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value  # librdkafka's names are

    @field_validator("kafka", mode="before")
    @classmethod
    def _pass_through(cls, value: Any) -> Any:
        """``RHUMBATRON_KAFKA__SOCKET__KEEPALIVE__ENABLE=true`` arrives nested
        (``{"socket": {"keepalive": {"enable": "true"}}}``): flattened back to librdkafka's
        dotted name. A property a setting owns, or one the guarantees rest on, is refused; so is
        one librdkafka does not know, or a value it refuses."""
        if not isinstance(value, dict):
            return value  # pydantic refuses it, saying what it expected
        flat: dict[str, str] = {}
        _flatten(value, "", flat)
        for prop in flat:
            if not _KAFKA_PROPERTY.match(prop):
                raise ValueError(f"{prop!r} is not a librdkafka property name")
            if prop in _OWNED_PROPERTIES:
                owner = _OWNED_PROPERTIES[prop]
                raise ValueError(f"{prop} is set by RHUMBATRON_{owner.upper()}; use that instead")
            if prop in GUARANTEED:
                raise ValueError(
                    f"{prop} is fixed by Rhumbatron (its delivery guarantees rest on it) and "
                    "cannot be passed through"
                )
        if flat:
            _librdkafka_accepts(flat)
        return flat

    @field_validator(
        "redis_ssl_ca_file",
        "redis_ssl_cert_file",
        "redis_ssl_key_file",
        "kafka_ssl_ca_file",
        "kafka_ssl_cert_file",
        "kafka_ssl_key_file",
    )
    @classmethod
    def _existing_file(cls, value: str | None) -> str | None:
        if value is not None and _ELSEWHERE.get() is None and not os.path.isfile(value):
            raise ValueError(f"no such file: {value!r}; give the path of a PEM file, or unset it")
        return value

    @model_validator(mode="after")
    def _redis_tls(self) -> Settings:
        given = [
            f"RHUMBATRON_{name.upper()}"
            for name in ("redis_ssl_ca_file", "redis_ssl_cert_file", "redis_ssl_key_file")
            if getattr(self, name) is not None
        ]
        if given and urlsplit(self.redis_url).scheme != "rediss":
            raise ValueError(
                f"{', '.join(given)} apply to TLS only, but RHUMBATRON_REDIS_URL="
                f"{masked(self.redis_url)} is not rediss://; use rediss://, or unset them"
            )
        if self.redis_ssl_key_file is not None and self.redis_ssl_cert_file is None:
            raise ValueError(
                "RHUMBATRON_REDIS_SSL_KEY_FILE is set without RHUMBATRON_REDIS_SSL_CERT_FILE: "
                "a key is only used with its certificate"
            )
        return self

    @model_validator(mode="after")
    def _kafka_security(self) -> Settings:
        protocol = self.kafka_security_protocol
        variable = f"RHUMBATRON_KAFKA_SECURITY_PROTOCOL={protocol}"

        def given(*names: str) -> list[str]:
            return [f"RHUMBATRON_{n.upper()}" for n in names if getattr(self, n) is not None]

        sasl = given("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password")
        oauth = given(
            "kafka_oauth_token_url",
            "kafka_oauth_client_id",
            "kafka_oauth_client_secret",
            "kafka_oauth_scope",
        )
        ssl = given(
            "kafka_ssl_ca_file",
            "kafka_ssl_cert_file",
            "kafka_ssl_key_file",
            "kafka_ssl_key_password",
        )
        if not protocol.startswith("SASL") and sasl + oauth:
            raise ValueError(
                f"{', '.join(sasl + oauth)} apply to SASL only, but {variable}; use SASL_SSL "
                "(or SASL_PLAINTEXT), or unset them"
            )
        if not protocol.endswith("SSL") and ssl:
            raise ValueError(
                f"{', '.join(ssl)} apply to TLS only, but {variable}; use SSL or SASL_SSL, or "
                "unset them"
            )
        mechanism = self.kafka_sasl_mechanism
        if protocol.startswith("SASL") and mechanism is None:
            raise ValueError(
                f"{variable} needs RHUMBATRON_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256, "
                "SCRAM-SHA-512 or OAUTHBEARER)"
            )
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            missing = [
                f"RHUMBATRON_{n.upper()}"
                for n in ("kafka_sasl_username", "kafka_sasl_password")
                # another host's password is in its Secret, not in its settings file
                if getattr(self, n) is None
                and not (n == "kafka_sasl_password" and _ELSEWHERE.get() is not None)
            ]
            if missing:
                raise ValueError(f"SASL {mechanism} needs {' and '.join(missing)}")
            if oauth:
                raise ValueError(f"{', '.join(oauth)} apply to OAUTHBEARER only, not {mechanism}")
        if mechanism == "OAUTHBEARER":
            missing = [
                f"RHUMBATRON_{n.upper()}"
                for n in (
                    "kafka_oauth_token_url",
                    "kafka_oauth_client_id",
                    "kafka_oauth_client_secret",
                )
                if getattr(self, n) is None
            ]
            if missing:
                raise ValueError(f"SASL OAUTHBEARER (OIDC) needs {', '.join(missing)}")
        if self.kafka_ssl_key_file is not None and self.kafka_ssl_cert_file is None:
            raise ValueError(
                "RHUMBATRON_KAFKA_SSL_KEY_FILE is set without RHUMBATRON_KAFKA_SSL_CERT_FILE: "
                "a key is only used with its certificate"
            )
        return self

    @field_validator("queues", mode="before")
    @classmethod
    def _merge_queues(cls, value: Any) -> Any:
        """What is given for a queue is laid over that queue's default policy, so one field
        (``RHUMBATRON_QUEUES__INTEGRATION__RETRIES=5``) changes that field alone; a name that is
        not a built-in queue is a queue of the settings' own, laid over
        :func:`_new_queue_policy`. Names arrive lower-cased, with ``_`` for ``-``, from a
        variable's name, and are read that way from anywhere: one queue has one name. A name
        streams.topology.check_queue refuses is refused, as is a dead_letter that names no
        queue."""
        if not isinstance(value, dict):
            return value  # pydantic refuses it, saying what it expected
        merged: dict[str, Any] = dict(_queue_policies())
        spelt: dict[str, str] = {}  # each queue given, as it was given (the refusals quote it)
        for name, given in value.items():
            purpose = str(name).lower().replace("_", "-")
            refusal = queue_refusal(purpose)
            if refusal is not None:
                # Quoted as given: the refusal's line names the variables that quote it.
                shown = repr(name) if name == purpose else f"{name!r} (queue {purpose!r})"
                raise ValueError(f"queue name {shown} is not allowed: {refusal}")
            spelt[purpose] = str(name)
            if isinstance(given, dict):
                # max_in_flight's old name, as a team's existing variables and files spell it.
                fields = {
                    ("max_in_flight" if k == "concurrency" else k): v for k, v in given.items()
                }
                base = merged.get(purpose, _new_queue_policy())
                if isinstance(base, QueuePolicy):
                    base = base.model_dump()
                merged[purpose] = {**(base if isinstance(base, dict) else {}), **fields}
            else:
                merged[purpose] = given
        for purpose, policy in merged.items():
            target = policy.get("dead_letter") if isinstance(policy, dict) else None
            if isinstance(policy, QueuePolicy):
                target = policy.dead_letter
            if isinstance(target, str) and target not in merged:
                raise ValueError(
                    f"queue {spelt.get(purpose, purpose)!r}: dead_letter must be a queue "
                    f"({', '.join(queue_order(merged))}) or null, got {target!r}"
                )
        return merged

    @field_validator("subscriptions", mode="before")
    @classmethod
    def _subscription_tables(cls, value: Any) -> Any:
        """Each table under its slug, as the rest of the code spells it: names arrive
        lower-cased with ``_`` for ``-`` from a variable's name, and are read that way from
        anywhere. A name that is no slug is refused, naming it."""
        if not isinstance(value, dict):
            return value  # pydantic refuses it, saying what it expected
        tables: dict[str, Any] = {}
        for name, table in value.items():
            slug = str(name).lower().replace("_", "-")
            try:
                check_slug(slug)
            except TopologyError as exc:
                raise ValueError(f"[subscriptions.{name}]: {exc}") from None
            if not isinstance(table, dict):
                raise ValueError(
                    f"[subscriptions.{name}] must be a table of settings, got {table!r}"
                )
            tables[slug] = {**tables.get(slug, {}), **table}
        return tables

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        pairs = (
            ("outbox_backoff_initial_s", "outbox_backoff_max_s", "the first wait exceeds its cap"),
            (
                "batch_retry_backoff_s",
                "batch_retry_backoff_max_s",
                "the first wait exceeds its cap",
            ),
            (
                "session_timeout_ms",
                "max_poll_interval_ms",
                "librdkafka requires max.poll.interval.ms >= session.timeout.ms",
            ),
            ("streams", "max_streams_per_env", "the plan exceeds the limit per environment"),
            ("batch_size", "batch_size_behind", "a poll that catches up takes the larger batch"),
            (
                "fleet_restart_backoff_s",
                "fleet_restart_backoff_max_s",
                "the first wait before a restart exceeds its cap",
            ),
            (
                "outbox_poll_min_interval_s",
                "outbox_poll_interval_s",
                "the publisher's idle wait starts at the shortest and doubles up to the interval",
            ),
        )
        for low, high, why in pairs:
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"RHUMBATRON_{low.upper()}={getattr(self, low)} must be at most "
                    f"RHUMBATRON_{high.upper()}={getattr(self, high)} ({why})"
                )
        return self

    def __repr_args__(self) -> Any:
        # The URLs may carry a password; repr and str (and so every log line and error that
        # formats the settings) show them masked. as_environment still gives them in clear.
        for name, value in super().__repr_args__():
            yield name, _masked_field(name, value)

    # -- derived -----------------------------------------------------------------------------------
    def in_state_dir(self, path: str) -> Path:
        """``path`` as given when absolute, else under ``state_dir``; ``{env}`` in it stands for
        the environment's name. Every file a command keeps goes through here, so running it from
        another folder never makes a second archive or outbox."""
        given = Path(path.replace("{env}", self.env)).expanduser()
        return given if given.is_absolute() else self.state_dir / given

    @property
    def claim_ttl_ms(self) -> int:
        """How long a claim is kept: while its event can still be read from the stream, plus
        the margin (a redelivery just inside the retention still finds its claim)."""
        return self.stream_retention_ms + self.claim_retention_margin_ms

    def as_environment(self) -> dict[str, str]:
        """These settings as ``RHUMBATRON_*`` variables, for a child process to read back the same
        (complex fields as JSON, as pydantic-settings reads them). Every secret is revealed,
        wherever it sits (a JSON dump would mask it as ``**********``, and the child would read
        that back as the secret)."""
        out: dict[str, str] = {}
        for name, raw in self.model_dump(mode="python").items():
            value = to_jsonable_python(_reveal(raw))
            if value is None:
                continue
            out[f"RHUMBATRON_{name.upper()}"] = (
                json.dumps(value) if isinstance(value, (list, dict)) else str(value)
            )
        return out

    def kafka_config(self) -> dict[str, Any]:
        """The base every Kafka client is built on (``streams.kafka_config.client_config`` adds
        each role's part): how to reach and log in to the cluster, then the pass-through
        properties. Secrets are in clear here: this dict goes to librdkafka and nowhere else."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.kafka_bootstrap,
            "client.id": f"rhumbatron-{self.env}"
            + (f"-{self.process_name}" if self.process_name else ""),
            "socket.connection.setup.timeout.ms": int(self.connect_timeout_s * 1000),
            "security.protocol": self.kafka_security_protocol,
        }
        for name, prop in _KAFKA_PROPERTIES.items():
            value = getattr(self, name)
            if value is not None and prop:
                config[prop] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.kafka_ssl_endpoint_identification else "none"
            )
        if self.kafka_sasl_mechanism == "OAUTHBEARER":
            config["sasl.oauthbearer.method"] = "oidc"
        config.update({name: value.get_secret_value() for name, value in self.kafka.items()})
        return config

    @cached_property
    def topology(self) -> Topology:
        return Topology(
            env=self.env,
            streams=self.streams,
            partitions=self.partitions,
            replication_factor=self.replication_factor,
            stream_retention_ms=self.stream_retention_ms,
            queue_retention_ms=self.queue_retention_ms,
            queue_partitions=self.queue_partitions,
            dead_letter_retention_ms=self.dead_letter_retention_ms,
            metrics_retention_ms=self.metrics_retention_ms,
            max_streams=self.max_streams_per_env,
            retry_tiers_s=tuple(self.retry_tiers_s),
            queues=queue_order(self.queues),
        )


# The variable naming the optional config file (``--config`` sets it for the command and its
# children). The file is TOML, its keys the fields' names; the environment wins over it.
CONFIG_VARIABLE = "RHUMBATRON_CONFIG"


def config_file() -> Path | None:
    given = os.environ.get(CONFIG_VARIABLE)
    return Path(given).expanduser().absolute() if given else None


class ConfigFile(TomlConfigSettingsSource):
    """The config file, read strictly: a file that is missing or not TOML, or a key that is no
    setting, is one :class:`ConfigurationError` naming the file (a misspelt key would otherwise
    leave its setting at the default without a word)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        if not path.is_file():  # pydantic-settings would skip it without a word
            raise ConfigurationError(
                f"{CONFIG_VARIABLE}={path}: no such file; give the path of a TOML file"
            )
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        where = f"{CONFIG_VARIABLE}={file_path}"
        try:
            data = tomllib.loads(file_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"{where}: not a readable TOML file: {exc}") from None
        fields = Settings.model_fields
        unknown = sorted(key for key in data if key not in fields)
        if unknown:
            hints = [
                f"{key!r} (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(key, fields, n=1))
                else repr(key)
                for key in unknown
            ]
            raise ConfigurationError(
                f"{where}: no such setting: {', '.join(hints)}; its keys are the settings' names "
                "(rhumbatron config show lists them)"
            )
        return data


def sources(settings: Settings) -> dict[str, str]:
    """Where each setting's value came from: its variable, the config file, or the default."""
    path = config_file()
    in_file = ConfigFile(Settings, path).toml_data if path is not None else {}
    out: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        variable = _variable(name, field)
        nested = sorted(v for v in os.environ if v.startswith(f"RHUMBATRON_{name.upper()}__"))
        if variable in os.environ or nested:
            given = ", ".join([variable] if variable in os.environ else nested)
            out[name] = f"{given} over {path}" if name in in_file else given
        elif name in in_file:
            out[name] = str(path)
        else:
            out[name] = "default"
    return out


def shown(settings: Settings) -> dict[str, Any]:
    """The settings as they may be shown anywhere: every secret masked, URLs without passwords."""
    out: dict[str, Any] = {}
    for name, value in settings.model_dump(mode="json").items():
        out[name] = _masked_field(name, value)
    return out


# Set while the settings of another host are read (settings_elsewhere): the file alone gives
# them, and the files they name are that host's, not looked for here.
_ELSEWHERE: ContextVar[Path | None] = ContextVar("settings_elsewhere", default=None)


def settings_elsewhere(path: Path) -> Settings:
    """The settings of the processes of another host (a deployment's pods) from their TOML file
    alone: no environment variable of this one, and the certificate files they name unchecked
    (they are on that host). Refused values as :func:`load_settings` refuses them."""
    token = _ELSEWHERE.set(path)
    try:
        return load_settings()
    finally:
        _ELSEWHERE.reset(token)


def load_settings() -> Settings:
    """The settings the environment gives. A value pydantic refuses is a
    :class:`ConfigurationError` naming each variable, what it held and what is wrong with it, so a
    typo in one variable is one line, not a validation traceback. A complex setting (a JSON
    object or list) that is not JSON at all is refused the same way: pydantic-settings raises a
    ``SettingsError`` for it before validation starts."""
    try:
        return Settings()
    except ValidationError as exc:
        raise _invalid("; ".join(_refusal(error) for error in exc.errors())) from exc
    except SettingsError as exc:
        raise _invalid(_unparsable(exc)) from exc


def _invalid(refusals: str) -> ConfigurationError:
    return ConfigurationError(
        f"invalid setting: {refusals}; fix the value, or unset it for its default"
    )


def _unparsable(exc: SettingsError) -> str:
    found = re.search(r'field "([^"]+)"', str(exc))
    if found is None:  # not the JSON of one field: pydantic-settings' own words are all we have
        return str(exc)
    name = found.group(1)
    field = Settings.model_fields.get(name)
    variable = _variable(name, field)
    shown = _shown(field, os.environ.get(variable))
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return f"{variable}={shown}: expected JSON{cause}"


def _refusal(error: ErrorDetails) -> str:
    loc = [str(part) for part in error["loc"]]
    message = error["msg"].removeprefix("Value error, ")  # our validators' own words
    if not loc:  # a check across fields: its message names them
        return message
    field = Settings.model_fields.get(loc[0])
    top = _variable(loc[0], field)
    variable = "__".join([top, *(_queue_variable(part) for part in loc[1:])])
    if variable in os.environ:  # what the user wrote, not what pydantic made of it
        return f"{variable}={_shown(field, os.environ[variable])}: {message}"
    if top in os.environ and loc[1:]:  # inside the variable's JSON
        return f"{top} (at {'.'.join(loc[1:])})={_shown(field, error.get('input'))}: {message}"
    nested = sorted(name for name in os.environ if name.startswith(f"{top}__"))
    # A refusal of the whole field (an unknown queue) that the nested variables built: name the
    # ones whose key its message quotes.
    named = [n for n in nested if _quoted_in(n[len(top) + 2 :].lower(), message)]
    if named or nested:
        shown = ", ".join(f"{n}={_shown(field, os.environ[n])}" for n in named or nested)
        return f"{shown}: {message}"
    path = config_file()
    if path is not None and loc[0] in ConfigFile(Settings, path).toml_data:
        return f"{path} (at {'.'.join(loc)})={_shown(field, error.get('input'))}: {message}"
    return f"{variable}={_shown(field, error.get('input'))}: {message}"


def _quoted_in(path: str, message: str) -> bool:
    """Whether ``message`` quotes the key a nested variable sets: a queue's name (its first
    part) or a pass-through property (all of it, dotted)."""
    return (
        f"'{path.split('__', maxsplit=1)[0]}'" in message
        or f"'{path.replace('__', '.')}'" in message
    )


def _shown(field: FieldInfo | None, value: Any) -> str:
    secret = field is not None and "Secret" in str(field.annotation)
    if secret:
        return "(a secret, not shown)"
    return repr(masked(value)) if isinstance(value, str) else repr(value)  # a URL's password


def _variable(name: str, field: FieldInfo | None) -> str:
    """The variable that set a field: under an old name too (``AliasChoices``), whichever of its
    names the environment holds."""
    names = [f"RHUMBATRON_{name.upper()}"]
    if field is not None and isinstance(field.validation_alias, AliasChoices):
        names += [
            alias.upper()
            for alias in field.validation_alias.choices
            if isinstance(alias, str) and alias.upper().startswith("RHUMBATRON_")
        ]
    return next((n for n in names if n in os.environ), names[0])


def _flatten(value: dict[Any, Any], prefix: str, out: dict[str, str]) -> None:
    for key, item in value.items():
        name = f"{prefix}{str(key).lower()}"
        if isinstance(item, dict):
            _flatten(item, f"{name}.", out)
        else:
            raw = item.get_secret_value() if isinstance(item, SecretStr) else item
            out[name] = str(raw).lower() if isinstance(raw, bool) else str(raw)


_QUIET = logging.getLogger("rhumbatron.settings.librdkafka")  # the check's client has no brokers
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _librdkafka_accepts(properties: dict[str, str]) -> None:
    """librdkafka checks names and values only when a client is made: make one (it connects to
    nothing before it is used, and is gone at once) so a typo is refused now, by name."""
    import confluent_kafka

    def refusal(given: dict[str, str]) -> str | None:
        try:
            confluent_kafka.Producer({"logger": _QUIET, **given})  # no brokers: it connects nowhere
        except confluent_kafka.KafkaException as exc:
            return str(exc.args[0].str())
        return None

    if (why := refusal(properties)) is None:
        return
    # Name the property: the first one librdkafka refuses on its own.
    culprit = next((p for p in properties if refusal({p: properties[p]}) is not None), None)
    hint = " (a dot in the name is __ in the variable)" if culprit and "_" in culprit else ""
    raise ValueError(f"{culprit!r}: librdkafka refuses it: {why}{hint}" if culprit else why)
