"""The stores on a Redis Cluster of their own (3 masters, 3 replicas, from infra/local.sh): the
Store, worker-ledger, worker-metrics and dead-letter contracts, the client the settings choose,
the keys of a partition in one slot, scans over every master, and WAIT."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import cast

import pytest
import redis
from redis.cluster import RedisCluster

from consumers.redis_conn import Wait, connect_cluster, is_cluster
from consumers.runtime.dead_letters import DeadLetterStore
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.store import Commit, Store
from consumers.runtime.types import TP, Progress, RedisOp
from consumers.subscriptions.ledger import read_ledger
from router.wiring.subscription import dead_letters, redis_client, store
from router.workers.stores import (
    CommandLedger,
    RedisCommandLedger,
    RedisWorkerMetrics,
    WorkerMetrics,
    read_metrics,
)
from streams.clock import ManualClock
from streams.errors import ConfigurationError, ReplicasBehind, Unreachable
from tests.consumers.runtime import test_dead_letters_kafka
from tests.contracts.store import StoreContract
from tests.contracts.worker_ledgers import CommandLedgerContract, WorkerMetricsContract
from tests.support.environment import TEST_REDIS, make_settings
from tests.support.infra import PrivateServices

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
# The cluster has one replica a master: asking two can never be met.
WAIT_ONE = Wait(1, 5000)


@pytest.fixture(scope="module")
def seeds() -> Iterator[str]:
    with PrivateServices(kafka=False, redis=False, redis_cluster=True) as svc:
        yield svc.redis_cluster_seeds


@pytest.fixture(scope="module")
def cluster(seeds: str) -> Iterator[redis.Redis[bytes]]:
    client = connect_cluster(seeds, url=TEST_REDIS, timeout=5)
    yield client
    client.close()


def _store(client: redis.Redis[bytes], wait: Wait | None = None) -> RedisStore:
    return RedisStore(
        client,
        env="t" + secrets.token_hex(5),
        slug="contract",
        clock=ManualClock(datetime.now(UTC)),
        claim_ttl_ms=8 * DAY_MS,
        wait=wait,
    )


class TestClusterStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _client(self, cluster: redis.Redis[bytes]) -> None:
        self.client = cluster

    def make_store(self) -> Store:
        return _store(self.client)


class TestClusterStoreWaitingForAReplica(StoreContract):
    """The same contract with every write waiting for one replica's acknowledgement."""

    @pytest.fixture(autouse=True)
    def _client(self, cluster: redis.Redis[bytes]) -> None:
        self.client = cluster

    def make_store(self) -> Store:
        return _store(self.client, WAIT_ONE)


class TestClusterCommandLedger(CommandLedgerContract):
    @pytest.fixture(autouse=True)
    def _client(self, cluster: redis.Redis[bytes]) -> None:
        self.client = cluster
        self.env = "t" + secrets.token_hex(5)

    def make_ledger(self) -> CommandLedger:
        return RedisCommandLedger(self.client, env=self.env, ttl_ms=3_600_000, wait=WAIT_ONE)


class TestClusterWorkerMetrics(WorkerMetricsContract):
    @pytest.fixture(autouse=True)
    def _client(self, cluster: redis.Redis[bytes]) -> None:
        self.client = cluster
        self.env = "t" + secrets.token_hex(5)

    def make_metrics(self) -> WorkerMetrics:
        return RedisWorkerMetrics(self.client, env=self.env)

    def read_metrics(self) -> dict[str, dict[str, int]]:
        return read_metrics(self.client, self.env)


class TestClusterDeadLetters(test_dead_letters_kafka.TestKafkaRedisDeadLetters):
    """The dead-letter store's index on the cluster (its keys share the ``{dead-letters}`` tag,
    so its MULTI and its WATCH check-and-set are one slot); its records on the shared Kafka."""

    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: redis.Redis[bytes]) -> None:
        self.cluster = cluster

    def make_store(self) -> DeadLetterStore:
        return dead_letters(self.settings, self.cluster)


def test_the_client_follows_the_setting(seeds: str) -> None:
    single = redis_client(make_settings())
    clustered = redis_client(make_settings(redis_cluster=seeds))
    try:
        assert type(single) is redis.Redis and not is_cluster(single)
        made: object = clustered  # typed as redis.Redis: connect_cluster's promise
        assert isinstance(made, RedisCluster) and is_cluster(clustered)
        assert {n.name for n in made.get_primaries()} <= set(seeds.split(","))
    finally:
        single.close()
        clustered.close()


def test_the_wait_setting_reaches_the_runtime_store(seeds: str) -> None:
    s = make_settings(redis_cluster=seeds, redis_wait_replicas=1, redis_wait_timeout_ms=250)
    client = redis_client(s)
    try:
        assert store(s, client, "ledger", ManualClock(datetime.now(UTC))).wait == Wait(1, 250)
        assert store(make_settings(), client, "ledger", ManualClock(datetime.now(UTC))).wait is None
    finally:
        client.close()


def test_a_seed_that_is_not_in_cluster_mode_is_a_configuration_error_naming_the_setting() -> None:
    plain = TEST_REDIS.split("//", 1)[1].split("/", 1)[0]  # the shared, single Redis
    with pytest.raises(ConfigurationError, match="RHUMBATRON_REDIS_CLUSTER=.*not enabled"):
        redis_client(make_settings(redis_cluster=plain))


def test_unreachable_seeds_are_reported_naming_the_setting() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unreachable, match="RHUMBATRON_REDIS_CLUSTER"):
        redis_client(make_settings(redis_cluster=f"127.0.0.1:{port}", connect_timeout_s=1))


def test_every_key_of_a_partition_is_in_one_slot_and_partitions_spread_over_masters(
    cluster: redis.Redis[bytes],
) -> None:
    s = _store(cluster)
    tp = TP("events_x", 3)
    keys = [s.prefix(tp) + k for k in ("progress", "epoch", "state", "pending", "claims:1:2")]
    keys.append(s.key(tp, "ledger:project:p1"))
    on = cast("RedisCluster[bytes]", cluster)
    assert len({on.keyslot(k) for k in keys}) == 1
    masters = {str(on.get_node_from_key(s.prefix(TP("events_x", p)))) for p in range(32)}
    assert len(masters) == 3, masters


def test_a_commit_fewer_replicas_acknowledged_is_refused_naming_the_setting(
    cluster: redis.Redis[bytes],
) -> None:
    s = _store(cluster, Wait(2, 100))
    tp = TP("events_x", 0)
    with pytest.raises(ReplicasBehind, match="1 of 2 replicas.*RHUMBATRON_REDIS_WAIT_REPLICAS"):
        s.acquire(tp)
    # The write itself stands on the primary (WAIT cannot undo it): a retry sees it.
    assert s.epoch(tp) == 1
    ok = _store(cluster, WAIT_ONE)
    ok.env = s.env
    assert ok.acquire(tp) == 2


def test_scans_read_every_master(cluster: redis.Redis[bytes]) -> None:
    s = _store(cluster)
    s.slug = "ledger"
    want: dict[str, int] = {}
    for partition in range(12):  # over every master (see above)
        tp = TP("events_x", partition)
        epoch = s.acquire(tp)
        event_id = f"e{partition}"
        want[event_id] = 1
        s.commit(
            Commit(
                tp=tp,
                epoch=epoch,
                expected_acked=-1,
                expected_revision=0,
                progress=Progress(acked_through=0),
                claims=[event_id],
                redis=[
                    RedisOp("RPUSH", f"ledger:project:p{partition}", (1,)),
                    RedisOp("HINCRBY", "ledger:counts", (event_id, 1)),
                ],
            )
        )
    ledger = read_ledger(cluster, s.env)
    assert ledger["counts"] == want
    assert ledger["projects"] == {f"p{p}": [1] for p in range(12)}
