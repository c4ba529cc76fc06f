"""The Store contract against real Redis, plus what only Redis has: hash tags, claim buckets."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest
import redis

from consumers.redis_conn import connect
from consumers.runtime.redis_store import RedisStore
from consumers.runtime.store import Commit, Store
from consumers.runtime.types import Progress
from streams.clock import ManualClock
from tests.contracts.store import EVT, TPX, StoreContract
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration

DAY_S = 86_400


def _now() -> ManualClock:
    # Bucket expiry is absolute (EXPIREAT): the clock must agree with Redis's own.
    return ManualClock(datetime.now(UTC))


def _client() -> redis.Redis[bytes]:
    return connect(TEST_REDIS, timeout=5)


class TestRedisStore(StoreContract):
    def make_store(self) -> Store:
        return RedisStore(
            _client(),
            env="t" + secrets.token_hex(5),
            slug="contract",
            clock=_now(),
            claim_ttl_ms=8 * DAY_S * 1000,
        )


def test_every_key_of_a_partition_shares_one_hash_tag() -> None:
    client = _client()
    env = "t" + secrets.token_hex(5)
    store = RedisStore(
        client, env=env, slug="contract", clock=_now(), claim_ttl_ms=8 * DAY_S * 1000
    )
    epoch = store.acquire(TPX)
    from consumers.runtime.types import RedisOp

    store.commit(
        Commit(
            TPX,
            epoch,
            -1,
            0,
            Progress(acked_through=0),
            claims=[EVT],
            redis=[RedisOp("SET", "k", ("v",))],
            states={"p": {}},
        )
    )
    keys = [k.decode() for k in client.scan_iter(match=f"rh:{env}:*")]
    assert len(keys) >= 5
    tags = {k[k.index("{") : k.index("}") + 1] for k in keys}
    assert tags == {f"{{contract|{TPX.topic}|{TPX.partition}}}"}


def test_claims_live_in_day_buckets_that_expire_and_are_all_checked() -> None:
    client = _client()
    clock = _now()
    store = RedisStore(
        client,
        env="t" + secrets.token_hex(5),
        slug="contract",
        clock=clock,
        claim_ttl_ms=8 * DAY_S * 1000,
    )
    epoch = store.acquire(TPX)
    store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
    bucket = next(k for k in client.scan_iter(match=store.prefix(TPX) + "claims:*"))
    ttl = client.ttl(bucket)
    assert 8 * DAY_S < ttl <= 9 * DAY_S  # the rest of today, then retention + margin
    clock.advance(7 * DAY_S)  # a duplicate arriving as late as the stream keeps it is still seen
    assert store.claimed(TPX, 0, [EVT]) == {EVT}
    clock.advance(3 * DAY_S)  # beyond the window: no longer checked (and Redis dropped the bucket)
    assert store.claimed(TPX, 0, [EVT]) == set()


def test_bytes_per_claim_are_bounded() -> None:
    client = _client()
    store = RedisStore(
        client,
        env="t" + secrets.token_hex(5),
        slug="contract",
        clock=_now(),
        claim_ttl_ms=8 * DAY_S * 1000,
    )
    epoch = store.acquire(TPX)
    ids = ["evt_" + secrets.token_hex(16) for _ in range(20_000)]
    acked = -1
    for n in range(0, len(ids), 1000):
        store.commit(
            Commit(TPX, epoch, acked, 0, Progress(acked_through=n), claims=ids[n : n + 1000])
        )
        acked = n
    bucket = next(k for k in client.scan_iter(match=store.prefix(TPX) + "claims:*"))
    per_claim = client.memory_usage(bucket) / len(ids)
    assert per_claim < 100, per_claim  # 16 id bytes + revision in a hashtable set entry
