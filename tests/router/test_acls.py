"""The grants router.wiring.acls derives are what the code really needs: each role's real commands
run as a login holding exactly those grants and nothing else — on Redis (an ACL user per role) and
on Kafka (a SCRAM user per role, through the broker's SASL_SSL listener with the authorizer on) —
and a step outside them is refused.

The Redis half uses the plain Kafka listener; the Kafka half needs infra/local.sh's secured
listener (client.env in tests.support.secured.SECURED_DIR) and runs each role with its Redis user
too. Users are
made through the servers' admin paths (Redis's default user; Kafka's PLAINTEXT listener, where
User:ANONYMOUS is a super user) and removed at the end."""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from consumers.topic_reader import read_committed
from router.settings import Settings
from router.wiring.acls import (
    ANALYTICS_ROLLUP,
    OPERATOR,
    PROVISIONER,
    PUBLISHER,
    PUMP,
    KafkaAcl,
    Pattern,
    Resource,
    Role,
    kafka_acls_commands,
    principal_of,
    role,
)
from router.wiring.analytics import fetch_view, rollup_app_id
from router.wiring.workers import worker_slug
from streams.admin import admin_client, delete_topics
from streams.errors import Unreachable
from streams.topology import group_id, metrics_topic, retry_topic
from streams.workload import project_ids
from tests.support.environment import ROOT, TEST_REDIS, cleanup_environment, make_settings
from tests.support.kafka_tools import add_acls, add_scram_user, tools_available
from tests.support.pump import feed, serving, write_feed
from tests.support.secured import SECURED_DIR, read_client_env
from tests.support.waiting import wait_until
from tests.support.workers import commands, env_of, send, short_queues

# Two to three minutes of real commands per role: run by `make test-slow` (and so by .ci/run).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENT_ENV = SECURED_DIR / "client.env"
PROJECTOR = "project-view-projector"
ROUTER = "causal-router"
ANALYTICS = "analytics-projector"
QUEUE = "agent-wakeups"
WORKER = worker_slug(QUEUE)
DEAD_LETTER_CONSUMER = worker_slug("dead-letter")
# Every role the flow runs, in the order it runs them.
ROLES = (
    PROVISIONER,
    PUBLISHER,
    PROJECTOR,
    ROUTER,
    ANALYTICS,
    ANALYTICS_ROLLUP,
    WORKER,
    DEAD_LETTER_CONSUMER,
    PUMP,
    OPERATOR,
)
# Where a role that never talks to Redis is pointed: nothing listens there, so any use fails.
NO_REDIS = "redis://127.0.0.1:1/0"
PROJECTS, EVENTS = 4, 40
FEED_EVENTS = 30  # pumped before the subscriptions run, so they read the feed's events too
CLI_TIMEOUT_S = 240.0
ROLLUP_SETTLE_S = 120.0  # how long the rollup may take to start and count every point


def _secured_variables() -> dict[str, str]:
    """How to reach the secured listener (client.env), without its admin login."""
    return {
        k: v for k, v in read_client_env(SECURED_DIR).items() if k.startswith("RHUMBATRON_KAFKA_")
    }


def _name_and_password(env: str, role_name: str) -> tuple[str, str]:
    return principal_of(role_name, env).removeprefix("User:"), secrets.token_hex(16)


# -- Redis users ----------------------------------------------------------------------------------
def _admin_redis() -> redis.Redis[bytes]:
    return redis.Redis.from_url(TEST_REDIS)


def _redis_denials(admin: redis.Redis[bytes], usernames: set[str]) -> list[dict[str, Any]]:
    """Entries of Redis's ACL log made by these users (a refusal the code swallowed shows here)."""
    entries: list[dict[str, Any]] = admin.acl_log(count=1000)
    return [e for e in entries if _text(e.get("username")) in usernames]


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class Logins:
    """Each role's login (one name and password for Kafka and Redis), made and removed here."""

    def __init__(self, s: Settings, *, kafka: bool) -> None:
        self.s = s
        self.kafka = kafka
        self.grants: dict[str, Role] = {name: role(name, s.topology, s.queues) for name in ROLES}
        self.logins = {name: _name_and_password(s.env, name) for name in ROLES}
        self.redis = _admin_redis()
        self.kafka_admin = AdminClient(s.kafka_config())

    @property
    def usernames(self) -> set[str]:
        return {name for name, _ in self.logins.values()}

    def create(self) -> None:
        for name, grant in self.grants.items():
            username, password = self.logins[name]
            if grant.redis.parts:
                self.redis.execute_command(*grant.redis.setuser(username, password))
        if self.kafka:
            self._kafka_users()
            self._kafka_acls()

    def _kafka_users(self) -> None:
        # Kafka's own tool makes the first; the admin client (the same request) the rest, faster.
        first, *rest = ROLES
        add_scram_user(*self.logins[first])
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                self.logins[name][0],
                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                self.logins[name][1].encode(),
            )
            for name in rest
        ]
        for future in self.kafka_admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout=30)

    def _kafka_acls(self) -> None:
        # The generated kafka-acls.sh lines themselves, through AclCommand, for the publisher; the
        # same bindings through the admin client for the others.
        publisher = self.grants[PUBLISHER]
        for command in kafka_acls_commands(publisher.kafka, self.principal(PUBLISHER)):
            add_acls(command[1:])
        bindings = [
            _binding(acl, self.principal(name))
            for name, grant in self.grants.items()
            if name != PUBLISHER
            for acl in grant.kafka
        ]
        for future in self.kafka_admin.create_acls(bindings).values():
            future.result(timeout=30)
        expected = sum(len(g.kafka) for g in self.grants.values())
        wait_until(
            lambda: self._granted() >= expected,
            timeout=30,
            what=f"{expected} ACLs of the environment's principals visible",
        )

    def _granted(self) -> int:
        described = self.kafka_admin.describe_acls(_all_of(None)).result(timeout=30)
        principals = {self.principal(name) for name in ROLES}
        return sum(1 for b in described if b.principal in principals)

    def principal(self, name: str) -> str:
        return f"User:{self.logins[name][0]}"

    def env_for(self, name: str) -> dict[str, str]:
        """A CLI process's environment as ``name``: its Redis user (or no Redis at all), and on
        the secured listener its Kafka login."""
        env = env_of(self.s)
        username, password = self.logins[name]
        if self.grants[name].redis.parts:
            env["RHUMBATRON_REDIS_USERNAME"] = username
            env["RHUMBATRON_REDIS_PASSWORD"] = password
        else:
            env["RHUMBATRON_REDIS_URL"] = NO_REDIS
        if self.kafka:
            env.update(_secured_variables())
            env["RHUMBATRON_KAFKA_SASL_USERNAME"] = username
            env["RHUMBATRON_KAFKA_SASL_PASSWORD"] = password
        return env

    def kafka_client(self, name: str) -> dict[str, Any]:
        """librdkafka settings to act as ``name`` on the secured listener."""
        secured = _secured_variables()
        username, password = self.logins[name]
        return {
            "bootstrap.servers": secured["RHUMBATRON_KAFKA_BOOTSTRAP"],
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": secured["RHUMBATRON_KAFKA_SASL_MECHANISM"],
            "sasl.username": username,
            "sasl.password": password,
            "ssl.ca.location": secured["RHUMBATRON_KAFKA_SSL_CA_FILE"],
        }

    def remove(self) -> None:
        for username in self.usernames:
            with contextlib.suppress(redis.RedisError):
                self.redis.execute_command("ACL", "DELUSER", username)
        if not self.kafka:
            return
        principals = {self.principal(name) for name in ROLES}
        try:
            for principal in principals:
                for future in self.kafka_admin.delete_acls([_all_of(principal)]).values():
                    future.result(timeout=30)
            deletions: list[UserScramCredentialAlteration] = [
                UserScramCredentialDeletion(u, ScramMechanism.SCRAM_SHA_512) for u in self.usernames
            ]
            for future in self.kafka_admin.alter_user_scram_credentials(deletions).values():
                future.result(timeout=30)
        except Exception:  # removal is best effort; the test's own result stands
            pass


_RESOURCE = {
    Resource.TOPIC: ResourceType.TOPIC,
    Resource.GROUP: ResourceType.GROUP,
    Resource.TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
    Resource.CLUSTER: ResourceType.BROKER,
}


def _binding(acl: KafkaAcl, principal: str) -> AclBinding:
    pattern = (
        ResourcePatternType.PREFIXED
        if acl.pattern == Pattern.PREFIXED
        else ResourcePatternType.LITERAL
    )
    return AclBinding(
        _RESOURCE[acl.resource],
        acl.name,
        pattern,
        principal,
        "*",
        AclOperation[acl.operation.value],
        AclPermissionType.ALLOW,
    )


def _all_of(principal: str | None) -> AclBindingFilter:
    """Every ACL (of ``principal``, if given): confluent-kafka's stubs say str where None means
    any."""
    anything: Any = None
    return AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        principal if principal is not None else anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


# -- the flow -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    s = make_settings(
        queues=short_queues(0.5, retries=1),
        analytics_rollup_port=_free_port(),
        analytics_rollup_dir=str(tmp_path / "rollup"),
        router_outbox_path=str(tmp_path / "router-outbox.sqlite"),
        session_timeout_ms=6000,
        transaction_timeout_ms=8000,
        producer_lease_ttl_s=6,
        outbox_poll_interval_s=0.2,
    )
    yield s
    try:  # the rollup's own topics are named after its app id, not ending with the environment
        admin = admin_client(s.kafka_config())
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(rollup_app_id(s))]
        delete_topics(admin, s.kafka_config(), mine, timeout=30)
    except Exception:  # cleanup is best effort
        pass
    cleanup_environment(s)


def _runner(logins: Logins) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [".venv/bin/python", "-m", "router.cli", *args],
            cwd=ROOT,
            env=logins.env_for(name),
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        if check:
            assert result.returncode == 0, (
                f"as {name}: rhumbatron {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stderr[-3000:]}"
            )
        return result

    return run


def _count(stderr: str, slug: str, what: str) -> int:
    """A figure of consume's summary line (``<slug>: … N applied, … N poison …``)."""
    line = next(line for line in stderr.splitlines() if line.startswith(f"{slug}: "))
    found = re.search(rf"(\d+) {what}\b", line)
    assert found is not None, line
    return int(found.group(1))


def _poison(s: Settings) -> None:
    """A record that is not an envelope, on the first stream: every subscription dead-letters it."""
    producer = Producer(s.kafka_config())
    producer.produce(s.topology.stream_names()[0], b"\x00not an envelope\xff", key=b"p")
    assert producer.flush(30) == 0


def _analytics(s: Settings, logins: Logins, tmp_path: Path) -> None:
    """The analytics projector writes its points in transactions; the faust rollup, as its own
    role, creates its topics and counts every point."""
    run = _runner(logins)
    analytics = run(ANALYTICS, "consume", "--subscription", ANALYTICS, "--until-idle", "4")
    assert _count(analytics.stderr, ANALYTICS, "applied") > 0, analytics.stderr
    # With Kafka logins, read as the rollup's, which has no rights on the reader's random group.
    reader = logins.kafka_client(ANALYTICS_ROLLUP) if logins.kafka else s.kafka_config()
    points = read_committed(reader, [metrics_topic(s.env)], lambda _: None, timeout_s=60)
    assert points > 0
    log = tmp_path / "rollup.log"
    rollup = subprocess.Popen(
        [".venv/bin/python", "-m", "router.cli", "analytics-rollup", "--log-level", "info"],
        cwd=ROOT,
        env=logins.env_for(ANALYTICS_ROLLUP),
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
    try:
        deadline = time.monotonic() + ROLLUP_SETTLE_S
        counted = -1
        while time.monotonic() < deadline and counted < points:
            assert rollup.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(Unreachable):  # not up yet, or recovering its tables
                counted = fetch_view(s, "/analytics/status/")["pointsCounted"]
            time.sleep(0.3)
        assert counted == points, log.read_text()[-3000:]
    finally:
        if rollup.poll() is None:
            rollup.kill()
        rollup.wait(30)


def _exercise(s: Settings, logins: Logins, tmp_path: Path) -> None:
    """Each role's real commands, as that role: provision, publish, two subscriptions (one with
    Kafka effects), a worker whose command is dead-lettered, the dead-letter consumer, the feed
    pump, and the operator's reads and actions."""
    run = _runner(logins)
    run(PROVISIONER, "provision")

    outbox = str(tmp_path / "outbox.sqlite")
    workload = secrets.token_hex(4)
    run(
        PUBLISHER,
        "produce",
        "--outbox",
        outbox,
        "--run",
        workload,
        "--projects",
        str(PROJECTS),
        "--events",
        str(EVENTS),
    )
    published = orjson.loads(
        run(PUBLISHER, "publish", "--outbox", outbox, "--until-empty", "--json").stdout
    )
    assert published["published"] == EVENTS

    path = write_feed(tmp_path / "feed.ndjson", feed(f"{workload}-feed", FEED_EVENTS, projects=3))
    with serving(path, page_size=10) as server:
        pumped = run(PUMP, "pump", "--feed", server.url, "--once", "--json").stdout
        assert orjson.loads(pumped)["published"] == FEED_EVENTS, pumped
        shown = run(PUMP, "pump", "checkpoint", "--feed", server.url, "--json").stdout
        assert orjson.loads(shown)["checkpoint"]["sequence"] == FEED_EVENTS, shown

    _poison(s)
    send(s, commands(3, "ok") + commands(1, "bad", drill="fail"))

    projector = run(PROJECTOR, "consume", "--subscription", PROJECTOR, "--until-idle", "4")
    applied = _count(projector.stderr, PROJECTOR, "applied")
    assert applied == EVENTS + FEED_EVENTS, projector.stderr
    assert _count(projector.stderr, PROJECTOR, "poison") == 1, projector.stderr

    router = run(ROUTER, "consume", "--subscription", ROUTER, "--until-idle", "4")
    assert _count(router.stderr, ROUTER, "applied") >= 1, router.stderr

    _analytics(s, logins, tmp_path)

    worker = run(WORKER, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "4")
    stats = orjson.loads(worker.stdout.strip().splitlines()[-1])
    assert stats["dead_lettered"] == 1, worker.stdout

    run(DEAD_LETTER_CONSUMER, "dead-letter-consumer", "--until-idle", "4")

    letters = orjson.loads(run(OPERATOR, "dead-letters", "list", "--json").stdout)
    poisoned = sorted(letter["subscription"] for letter in letters if letter["kind"] == "poison")
    assert poisoned == sorted([PROJECTOR, ROUTER, ANALYTICS]), letters  # each dead-letters it
    assert [letter["kind"] for letter in letters].count("command") == 1, letters
    command = next(letter for letter in letters if letter["kind"] == "command")
    poison = next(letter for letter in letters if letter["kind"] == "poison")
    run(OPERATOR, "dead-letters", "retry", command["id"], "--who", "t", "--reason", "acl test")
    run(OPERATOR, "dead-letters", "dismiss", poison["id"], "--who", "t", "--reason", "acl test")
    status = orjson.loads(run(OPERATOR, "status", "--json").stdout)
    assert {
        group_id(PROJECTOR, s.env),
        group_id(ROUTER, s.env),
        group_id(WORKER, s.env),
    } <= set(status["groups"]), status["groups"]
    assert status["groups"][group_id(PROJECTOR, s.env)]["total_lag"] == 0, status["groups"]
    run(OPERATOR, "view", project_ids(workload, PROJECTS)[0], "--json")


# -- Redis ----------------------------------------------------------------------------------------
def test_each_role_runs_with_only_its_redis_user(settings: Settings, tmp_path: Path) -> None:
    logins = Logins(settings, kafka=False)
    logins.create()
    try:
        _exercise(settings, logins, tmp_path)
        assert _redis_denials(logins.redis, logins.usernames) == []
        _redis_refusals(settings, logins)
    finally:
        logins.remove()


def _redis_refusals(s: Settings, logins: Logins) -> None:
    """A step outside a role's keys or commands is NOPERM."""

    def as_role(name: str) -> redis.Redis[bytes]:
        username, password = logins.logins[name]
        return redis.Redis.from_url(TEST_REDIS, username=username, password=password)

    env = s.env
    projector, operator = as_role(PROJECTOR), as_role(OPERATOR)
    router_key = f"rh:{env}:{{{ROUTER}|{s.topology.stream_names()[0]}|0}}:progress"
    with pytest.raises(redis.exceptions.NoPermissionError):
        projector.hgetall(router_key)  # another subscription's cursor
    with pytest.raises(redis.exceptions.NoPermissionError):
        projector.get(f"rh:other{env}:{{{PROJECTOR}|x|0}}:progress")  # another environment
    with pytest.raises(redis.exceptions.NoPermissionError):
        projector.flushdb()
    with pytest.raises(redis.exceptions.NoPermissionError):
        projector.keys("*")
    view_key = f"rh:{env}:{{{PROJECTOR}|{s.topology.stream_names()[0]}|0}}:progress"
    assert operator.hgetall(view_key) is not None  # the operator reads views ...
    with pytest.raises(redis.exceptions.NoPermissionError):
        operator.hset(view_key, "acked_through", "0")  # ... and never writes them
    with pytest.raises(redis.exceptions.NoPermissionError):
        operator.hgetall(router_key)


# -- Kafka ----------------------------------------------------------------------------------------
@pytest.mark.skipif(
    not CLIENT_ENV.exists(),
    reason=f"the broker's secured listener is not set up ({CLIENT_ENV} is missing: infra/local.sh "
    "makes it at start; RHUMBATRON_TEST_KAFKA_SECURED_DIR names another broker's)",
)
@pytest.mark.skipif(not tools_available(), reason="Kafka's tools are not in .local/kafka/jars")
def test_each_role_runs_with_only_its_kafka_acls(settings: Settings, tmp_path: Path) -> None:
    logins = Logins(settings, kafka=True)
    logins.create()
    try:
        _exercise(settings, logins, tmp_path)
        assert _redis_denials(logins.redis, logins.usernames) == []
        _kafka_refusals(settings, logins)
    finally:
        logins.remove()


def _kafka_refusals(s: Settings, logins: Logins) -> None:
    """What each role must not do, refused by the broker."""
    stray = make_settings()  # a mistyped RHUMBATRON_ENV: nothing may be created for it
    try:
        env = logins.env_for(PUBLISHER) | {"RHUMBATRON_ENV": stray.env}
        result = subprocess.run(
            [".venv/bin/python", "-m", "router.cli", "provision"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        assert result.returncode != 0, result.stdout
        made = AdminClient(s.kafka_config()).list_topics(timeout=10).topics
        assert not [t for t in made if t.endswith(stray.env)], "the publisher created topics"
    finally:
        cleanup_environment(stray)

    stream = s.topology.stream_names()[0]
    # A subscription cannot take another's group, nor write the streams.
    assert _group_refused(logins.kafka_client(PROJECTOR), group_id(ROUTER, s.env), stream)
    assert _write_refused(logins.kafka_client(PROJECTOR), stream)
    # A worker cannot write another queue's retries (its follow-ups may go to any queue).
    assert _write_refused(logins.kafka_client(WORKER), retry_topic("release", s.env))
    # The operator sees lag and offsets, and reads no record.
    assert _read_refused(logins.kafka_client(OPERATOR), stream)


def _group_refused(config: dict[str, Any], group: str, topic: str) -> bool:
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for message in consumer.consume(10, timeout=1):
                error = message.error()
                if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    return True
                if error is None:
                    return False
        return False
    finally:
        consumer.close()


def _write_refused(config: dict[str, Any], topic: str) -> bool:
    producer = Producer(config)
    reports: list[KafkaError | None] = []
    producer.produce(topic, b"x", on_delivery=lambda err, _: reports.append(err))
    producer.flush(30)
    return (
        bool(reports)
        and reports[0] is not None
        and reports[0].code()
        in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError._UNKNOWN_TOPIC,
            KafkaError.UNKNOWN_TOPIC_OR_PART,
        )
    )


def _read_refused(config: dict[str, Any], topic: str) -> bool:
    consumer = Consumer({**config, "group.id": f"rhumbatron-reader-{secrets.token_hex(6)}"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for message in consumer.consume(10, timeout=1):
                error = message.error()
                if error is None:
                    return False
                if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    return True
        return False
    finally:
        consumer.close()
