"""The grants router.wiring.acls derives: the same names the wiring uses, nothing outside the role's
environment, the refusals that matter built in, and docs/security.md's generated examples equal to
what the function prints today. (tests/router/test_acls.py runs them on the real servers.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from consumers.runtime.types import EffectKind
from router.settings import Settings
from router.wiring import acls
from router.wiring.acls import (
    ANALYTICS_ROLLUP,
    BUILT_IN,
    KAFKA_OUTPUTS,
    OPERATOR,
    PROVISIONER,
    PUBLISHER,
    PUMP,
    SUBSCRIPTIONS,
    Operation,
    Pattern,
    Resource,
    Role,
    kafka_acls_commands,
    role,
    role_names,
    roles,
)
from router.wiring.groups import ROLLUP_SLUG, group_reads
from router.wiring.processors import build_processor, effect_kinds, subscription_slugs
from router.wiring.provisioning import environment_specs
from router.wiring.workers import worker_slug
from streams.clock import SystemClock
from streams.topology import QUEUE_PURPOSES, group_id, queue_name


@pytest.fixture
def prod() -> Settings:
    return Settings(env="prod", streams=2)


def _by_name(s: Settings) -> dict[str, Role]:
    return {r.name: r for r in roles(s)}


def _names(grant: Role, resource: Resource, operation: Operation) -> set[str]:
    return {a.name for a in grant.kafka if a.resource == resource and a.operation == operation}


def test_every_grant_stays_in_its_environment(prod: Settings) -> None:
    for grant in roles(prod):
        for acl in grant.kafka:
            assert acl.resource != Resource.CLUSTER, acl  # nothing cluster-wide, ever
            if acl.pattern == Pattern.PREFIXED:
                assert acl.name.endswith("-prod-"), acl  # no other environment shares it
            else:
                assert re.search(r"[-_]prod$", acl.name), acl
            assert acl.why, acl
        for key in (*grant.redis.keys, *grant.redis.read_keys):
            if grant.name == PUMP and key == prod.pump_legacy_key:
                continue  # the earlier pump's key, where it kept it: the one key outside
            assert key.startswith("rh:prod:"), (grant.name, key)
        for command in grant.redis.commands:
            assert command not in ("keys", "flushdb", "flushall", "config", "eval", "acl"), command


def test_only_the_provisioner_and_the_rollup_create_topics(prod: Settings) -> None:
    for grant in roles(prod):
        created = _names(grant, Resource.TOPIC, Operation.CREATE)
        if grant.name == PROVISIONER:
            assert created == {s.name for s in environment_specs(prod.topology)}
        elif grant.name == ANALYTICS_ROLLUP:
            assert created == {"rhumbatron-analytics-rollup-prod-"}  # faust's own topics
        else:
            assert not created, grant.name
        altered = _names(grant, Resource.TOPIC, Operation.ALTER_CONFIGS)
        assert not altered or grant.name == PROVISIONER


def test_each_group_is_its_own_roles_and_read_over_the_topics_the_lag_report_knows(
    prod: Settings,
) -> None:
    grants = _by_name(prod)
    topology = prod.topology
    members = {
        **{s: group_id(s, "prod") for s in SUBSCRIPTIONS},
        **{worker_slug(p): group_id(worker_slug(p), "prod") for p in QUEUE_PURPOSES},
        ANALYTICS_ROLLUP: group_id(ROLLUP_SLUG, "prod"),
    }
    for name, group in members.items():
        reads = group_reads(topology, group)
        grant = grants[name]
        assert _names(grant, Resource.GROUP, Operation.READ) == {group}
        assert set(reads.subscribed) | set(reads.assigned) <= _names(
            grant, Resource.TOPIC, Operation.READ
        )
        for other, other_grant in grants.items():
            if other != name:
                assert group not in _names(other_grant, Resource.GROUP, Operation.READ), other
    operator = grants[OPERATOR]
    assert _names(operator, Resource.GROUP, Operation.DESCRIBE) == set(members.values())
    assert not _names(operator, Resource.GROUP, Operation.READ)
    # lag, never records; but the audit topic's, which the index is rebuilt from
    assert _names(operator, Resource.TOPIC, Operation.READ) == {"rhumbatron_audit_prod"}


def test_the_publisher_writes_the_streams_and_nothing_else(prod: Settings) -> None:
    publisher = _by_name(prod)[PUBLISHER]
    streams = set(prod.topology.stream_names())
    assert {(a.resource, a.name) for a in publisher.kafka} == {(Resource.TOPIC, s) for s in streams}
    assert _names(publisher, Resource.TOPIC, Operation.WRITE) == streams
    assert not publisher.redis.parts  # it never talks to Redis


def test_transactional_ids_only_where_effects_go_to_kafka(prod: Settings) -> None:
    grants = _by_name(prod)
    transactional = {
        name
        for name, grant in grants.items()
        if _names(grant, Resource.TRANSACTIONAL_ID, Operation.WRITE)
    }
    workers = {worker_slug(p) for p in QUEUE_PURPOSES}
    assert transactional == {*KAFKA_OUTPUTS, *workers, ANALYTICS_ROLLUP, PUMP}
    # streams.pump.kafka.pump_transactional_id(env, feed) for any feed
    assert _names(grants[PUMP], Resource.TRANSACTIONAL_ID, Operation.WRITE) == {
        "rhumbatron-pump-prod-"
    }
    for name in {*KAFKA_OUTPUTS, *workers}:
        # streams.topology.transactional_id(name, env, lease) for any lease
        assert _names(grants[name], Resource.TRANSACTIONAL_ID, Operation.WRITE) == {
            f"rhumbatron-{name}-prod-"
        }


def test_a_worker_writes_its_retry_topics_and_every_queue(prod: Settings) -> None:
    """Its own queue and retry topics (retries, further deliveries), the dead-letter queue, and
    any queue: a handler's follow-ups (ctx.send) go to the queue of their type."""
    grants = _by_name(prod)
    queues = {queue_name(p, "prod") for p in QUEUE_PURPOSES}
    for purpose in QUEUE_PURPOSES:
        writes = _names(grants[worker_slug(purpose)], Resource.TOPIC, Operation.WRITE)
        tiers = {f"rhumbatron-{purpose}-retry-{t}s-prod" for t in prod.retry_tiers_s}
        expected = {f"rhumbatron-{purpose}-retry-prod", *tiers} | queues
        if purpose == "dead-letter":
            expected |= set(prod.topology.stream_names()) | {
                "rhumbatron_dead_letters_prod",
                "rhumbatron_audit_prod",
            }
        assert writes == expected, purpose


def test_a_queue_of_your_own_has_its_workers_role_and_the_others_reach_it() -> None:
    s = Settings(env="prod", streams=2, queues={"payments": {"dead_letter": "integration"}})
    grants = _by_name(s)
    assert [r.name for r in roles(s)] == role_names(queues=s.topology.queues)
    assert "worker-payments" in grants and grants["worker-payments"].runs == (
        "rhumbatron worker --queue payments"
    )
    mine = grants["worker-payments"]
    tiers = {f"rhumbatron-payments-retry-{t}s-prod" for t in s.retry_tiers_s}
    own = {"rhumbatron-payments-prod", "rhumbatron-payments-retry-prod", *tiers}
    assert _names(mine, Resource.TOPIC, Operation.READ) == own
    every_queue = {queue_name(q, "prod") for q in s.topology.queues}
    assert _names(mine, Resource.TOPIC, Operation.WRITE) == own | every_queue
    assert _names(mine, Resource.GROUP, Operation.READ) == {"rhumbatron-worker-payments-prod"}
    assert _names(mine, Resource.TRANSACTIONAL_ID, Operation.WRITE) == {
        "rhumbatron-worker-payments-prod-"
    }
    assert mine.redis.parts  # its lease and the workers' keys
    created = _names(grants[PROVISIONER], Resource.TOPIC, Operation.CREATE)
    assert own <= created
    operator = grants[OPERATOR]
    assert "rhumbatron-worker-payments-prod" in _names(operator, Resource.GROUP, Operation.DESCRIBE)
    assert "rhumbatron-payments-prod" in _names(operator, Resource.TOPIC, Operation.WRITE)
    assert own <= _names(operator, Resource.TOPIC, Operation.DESCRIBE)
    with pytest.raises(KeyError, match="unknown role 'worker-payments'"):
        role("worker-payments", Settings(env="prod").topology, s.queues)


def test_the_table_of_kafka_outputs_is_the_processors_effect_kinds(
    prod: Settings, tmp_path: Path
) -> None:
    s = prod.model_copy(update={"archive_dir": str(tmp_path)})
    client: redis.Redis[bytes] = redis.Redis()  # built, never connected: no processor calls it
    for slug in SUBSCRIPTIONS:
        processor = build_processor(s, slug, client, SystemClock())
        assert (processor.effect_kind == EffectKind.KAFKA) == (slug in KAFKA_OUTPUTS), slug
        # What each factory declares (acls read it without building) is what it builds.
        assert processor.effect_kind == BUILT_IN[slug] == effect_kinds(s)[slug], slug


def test_a_subscription_writes_only_its_own_redis_keys(prod: Settings) -> None:
    grants = _by_name(prod)
    for slug in SUBSCRIPTIONS:
        keys = grants[slug].redis.keys
        assert f"rh:prod:{{{slug}|*" in keys
        for other in SUBSCRIPTIONS:
            if other != slug:
                assert not [k for k in keys if other in k and not k.startswith("rh:prod:{dead")]
    operator = grants[OPERATOR].redis
    # everything else read only; the audit logs written by the rebuild alone
    assert operator.keys == ("rh:prod:{dead-letters}:*", "rh:prod:{audit}:*")


def test_the_commands_name_every_acl_once(prod: Settings) -> None:
    """kafka-acls.sh lines granting exactly the role's ACLs, parsed back."""
    for grant in roles(prod):
        seen = set()
        for command in kafka_acls_commands(grant.kafka, "User:x"):
            ops = [command[i + 1] for i, a in enumerate(command) if a == "--operation"]
            names = [
                (a, command[i + 1])
                for i, a in enumerate(command)
                if a in ("--topic", "--group", "--transactional-id")
            ]
            prefixed = "--resource-pattern-type" in command
            for flag, name in names:
                for op in ops:
                    key = (flag, name, op, prefixed)
                    assert key not in seen
                    seen.add(key)
        assert len(seen) == len(grant.kafka), grant.name


def test_redis_rules_reset_everything_first(prod: Settings) -> None:
    user = _by_name(prod)["project-view-projector"].redis
    line = user.setuser("u", "pw")
    assert line[:6] == ["ACL", "SETUSER", "u", "reset", "on", ">pw"]
    assert "resetchannels" in line and not any(r.startswith("+@") for r in line)


def test_every_role_is_known(prod: Settings) -> None:
    assert [r.name for r in roles(prod)] == role_names()
    with pytest.raises(KeyError):
        role("nobody", prod.topology, prod.queues)
    assert list(acls.SUBSCRIPTIONS) == subscription_slugs(prod)  # every one consume can run
