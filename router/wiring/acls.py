"""The least privileges each role of an environment needs on Kafka and on Redis, derived from the
names the code uses (``streams.topology``: topics, groups, transactional ids; the Redis key
builders of ``consumers`` and ``router.workers``), so the grants follow the code instead of a
table kept by hand. Pure: nothing here talks to a broker or a server.

A *role* is one kind of process and the commands that run as it:

- ``provisioner`` — ``rhumbatron provision``: creates the environment's topics and aligns their
  configuration.
- ``publisher`` — ``rhumbatron publish``: the outbox publisher, an idempotent producer of the
  streams.
- one role per subscription (``rhumbatron consume --subscription <slug>``, and the operator
  controls of that subscription: ``rhumbatron subscription … --subscription <slug>``).
- ``analytics-rollup`` — ``rhumbatron analytics-rollup``: the faust app, which creates and owns
  its own topics, group and transactional ids under its app id.
- one role per command queue's worker (``rhumbatron worker --queue <purpose>``); the worker of
  the dead-letter queue is ``rhumbatron dead-letter-consumer``.
- ``pump`` — ``rhumbatron pump``: the feed pump, a transactional producer of the streams and of its
  checkpoint topic, and its legacy sequence and audit log in Redis.
- ``operator`` — ``rhumbatron serve``, ``dead-letters …``, ``status``, ``topology``,
  ``worker-stats``, ``view``: reads lag, dead letters and views; retries letters.

Every name of an environment ends with the environment's name (``rhumbatron_events_00_<env>``,
``rhumbatron-<slug>-<env>``), so a prefix cannot keep one environment from another: topics and
groups are granted by their full (LITERAL) names. Transactional ids are
``rhumbatron-<slug>-<env>-<lease>``, where the lease number varies: they are granted by the
PREFIXED ``rhumbatron-<slug>-<env>-`` (an environment name has no ``-``, so that prefix is one
environment's and one slug's).

The assign-only readers (``consumers.runtime.kafka_transport.assign_only_consumer``: group id
``rhumbatron-<purpose>-<random>``) never join their group, fetch or commit offsets with it, so they
need no group ACL: tests/router/test_acls.py runs every role on a broker with an authorizer.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from consumers.runtime.types import EffectKind
from consumers.subscriptions.causal_router.commands import queues as router_queues
from router.settings import QueuePolicy, Settings
from router.wiring.groups import ROLLUP_SLUG
from router.wiring.provisioning import (
    environment_specs,
    subscription_topics,
    worker_topics,
)
from router.wiring.workers import worker_slug
from streams.topology import (
    QUEUE_PURPOSES,
    Topology,
    audit_topic,
    dead_letter_topic,
    group_id,
    metrics_topic,
    pump_checkpoint_topic,
    queue_name,
    redelivery_topic,
)

PROVISIONER = "provisioner"
PUBLISHER = "publisher"
OPERATOR = "operator"
PUMP = "pump"
ANALYTICS_ROLLUP = "analytics-rollup"

# The product's subscriptions and the runtime's drill subscription (ledger), by effect kind, as
# their factories declare it (router.wiring.processors); ``roles`` adds the settings' own.
BUILT_IN: Mapping[str, EffectKind] = {
    "analytics-projector": EffectKind.KAFKA,
    "audit-archiver": EffectKind.FILES,
    "causal-router": EffectKind.KAFKA,
    "ledger": EffectKind.REDIS,
    "project-view-projector": EffectKind.REDIS,
}
SUBSCRIPTIONS: tuple[str, ...] = tuple(BUILT_IN)
# The product's subscriptions whose effects are Kafka records, and the topics those records go
# to. A Kafka-effect subscription of your own writes commands: it is granted the queues.
KAFKA_OUTPUTS: Mapping[str, str] = {
    "causal-router": "the queues of the commands it decides (router_queues)",
    "analytics-projector": "the metric points topic",
}
# The subscription whose consume process also runs the router's outbox publisher and its
# maintenance tick (its companion: router.wiring.processors.causal_router).
ROUTER = "causal-router"
ARCHIVER = "audit-archiver"
PROJECTOR = "project-view-projector"
DEAD_LETTER_QUEUE = "dead-letter"


class Resource(StrEnum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
    CLUSTER = "CLUSTER"


class Pattern(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(StrEnum):
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DESCRIBE = "DESCRIBE"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


# kafka-acls.sh's spelling of each.
_TOOL_OPERATION = {
    Operation.READ: "Read",
    Operation.WRITE: "Write",
    Operation.CREATE: "Create",
    Operation.DESCRIBE: "Describe",
    Operation.DESCRIBE_CONFIGS: "DescribeConfigs",
    Operation.ALTER_CONFIGS: "AlterConfigs",
    Operation.IDEMPOTENT_WRITE: "IdempotentWrite",
}
_TOOL_RESOURCE = {
    Resource.TOPIC: "--topic",
    Resource.GROUP: "--group",
    Resource.TRANSACTIONAL_ID: "--transactional-id",
    Resource.CLUSTER: "--cluster",
}


@dataclass(frozen=True, order=True, slots=True)
class KafkaAcl:
    """One ALLOW entry: ``operation`` on the resource ``resource``/``pattern``/``name``, from any
    host; ``why`` names the code that needs it."""

    resource: Resource
    pattern: Pattern
    name: str
    operation: Operation
    why: str = field(default="", compare=False)

    def as_dict(self) -> dict[str, str]:
        return {
            "resource": self.resource.value,
            "pattern": self.pattern.value,
            "name": self.name,
            "operation": self.operation.value,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class RedisAccess:
    """One part of the code's use of Redis: the key patterns it reads and writes (``keys``), those
    it only reads (``read_keys``), and every command it sends, Lua's ``redis.call`` included (Redis
    checks a script's commands and keys against the user as well)."""

    what: str
    keys: tuple[str, ...] = ()
    read_keys: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RedisUser:
    """A Redis ACL user for one role: the union of the parts it uses."""

    role: str
    parts: tuple[RedisAccess, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return _unique(k for p in self.parts for k in p.keys)

    @property
    def read_keys(self) -> tuple[str, ...]:
        written = set(self.keys)
        return _unique(k for p in self.parts for k in p.read_keys if k not in written)

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(sorted({c for p in self.parts for c in p.commands}))

    def rules(self) -> list[str]:
        """The ``ACL SETUSER`` rules after ``reset``, the user's name and its password: only these
        keys and commands, and no channels (nothing here publishes or subscribes; ``reset`` alone
        leaves every channel open where ``acl-pubsub-default`` is ``allchannels``)."""
        return [
            "resetchannels",
            *(f"~{k}" for k in self.keys),
            *(f"%R~{k}" for k in self.read_keys),
            *(f"+{c}" for c in self.commands),
        ]

    def setuser(self, username: str, password: str) -> list[str]:
        """The ``ACL SETUSER`` command as arguments (for a client's ``execute_command``)."""
        return ["ACL", "SETUSER", username, "reset", "on", f">{password}", *self.rules()]

    def as_dict(self) -> dict[str, object]:
        return {
            "keys": list(self.keys),
            "read_keys": list(self.read_keys),
            "commands": list(self.commands),
            "parts": [p.what for p in self.parts],
        }


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    runs: str  # the commands that run as this role
    kafka: tuple[KafkaAcl, ...]
    redis: RedisUser

    def as_dict(self) -> dict[str, object]:
        return {
            "role": self.name,
            "runs": self.runs,
            "kafka": [a.as_dict() for a in self.kafka],
            "redis": self.redis.as_dict(),
        }


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# -- Kafka --------------------------------------------------------------------------------------
def _topics(names: Iterable[str], operations: Sequence[Operation], why: str) -> list[KafkaAcl]:
    return [
        KafkaAcl(Resource.TOPIC, Pattern.LITERAL, n, op, why) for n in names for op in operations
    ]


def _group(name: str, operations: Sequence[Operation], why: str) -> list[KafkaAcl]:
    return [KafkaAcl(Resource.GROUP, Pattern.LITERAL, name, op, why) for op in operations]


def _transactional_ids(slug: str, env: str, why: str) -> list[KafkaAcl]:
    # rhumbatron-<slug>-<env>-<lease>: streams.topology.transactional_id with its lease cut off.
    prefix = f"{group_id(slug, env)}-"
    return [
        KafkaAcl(Resource.TRANSACTIONAL_ID, Pattern.PREFIXED, prefix, op, why)
        for op in (Operation.WRITE, Operation.DESCRIBE)
    ]


READ = (Operation.READ, Operation.DESCRIBE)
WRITE = (Operation.WRITE, Operation.DESCRIBE)
GROUP_MEMBER = (Operation.READ, Operation.DESCRIBE)


def _checked(names: Iterable[str], why: str) -> list[KafkaAcl]:
    """DESCRIBE on the topics a command checks exist before it starts (metadata lists only the
    topics a principal may describe, so without it a topic reads as not provisioned)."""
    return _topics(names, (Operation.DESCRIBE,), why)


def _provisioner(topology: Topology) -> list[KafkaAcl]:
    return _topics(
        [s.name for s in environment_specs(topology)],
        (
            Operation.CREATE,
            Operation.DESCRIBE,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
        ),
        "streams.admin.provision: create what is missing (CreateTopics), wait for the leaders "
        "(ListOffsets), read and align retention (DescribeConfigs, IncrementalAlterConfigs)",
    )


def _stream_writer(topology: Topology, why: str) -> list[KafkaAcl]:
    # An idempotent producer's InitProducerId is allowed by WRITE on any topic (KIP-679): no
    # CLUSTER IdempotentWrite.
    return _topics(topology.stream_names(), WRITE, why)


def _pump(topology: Topology) -> list[KafkaAcl]:
    env = topology.env
    checkpoints = pump_checkpoint_topic(env)
    return [
        *_checked(
            [*topology.stream_names(), checkpoints], "pump refuses to start unless they exist"
        ),
        *_stream_writer(topology, "the pump's transactional producer (streams/pump/kafka.py)"),
        *_topics(
            [checkpoints],
            (Operation.WRITE, Operation.READ, Operation.DESCRIBE),
            "the pump's checkpoints: written in each batch's transaction, read at start",
        ),
        *_topics([audit_topic(env)], WRITE, "skip-through and forget: their audit entries"),
        # rhumbatron-pump-<env>-<feed hash>: streams.pump.kafka.pump_transactional_id.
        *(
            KafkaAcl(
                Resource.TRANSACTIONAL_ID,
                Pattern.PREFIXED,
                f"rhumbatron-pump-{env}-",
                op,
                "the pump's transactional id, one per feed",
            )
            for op in (Operation.WRITE, Operation.DESCRIBE)
        ),
    ]


def _dead_letter_writer(env: str, why: str) -> list[KafkaAcl]:
    # The audit topic takes each letter's copy as indexed (consumers/runtime/audit_records.py),
    # and a subscription's controls' audit entries.
    return _topics([dead_letter_topic(env), audit_topic(env)], WRITE, why)


def _audit_reader(env: str) -> list[KafkaAcl]:
    return _topics(
        [audit_topic(env)],
        (Operation.READ,),
        "a partition's first fold rebuilds the dead-letter index and the audit logs from it "
        "when Redis lost them or went back to an older copy (Controls.first_fold)",
    )


def _subscription(topology: Topology, slug: str, kind: EffectKind) -> list[KafkaAcl]:
    env = topology.env
    reads = topology.subscription_reads(slug)
    acls = [
        *_checked(
            subscription_topics(topology, slug),
            "consume refuses to start unless the topics it may touch exist "
            "(router.wiring.provisioning.subscription_topics)",
        ),
        *_topics(
            reads.subscribed,
            READ,
            "the consume loop reads every stream as its group (KafkaTransport); the controls "
            "read a stream's retained range (KafkaReader)",
        ),
        *_topics(
            reads.assigned,
            READ,
            "its redelivery topic, read by assignment (KafkaRedelivery)",
        ),
        *_group(
            reads.group,
            GROUP_MEMBER,
            "its consumer group: join, fetch and commit offsets (commits inside a transaction "
            "for Kafka effects: TxnOffsetCommit)",
        ),
        *_dead_letter_writer(env, "a batch that failed too often, and poison, are dead-lettered"),
        *_audit_reader(env),
    ]
    if kind == EffectKind.KAFKA:
        if slug in KAFKA_OUTPUTS:
            outputs = [metrics_topic(env)] if slug != ROUTER else router_queues(env)
            what = KAFKA_OUTPUTS[slug]
        else:
            outputs = topology.queue_names()
            what = "the commands it emits, onto the environment's queues (docs/processors.md)"
        acls += _transactional_ids(
            slug,
            env,
            "its Kafka effects and offsets commit in one transaction per producer lease "
            "(KafkaOutput: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn)",
        )
        acls += _topics(outputs, WRITE, f"its Kafka effects: {what}")
        acls += _topics(
            outputs,
            (Operation.READ,),
            "recovery looks for a pending copy's records on its output topics (KafkaOutputLog)",
        )
    if slug == ROUTER:
        acls += _stream_writer(
            topology,
            "its companion publishes the router's outbox (candidate.stale events) to the streams",
        )
    return acls


def _analytics_rollup(topology: Topology) -> list[KafkaAcl]:
    env = topology.env
    app = f"rhumbatron-analytics-rollup-{env}"  # router.wiring.analytics.rollup_app_id
    owned = f"{app}-"
    return [
        *_topics([metrics_topic(env)], READ, "faust reads the metric points"),
        *_group(app, GROUP_MEMBER, "faust's consumer group is its app id"),
        *(
            KafkaAcl(Resource.TOPIC, Pattern.PREFIXED, owned, op, why)
            for op, why in (
                (Operation.CREATE, "faust creates its changelog and leader topics itself"),
                (Operation.DESCRIBE, "faust's topics: metadata"),
                (Operation.READ, "faust recovers its tables from their changelogs"),
                (Operation.WRITE, "faust writes its tables' changelogs"),
            )
        ),
        *(
            KafkaAcl(
                Resource.TRANSACTIONAL_ID,
                Pattern.PREFIXED,
                owned,
                op,
                "exactly_once: one transactional producer per points partition "
                "(<app id>-<group>-<partition>)",
            )
            for op in (Operation.WRITE, Operation.DESCRIBE)
        ),
    ]


def _worker(topology: Topology, purpose: str, policy: QueuePolicy) -> list[KafkaAcl]:
    env = topology.env
    slug = worker_slug(purpose)
    reads = topology.worker_reads(slug, purpose)
    writes = [queue_name(purpose, env), *topology.retry_topics(purpose)]
    if policy.dead_letter is not None:
        writes.append(queue_name(policy.dead_letter, env))
    acls = [
        *_checked(
            worker_topics(topology, purpose, streams=purpose == DEAD_LETTER_QUEUE),
            "a worker refuses to start unless the topics it may touch exist "
            "(router.wiring.provisioning.worker_topics)",
        ),
        *_topics(reads.subscribed, READ, "its queue and retry topic, read as its group"),
        *_group(reads.group, GROUP_MEMBER, "its consumer group; offsets commit in its transaction"),
        *_transactional_ids(
            slug, env, "retries, redeliveries and dead letters commit with the offsets"
        ),
        *_topics(
            _unique(writes),
            WRITE,
            "a command with more work goes back to its queue, a failed one to the retry topic, "
            "one out of attempts to the dead-letter queue (router.workers.outgoing)",
        ),
        *_topics(
            [q for q in topology.queue_names() if q not in writes],
            WRITE,
            "a handler's follow-up commands (ctx.send) go to any queue of the environment",
        ),
    ]
    if purpose == DEAD_LETTER_QUEUE:
        acls += _dead_letter_writer(env, "the dead-letter consumer records each command letter")
        acls += _stream_writer(
            topology,
            "it publishes task.blocked / task.failed through the router's outbox to the streams",
        )
    return acls


def _operator(
    topology: Topology, queues: Mapping[str, QueuePolicy], subscriptions: Sequence[str]
) -> list[KafkaAcl]:
    env = topology.env
    groups = [group_id(s, env) for s in subscriptions]
    groups += [group_id(worker_slug(p), env) for p in topology.queues]
    groups.append(group_id(ROLLUP_SLUG, env))  # the analytics rollup's group (faust's app id)
    # A command letter is sent back to the queue it came from: a queue whose policy dead-letters.
    origins = [queue_name(p, env) for p in topology.queues if queues[p].dead_letter is not None]
    redeliveries = [redelivery_topic(s, env) for s in subscriptions]
    described = [
        *topology.stream_names(),
        *topology.queue_names(),
        *(s.name for s in topology.internal_specs()),
    ]
    return [
        *_checked(redeliveries, "a retry checks its redelivery topic exists"),
        *_group_list(groups),
        *_topics(
            [*topology.stream_names(), *topology.queue_names()],
            (Operation.DESCRIBE,),
            "lag: each group's end offsets (ListOffsets) and committed offsets (OffsetFetch)",
        ),
        *_topics(
            [t for p in topology.queues for t in topology.retry_topics(p)],
            (Operation.DESCRIBE,),
            "lag of the workers over their retry topics",
        ),
        *_topics(
            [metrics_topic(env)], (Operation.DESCRIBE,), "lag of the analytics rollup's group"
        ),
        *_topics(
            described,
            (Operation.DESCRIBE_CONFIGS,),
            "status and topology show each topic's retention (DescribeConfigs)",
        ),
        *_topics(redeliveries, WRITE, "retry of an event letter: its subscription's redelivery"),
        *_topics(
            [audit_topic(env)],
            (Operation.READ, Operation.WRITE, Operation.DESCRIBE),
            "each letter's status change written there first; read from its start to rebuild "
            "the index and the audit logs (consumers/runtime/state_rebuild.py)",
        ),
        *_topics(origins, WRITE, "retry of a command letter: back to its origin queue"),
    ]


def _group_list(groups: Sequence[str]) -> list[KafkaAcl]:
    return [
        KafkaAcl(
            Resource.GROUP,
            Pattern.LITERAL,
            g,
            Operation.DESCRIBE,
            "lag: list the environment's groups (ListGroups shows only those it may describe) "
            "and read their committed offsets",
        )
        for g in groups
    ]


def _merged(acls: Iterable[KafkaAcl]) -> tuple[KafkaAcl, ...]:
    """One entry per (resource, pattern, name, operation), its reasons joined, sorted."""
    found: dict[KafkaAcl, list[str]] = {}
    for acl in acls:
        found.setdefault(acl, [])
        if acl.why and acl.why not in found[acl]:
            found[acl].append(acl.why)
    return tuple(sorted(dataclasses.replace(a, why="; ".join(w)) for a, w in found.items()))


# -- Redis ----------------------------------------------------------------------------------------
# redis-py's connect: PING. (It also sends CLIENT SETINFO and ignores a refusal; Redis 7.0 does not
# know that subcommand, so it cannot be named in a rule there.)
_CONNECT = RedisAccess("connect (consumers/redis_conn.py)", commands=("ping",))
# redis-py's Script: EVALSHA, and SCRIPT LOAD when the server does not know the script yet.
_SCRIPTS = ("evalsha", "script|load")
# A MULTI/EXEC pipeline (redis-py's pipeline() by default), and its WATCH check-and-set (UNWATCH
# when the pipeline is reset while watching).
_TRANSACTION = ("multi", "exec")
_CHECK_AND_SET = ("watch", "unwatch", *_TRANSACTION)


def _store(env: str, slug: str) -> RedisAccess:
    """consumers.runtime.redis_store: claims, fold, cursor, failures, pending effects, and the
    effects of the subscription's own keys, all under its hash tag; the commit script's calls."""
    return RedisAccess(
        f"the runtime store of {slug} (consumers/runtime/redis_store.py)",
        keys=(f"rh:{env}:{{{slug}|*",),
        # the state layout a partition without keys starts in (consumers/runtime/layout.py)
        read_keys=(f"rh:{env}:{{layout}}",),
        commands=(
            *_SCRIPTS,
            *_TRANSACTION,
            # the client's calls (redis-py's incr is INCRBY)
            "get",
            "hgetall",
            "hmget",
            "smismember",
            "smembers",
            "del",
            "expire",
            "type",
            "lrange",
            # the scripts' calls (the commit's Redis effects: consumers.runtime.store.OPS; the
            # commit's claim check: HSETNX today, HEXISTS earlier days, SISMEMBER the old day
            # sets; UNLINK a day past the claims' life; INCR the epoch with a WAIT)
            "hget",
            "hset",
            "hsetnx",
            "hexists",
            "sismember",
            "unlink",
            "incr",
            "hdel",
            "hincrby",
            "exists",
            "sadd",
            "srem",
            "scard",
            "expireat",
            "expiretime",
            "set",
            "incrby",
            "rpush",
            "lpush",
            "ltrim",
        ),
    )


def _dead_letters(env: str, *, manage: bool) -> RedisAccess:
    """consumers.runtime.dead_letters.KafkaRedisDeadLetters: the index of the one store. A
    subscription lists it too, and rebuilds it from the audit topic when Redis lost it or went
    back to an older copy (Controls.first_fold); a worker only writes it."""
    commands: tuple[str, ...] = ("exists", "set", "zadd", *_TRANSACTION)
    if manage:
        # and the rebuild: its marker, its lock (released by a script), its check-and-set
        commands += ("get", "mget", "zrange", "zrevrange", *_CHECK_AND_SET, *_SCRIPTS)
    return RedisAccess(
        "the dead-letter index (consumers/runtime/dead_letters.py)"
        + (": list, read, rebuild, retry and dismiss" if manage else ": write"),
        keys=(f"rh:{env}:{{dead-letters}}:*",),
        commands=commands,
    )


def _audit(env: str, slug: str) -> RedisAccess:
    return RedisAccess(
        f"the operator controls' audit log of {slug} (consumers/runtime/controls.py)",
        keys=(f"rh:{env}:{{audit}}:{slug}",),
        commands=("lpush", "lrange"),
    )


def _audit_rebuild(env: str) -> RedisAccess:
    return RedisAccess(
        "every audit log, given back what it lost by the rebuild (consumers/runtime/"
        "state_rebuild.py)",
        keys=(f"rh:{env}:{{audit}}:*",),
        commands=("lrange", "del", "rpush", *_CHECK_AND_SET),
    )


def _lease(env: str, slug: str) -> RedisAccess:
    return RedisAccess(
        f"the producer leases of {slug} (consumers/runtime/producer_lease.py)",
        keys=(f"rh:{env}:{{slots}}:{slug}:*",),
        commands=("set", *_SCRIPTS, "get", "expire", "del"),
    )


def _archive_cursor(env: str) -> RedisAccess:
    return RedisAccess(
        "the audit-archiver's cursor, read by the archive reader a refold past the stream's "
        "retention uses (router/wiring/archive.py)",
        read_keys=(f"rh:{env}:{{{ARCHIVER}|*}}:progress",),
        commands=("hgetall",),
    )


def _router_caps(env: str) -> RedisAccess:
    return RedisAccess(
        "the causal router's caps and maintenance (causal_router/budget.py, maintenance.py)",
        keys=(f"rh:{env}:{ROUTER}:*",),
        commands=(
            "incrby",  # redis-py's incr
            "expire",
            *_TRANSACTION,
            *_SCRIPTS,
            "sismember",
            "scard",
            "sadd",
            "get",
            "set",
            "del",
            "hgetall",
            "hset",
        ),
    )


def _workers(env: str) -> RedisAccess:
    return RedisAccess(
        "the workers' ledger, counters, index states, workflow registry and drills "
        "(router/workers/stores.py, helpers.py, drills.py)",
        keys=(f"rh:{env}:{{workers}}:*",),
        commands=(
            *_TRANSACTION,
            *_SCRIPTS,  # the ledger's completion marks: one script call a transaction
            "mget",
            "get",
            "set",
            "del",
            "hincrby",
            "hset",
            "hgetall",
        ),
    )


def _operator_reads(env: str) -> RedisAccess:
    return RedisAccess(
        "project views and feeds (consumers/subscriptions/projector/view.py) and the workers' "
        "figures (router/workers/stores.read_metrics), read only",
        read_keys=(f"rh:{env}:{{{PROJECTOR}|*", f"rh:{env}:{{workers}}:*"),
        commands=("scan", "hget", "hgetall", "smembers", "lrange"),
    )


def _pump_legacy(key: str) -> RedisAccess:
    return RedisAccess(
        "the legacy sequence an earlier pump kept (router/wiring/pump.py)",
        keys=(key,),
        commands=("get", "del"),
    )


def _redis_parts(
    role: str,
    env: str,
    queues: Sequence[str],
    pump_legacy_key: str,
    subscriptions: Mapping[str, EffectKind],
) -> tuple[RedisAccess, ...]:
    if role in (PROVISIONER, PUBLISHER, ANALYTICS_ROLLUP):
        return ()
    if role == PUMP:
        return (_CONNECT, _pump_legacy(pump_legacy_key), _audit(env, PUMP))
    if role == OPERATOR:
        return (
            _CONNECT,
            _dead_letters(env, manage=True),
            _audit_rebuild(env),
            _operator_reads(env),
        )
    if role in subscriptions:
        parts = [
            _CONNECT,
            _store(env, role),
            # Listed by a partition's first fold, and rebuilt with the audit logs when Redis
            # lost them or went back to an older copy (Controls.first_fold).
            _dead_letters(env, manage=True),
            _audit(env, role),
            _audit_rebuild(env),
            _archive_cursor(env),
        ]
        if subscriptions[role] == EffectKind.KAFKA:
            parts.append(_lease(env, role))
        if role == ROUTER:
            parts.append(_router_caps(env))
        return tuple(parts)
    purpose = _purpose_of(role, queues)
    parts = [_CONNECT, _lease(env, worker_slug(purpose)), _workers(env)]
    if purpose == DEAD_LETTER_QUEUE:
        parts.append(_dead_letters(env, manage=False))
    return tuple(parts)


# -- roles ---------------------------------------------------------------------------------------
def role_names(
    subscriptions: Sequence[str] = SUBSCRIPTIONS, queues: Sequence[str] = QUEUE_PURPOSES
) -> list[str]:
    """Every role, with one worker role per queue of ``queues`` (the settings': Topology.queues)."""
    return [
        PROVISIONER,
        PUBLISHER,
        *subscriptions,
        ANALYTICS_ROLLUP,
        *(worker_slug(p) for p in queues),
        PUMP,
        OPERATOR,
    ]


def _purpose_of(role: str, queues: Sequence[str]) -> str:
    for purpose in queues:
        if role == worker_slug(purpose):
            return purpose
    raise KeyError(f"unknown role {role!r}; known: {', '.join(role_names(queues=queues))}")


def _runs(role: str, queues: Sequence[str], subscriptions: Container[str]) -> str:
    if role == PROVISIONER:
        return "rhumbatron provision"
    if role == PUBLISHER:
        return "rhumbatron publish"
    if role == OPERATOR:
        return (
            "rhumbatron serve, dead-letters, status, topology, worker-stats, view (the operator "
            "service)"
        )
    if role == ANALYTICS_ROLLUP:
        return "rhumbatron analytics-rollup"
    if role == PUMP:
        return "rhumbatron pump (and its checkpoint, skip-through and forget)"
    if role in subscriptions:
        return f"rhumbatron consume --subscription {role}; rhumbatron subscription … --subscription {role}"
    purpose = _purpose_of(role, queues)
    if purpose == DEAD_LETTER_QUEUE:
        return "rhumbatron dead-letter-consumer"
    return f"rhumbatron worker --queue {purpose}"


def role(
    role_name: str,
    topology: Topology,
    queues: Mapping[str, QueuePolicy],
    subscriptions: Mapping[str, EffectKind] = BUILT_IN,
    *,
    pump_legacy_key: str = "last_sequence",
) -> Role:
    """What ``role_name`` needs in ``topology``'s environment, with these queue policies."""
    env = topology.env
    acls: list[KafkaAcl]
    if role_name == PUBLISHER:
        acls = [
            *_checked(topology.stream_names(), "publish refuses to start unless they exist"),
            *_stream_writer(topology, "the outbox publisher's idempotent producer"),
        ]
    elif role_name == PROVISIONER:
        acls = _provisioner(topology)
    elif role_name == OPERATOR:
        acls = _operator(topology, queues, list(subscriptions))
    elif role_name == ANALYTICS_ROLLUP:
        acls = _analytics_rollup(topology)
    elif role_name == PUMP:
        acls = _pump(topology)
    elif role_name in subscriptions:
        acls = _subscription(topology, role_name, subscriptions[role_name])
    else:
        purpose = _purpose_of(role_name, topology.queues)
        acls = _worker(topology, purpose, queues[purpose])
    return Role(
        role_name,
        _runs(role_name, topology.queues, subscriptions),
        _merged(acls),
        RedisUser(
            role_name,
            _redis_parts(role_name, env, topology.queues, pump_legacy_key, subscriptions),
        ),
    )


def roles(settings: Settings, *, env: str | None = None) -> list[Role]:
    """Every role of the settings' environment (or of ``env``, with the same plan): one per
    subscription it has, its own included (router.wiring.processors.known)."""
    from router.wiring.processors import effect_kinds

    topology = settings.topology
    if env is not None:
        topology = dataclasses.replace(topology, env=env)
    kinds = effect_kinds(settings)
    return [
        role(name, topology, settings.queues, kinds, pump_legacy_key=settings.pump_legacy_key)
        for name in role_names(list(kinds), queues=topology.queues)
    ]


def principal_of(role_name: str, env: str) -> str:
    """The principal a role's ACLs name unless another is given: one login per role and
    environment."""
    return f"User:rhumbatron-{role_name}-{env}"


# -- what a team runs -----------------------------------------------------------------------------
def kafka_acls_commands(
    acls: Sequence[KafkaAcl], principal: str, *, tool: str = "kafka-acls.sh"
) -> list[list[str]]:
    """``kafka-acls.sh --add`` commands granting ``acls`` to ``principal``: one per resource type,
    pattern and set of operations, naming every resource that takes that set. The connection
    options (``--bootstrap-server``, ``--command-config``) are the team's to add."""
    by_names: dict[tuple[Resource, Pattern, str], set[Operation]] = {}
    for acl in acls:
        by_names.setdefault((acl.resource, acl.pattern, acl.name), set()).add(acl.operation)
    batches: dict[tuple[Resource, Pattern, tuple[Operation, ...]], list[str]] = {}
    for (resource, pattern, name), granted in by_names.items():
        ordered = tuple(op for op in Operation if op in granted)
        batches.setdefault((resource, pattern, ordered), []).append(name)
    commands = []
    for (resource, pattern, operations), names in sorted(batches.items()):
        command = [tool, "--add", "--allow-principal", principal]
        for op in operations:
            command += ["--operation", _TOOL_OPERATION[op]]
        if resource == Resource.CLUSTER:
            command.append("--cluster")
        else:
            for name in names:
                command += [_TOOL_RESOURCE[resource], name]
        if pattern == Pattern.PREFIXED:
            command += ["--resource-pattern-type", "prefixed"]
        commands.append(command)
    return commands


def shell_line(command: Sequence[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def redis_setuser_line(user: RedisUser, username: str, password: str = "<password>") -> str:
    """The ``ACL SETUSER`` line for ``redis-cli``, the password as given (a placeholder by
    default: the team puts its own secret there, or a ``#<sha256>`` of it)."""
    return shell_line(user.setuser(username, password))


# -- what `rhumbatron acls` prints (and docs/security.md shows) ---------------------------------------
KAFKA_ACLS_TOOL = (
    'kafka-acls.sh --bootstrap-server "$KAFKA_BOOTSTRAP" --command-config "$KAFKA_ADMIN"'
)


def username_of(principal: str) -> str:
    """The user a ``User:<name>`` principal names: the same login serves Redis."""
    return principal.removeprefix("User:")


def table_lines(grant: Role, principal: str) -> list[str]:
    """``grant``'s Kafka ACLs, one row per resource with its operations, then its Redis user."""
    lines = [f"role {grant.name} ({grant.runs})", f"  kafka principal {principal}"]
    rows: dict[tuple[Resource, Pattern, str], list[str]] = {}
    for acl in grant.kafka:
        rows.setdefault((acl.resource, acl.pattern, acl.name), []).append(acl.operation.value)
    if rows:
        width = max(len("NAME"), *(len(name) for _, _, name in rows))
        lines.append(f"  {'RESOURCE':<16}  {'PATTERN':<8}  {'NAME':<{width}}  OPERATIONS")
        for (resource, pattern, name), operations in rows.items():
            ordered = [op.value for op in Operation if op.value in operations]
            lines.append(
                f"  {resource.value:<16}  {pattern.value:<8}  {name:<{width}}  {', '.join(ordered)}"
            )
    else:
        lines.append("  no Kafka ACLs")
    user = grant.redis
    if user.parts:
        lines.append(f"  redis user {username_of(principal)}")
        lines += [f"    keys (read and write): {k}" for k in user.keys]
        lines += [f"    keys (read only):      {k}" for k in user.read_keys]
        lines.append(f"    commands: {' '.join(user.commands)}")
    else:
        lines.append("  no Redis user (it never talks to Redis)")
    return lines


def command_lines(grant: Role, principal: str) -> list[str]:
    """The shell lines granting ``grant`` to ``principal``: ``kafka-acls.sh --add …`` (connection
    options as variables: the brokers, an admin's ``--command-config`` file) and ``redis-cli ACL
    SETUSER …`` (the password from ``$PASSWORD``)."""
    lines = [f"# {grant.name}: {grant.runs}"]
    for command in kafka_acls_commands(grant.kafka, principal):
        lines.append(f"{KAFKA_ACLS_TOOL} {shell_line(command[1:])}")
    user = grant.redis
    if user.parts:
        name = shlex.quote(username_of(principal))
        rules = shell_line(user.rules())
        lines.append(f'redis-cli ACL SETUSER {name} reset on ">$PASSWORD" {rules}')
    return lines
