"""Stream and queue names, project hashing, and the topic plan of an environment.

A project always maps to one stream (``fnv1a32(project_id) mod streams``) and, inside it, the
key partitioner (murmur2, as the Java client) puts it on one partition: one project, one
partition, total order. Names are checked here, before any network call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from streams.catalog import CATALOG
from streams.errors import TopologyError

FNV_OFFSET_BASIS = 0x811C9DC5
FNV_PRIME = 0x01000193

# The built-in queues, each with its default policy (router.settings); settings add more
# (``[queues.<name>]``), named as :func:`check_queue` allows.
QUEUE_PURPOSES = (
    "agent-wakeups",
    "integration",
    "indexing",
    "verification",
    "release",
    "dead-letter",
)
# A queue's name is in its topics, its retry topics (plus ``-retry-<N>s`` and the environment),
# its worker's group and transactional ids and in a variable's name: well within Kafka's 249.
QUEUE_NAME_MAX = 40

# The queue of every cataloged command type (docs/events.md): where a command goes when its
# sender names no queue (the causal router, a handler's ctx.send, rhumbatron command send).
COMMAND_QUEUES: dict[str, str] = CATALOG.queues()

_ENV = re.compile(r"^[A-Za-z0-9_]{1,40}$")
_STREAM = re.compile(r"^[A-Za-z0-9_]+$")
_SLUG = re.compile(r"^[a-z][a-z0-9-]{0,60}$")
_QUEUE_CHARACTERS = re.compile(r"^[a-z0-9-]*$")


def fnv1a32(text: str) -> int:
    """32-bit FNV-1a over the UTF-8 bytes."""
    value = FNV_OFFSET_BASIS
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return value


def stream_index(project_id: str, streams: int) -> int:
    return fnv1a32(project_id) % streams


def murmur2(data: bytes) -> int:
    """The Java client's ``Utils.murmur2`` (hash seed 0x9747b28c), as an unsigned 32-bit value."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, idx = length % 4, length & ~3
    if tail == 3:
        h ^= data[idx + 2] << 16
    if tail >= 2:
        h ^= data[idx + 1] << 8
    if tail >= 1:
        h ^= data[idx]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """Where ``partitioner=murmur2_random`` (and the Java client) put a keyed record."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


def check_env(env: str) -> str:
    if not _ENV.match(env):
        raise TopologyError(
            f"environment name {env!r} is not allowed: stream names take letters, digits and "
            "underscores only (1-40 characters); set RHUMBATRON_ENV to such a name"
        )
    return env


def stream_name(index: int, env: str) -> str:
    check_env(env)
    if not 0 <= index <= 99:
        raise TopologyError(f"stream index {index} is out of range 0-99")
    name = f"rhumbatron_events_{index:02d}_{env}"
    if not _STREAM.match(name):  # unreachable after check_env; kept as the rule's one statement
        raise TopologyError(f"stream name {name!r} has characters other than letters, digits, _")
    return name


def check_queue(name: str) -> str:
    """``name``, if it can name a queue; else a TopologyError naming the rule it breaks. The
    rules keep every name's topics apart from every other's: ``rhumbatron-<name>-<env>`` (an
    environment has no ``-``, so the last ``-`` ends the name), its retry topics
    ``rhumbatron-<name>-retry[-<N>s]-<env>``, and its variables
    ``RHUMBATRON_QUEUES__<NAME>__<FIELD>``, which spell ``-`` as ``_`` in capitals."""
    refusal = queue_refusal(name)
    if refusal is not None:
        raise TopologyError(f"queue name {name!r} is not allowed: {refusal}")
    return name


def queue_refusal(name: str) -> str | None:
    """The rule of :func:`check_queue` that ``name`` breaks, or None."""
    if not 1 <= len(name) <= QUEUE_NAME_MAX:
        return f"a name has 1 to {QUEUE_NAME_MAX} characters, this one {len(name)}"
    if not _QUEUE_CHARACTERS.match(name):
        return (
            "a name has lowercase letters, digits and - only (no _: a variable's name spells - "
            "as _, so payments_eu and payments-eu would be one queue)"
        )
    if not name[0].isalpha():
        return "a name starts with a letter"
    if name.endswith("-") or "--" in name:
        return (
            "a - stands between two letters or digits (a -- would be the __ that separates the "
            "parts of a variable's name)"
        )
    if name.endswith("-retry") or "-retry-" in name:
        return (
            "a name neither ends in -retry nor holds -retry-: rhumbatron-<queue>-retry-<env> "
            "and rhumbatron-<queue>-retry-<N>s-<env> are the retry topics of <queue>"
        )
    return None


def queue_name(purpose: str, env: str) -> str:
    """``rhumbatron-<purpose>-<env>``. Checks the name's grammar, not that the queue is
    configured: :meth:`Topology.known_queue` does, where the settings' queues are known."""
    check_env(env)
    check_queue(purpose)
    return f"rhumbatron-{purpose}-{env}"


def unknown_queue(name: str, known: Sequence[str]) -> TopologyError:
    """The refusal of a queue the settings do not configure, naming those they do."""
    return TopologyError(
        f"unknown queue {name!r}; known: {', '.join(known)} (a queue of your own is "
        "[queues.<name>] in the settings: docs/queues.md)"
    )


def check_slug(slug: str) -> str:
    if not _SLUG.match(slug):
        raise TopologyError(
            f"subscription slug {slug!r} is not allowed: lowercase letters, digits and hyphens, "
            "starting with a letter"
        )
    return slug


def group_id(subscription: str, env: str) -> str:
    return f"rhumbatron-{check_slug(subscription)}-{check_env(env)}"


def dead_letter_topic(env: str) -> str:
    return f"rhumbatron_dead_letters_{check_env(env)}"


def audit_topic(env: str) -> str:
    return f"rhumbatron_audit_{check_env(env)}"


def metrics_topic(env: str) -> str:
    return f"rhumbatron_event_metrics_{check_env(env)}"


def pump_checkpoint_topic(env: str) -> str:
    return f"rhumbatron_pump_checkpoints_{check_env(env)}"


def redelivery_topic(subscription: str, env: str) -> str:
    return f"rhumbatron_redelivery_{check_slug(subscription).replace('-', '_')}_{check_env(env)}"


def retry_topic(purpose: str, env: str, tier_s: int | None = None) -> str:
    """``rhumbatron-<purpose>-retry-<env>``: a command queue's retries after its own delay, each
    with its due time; with ``tier_s``, ``rhumbatron-<purpose>-retry-<tier_s>s-<env>``: the retry
    tier that holds the retries a handler asked to wait ``tier_s`` seconds for. A topic holds one
    delay, so its records stay in due order."""
    queue_name(purpose, env)
    if tier_s is None:
        return f"rhumbatron-{purpose}-retry-{env}"
    if tier_s < 1:
        raise TopologyError(f"a retry tier is a whole number of seconds >= 1, got {tier_s!r}")
    return f"rhumbatron-{purpose}-retry-{tier_s}s-{env}"


def transactional_id(slug: str, env: str, lease: int) -> str:
    """``rhumbatron-<slug>-<env>-<lease>``: stable per producer lease, so a process that takes
    over a lease fences the one that held it before (librdkafka's zombie fencing)."""
    return f"rhumbatron-{check_slug(slug)}-{check_env(env)}-{lease}"


def redelivery_partition(
    streams: Sequence[str], partitions_per_stream: int, topic: str, partition: int
) -> int | None:
    """Redelivery partition k belongs to origin (streams[k // P], k % P), so the consumer that
    owns an origin partition also reads its redeliveries; ``None`` for a topic not a stream."""
    if topic not in streams:
        return None
    return list(streams).index(topic) * partitions_per_stream + partition


def redelivery_origin(
    streams: Sequence[str], partitions_per_stream: int, redelivered: int
) -> tuple[str, int] | None:
    """The (stream, partition) a redelivery partition belongs to, if any."""
    index, partition = divmod(redelivered, partitions_per_stream)
    if not 0 <= index < len(streams):
        return None
    return streams[index], partition


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    kind: str = "stream"  # stream | queue | internal


@dataclass(frozen=True, slots=True)
class GroupReads:
    """The topics one consumer group reads, for its lag. ``subscribed``: read through the group,
    so a partition it never committed is read from the log start and lags by all it holds.
    ``assigned``: read by manual assignment from a position kept elsewhere (a subscription's
    redelivery topic: the store cursor), so only a partition the group committed says anything
    about its lag."""

    group: str
    name: str  # the slug in the group id
    kind: str  # subscription | command-worker | rollup | other
    subscribed: tuple[str, ...]
    assigned: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """The topics of one environment. Build it from settings (router.settings.topology)."""

    env: str
    streams: int
    partitions: int
    replication_factor: int
    stream_retention_ms: int
    queue_retention_ms: int
    queue_partitions: int
    dead_letter_retention_ms: int
    max_streams: int
    metrics_retention_ms: int = 30 * 86_400_000
    retry_tiers_s: tuple[int, ...] = ()  # the delays of each queue's retry tiers, ascending
    queues: tuple[str, ...] = QUEUE_PURPOSES  # the built-in ones, then the settings' own

    def __post_init__(self) -> None:
        check_env(self.env)
        for queue in self.queues:
            check_queue(queue)
        if len(set(self.queues)) != len(self.queues):
            raise TopologyError(f"a queue is named twice in {', '.join(self.queues)}")
        if self.streams < 1:
            raise TopologyError(f"streams must be at least 1, got {self.streams}")
        if self.streams > self.max_streams:
            raise TopologyError(
                f"a plan of {self.streams} streams exceeds the limit of {self.max_streams} "
                f"streams per environment (max_streams_per_env) for '{self.env}'"
            )
        if self.partitions < 1 or self.replication_factor < 1:
            raise TopologyError(
                f"partitions ({self.partitions}) and replication factor "
                f"({self.replication_factor}) must be at least 1"
            )

    def stream_names(self) -> list[str]:
        return [stream_name(i, self.env) for i in range(self.streams)]

    def stream_for(self, project_id: str) -> str:
        return stream_name(stream_index(project_id, self.streams), self.env)

    def partition_of(self, project_id: str) -> tuple[str, int]:
        """The (stream, partition) holding a project's events."""
        return self.stream_for(project_id), partition_for(project_id, self.partitions)

    def queue_names(self) -> list[str]:
        return [queue_name(p, self.env) for p in self.queues]

    def known_queue(self, purpose: str) -> str:
        """``purpose``, if it is one of this environment's queues; else a TopologyError naming
        them."""
        if purpose not in self.queues:
            raise unknown_queue(purpose, self.queues)
        return purpose

    def stream_specs(self) -> list[TopicSpec]:
        config = {"retention.ms": str(self.stream_retention_ms), "cleanup.policy": "delete"}
        return [
            TopicSpec(n, self.partitions, self.replication_factor, dict(config))
            for n in self.stream_names()
        ]

    def queue_specs(self) -> list[TopicSpec]:
        config = {"retention.ms": str(self.queue_retention_ms), "cleanup.policy": "delete"}
        return [
            TopicSpec(n, self.queue_partitions, self.replication_factor, dict(config), "queue")
            for n in self.queue_names()
        ]

    def internal_specs(self) -> list[TopicSpec]:
        rf = self.replication_factor
        return [
            TopicSpec(
                dead_letter_topic(self.env),
                self.partitions,
                rf,
                # Compacted on "<dead letter id>:<offset>" so a repeated write collapses.
                {
                    "retention.ms": str(self.dead_letter_retention_ms),
                    "cleanup.policy": "compact,delete",
                },
                "internal",
            ),
            # The analytics projector's points (one per fresh lifecycle event), keyed by project.
            TopicSpec(
                metrics_topic(self.env),
                self.partitions,
                rf,
                {"retention.ms": str(self.metrics_retention_ms), "cleanup.policy": "delete"},
                "internal",
            ),
            # The durable copy of the operator state Redis indexes (consumers/runtime/
            # audit_records.py): every audit entry, every dead letter as indexed and each of its
            # status changes. A topic of its own rather than the dead-letter topic: that one
            # expires letters after dead_letter_retention_ms and its records are read as letters
            # (one per entry), while the index they rebuild keeps every letter and its audit for
            # good. So: compacted and nothing else, which keeps every record as long as its key is
            # the latest (each entry has a key of its own), and one partition, so a rebuild
            # replays the status changes in the order they were made.
            TopicSpec(
                audit_topic(self.env),
                1,
                rf,
                {"cleanup.policy": "compact"},
                "internal",
            ),
        ]

    def pump_spec(self) -> TopicSpec:
        """The feed pump's checkpoints (docs/pump.md), one partition keyed by feed: compacted, so
        the latest of each feed is kept. Only the pump uses it (not in ``internal_specs``, which
        every subscription and worker checks for)."""
        return TopicSpec(
            pump_checkpoint_topic(self.env),
            1,
            self.replication_factor,
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            "internal",
        )

    def redelivery_partition(self, topic: str, partition: int) -> int | None:
        return redelivery_partition(self.stream_names(), self.partitions, topic, partition)

    def retry_topics(self, purpose: str) -> list[str]:
        """A queue's retry topic (its own delay), then one per retry tier."""
        return [
            retry_topic(purpose, self.env),
            *(retry_topic(purpose, self.env, t) for t in self.retry_tiers_s),
        ]

    def retry_specs(self, purpose: str) -> list[TopicSpec]:
        config = {"retention.ms": str(self.queue_retention_ms), "cleanup.policy": "delete"}
        return [
            TopicSpec(name, self.queue_partitions, self.replication_factor, dict(config), "queue")
            for name in self.retry_topics(purpose)
        ]

    def redelivery_spec(self, subscription: str) -> TopicSpec:
        """One partition per stream partition, so partition k belongs to origin
        (stream k // partitions, partition k % partitions) and is read by its owner."""
        return TopicSpec(
            redelivery_topic(subscription, self.env),
            self.streams * self.partitions,
            self.replication_factor,
            {"retention.ms": str(self.stream_retention_ms), "cleanup.policy": "delete"},
            "internal",
        )

    def subscription_reads(self, slug: str) -> GroupReads:
        """A subscription reads every stream, and its own redelivery topic by assignment."""
        return GroupReads(
            group_id(slug, self.env),
            slug,
            "subscription",
            tuple(self.stream_names()),
            (redelivery_topic(slug, self.env),),
        )

    def worker_reads(self, slug: str, purpose: str) -> GroupReads:
        """A command worker (the dead-letter consumer too) reads its queue and retry topics."""
        return GroupReads(
            group_id(slug, self.env),
            slug,
            "command-worker",
            (queue_name(purpose, self.env), *self.retry_topics(purpose)),
        )

    def all_specs(self) -> list[TopicSpec]:
        return self.stream_specs() + self.queue_specs() + self.internal_specs()

    def count_streams(self, topic_names: list[str] | set[str]) -> int:
        pattern = re.compile(rf"^rhumbatron_events_\d{{2}}_{re.escape(self.env)}$")
        return sum(1 for t in topic_names if pattern.match(t))
