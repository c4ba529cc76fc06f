"""The Store contract against real Redis, plus what only Redis has: hash tags, claim buckets
(small hashes, the old day sets still read), the script cache flushed."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.redis_conn import connect
from consumers.runtime import layout, slot_claims
from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.redis_store import (
    DAY_MS,
    RedisStore,
    claim_bucket,
    claim_field,
    claim_member,
)
from consumers.runtime.slot_claims import SlotRef
from consumers.runtime.store import Commit, Store
from consumers.runtime.types import TP, Progress
from streams.clock import ManualClock
from streams.errors import ClaimsFound, CursorMoved
from tests.contracts.slot_store import NEW, OUTBOX, SlotStoreContract
from tests.contracts.store import EVT, EVT2, TPX, StoreContract
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration

DAY_S = 86_400


def _now() -> ManualClock:
    # Bucket expiry is absolute (EXPIREAT): the clock must agree with Redis's own.
    return ManualClock(datetime.now(UTC))


def _client() -> redis.Redis[bytes]:
    return connect(TEST_REDIS, timeout=5)


def _store(client: redis.Redis[bytes], *, claim_buckets: int = 1024, **options: Any) -> RedisStore:
    return RedisStore(
        client,
        env="t" + secrets.token_hex(5),
        slug="contract",
        clock=_now(),
        claim_ttl_ms=8 * DAY_S * 1000,
        claim_buckets=claim_buckets,
        **options,
    )


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
    keys = [k.decode() for k in client.scan_iter(match=f"rh:{env}:*", count=1000)]
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
    bucket = next(k for k in client.scan_iter(match=store.prefix(TPX) + "claims:*", count=1000))
    ttl = client.ttl(bucket)
    assert 8 * DAY_S < ttl <= 9 * DAY_S  # the rest of today, then retention + margin
    clock.advance(7 * DAY_S)  # a duplicate arriving as late as the stream keeps it is still seen
    assert store.claimed(TPX, 0, [EVT]) == {EVT}
    clock.advance(3 * DAY_S)  # beyond the window: no longer checked (and Redis dropped the bucket)
    assert store.claimed(TPX, 0, [EVT]) == set()


def test_a_claim_written_past_midnight_is_seen_after_the_clock_steps_back_before_it() -> None:
    """A host's clock stepped back 5 minutes just after a UTC midnight (NTP, a VM restored):
    claims written in the new day's buckets must still be looked in from the old day, or a copy
    of an event (a publisher's re-send) is applied a second time (the chaos matrix's clock row)."""
    client = _client()
    env = "t" + secrets.token_hex(5)
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    midnight += timedelta(days=1)

    def at(moment: datetime) -> RedisStore:
        clock = ManualClock(moment)
        return RedisStore(client, env=env, slug="contract", clock=clock, claim_ttl_ms=8 * DAY_MS)

    ahead, back = at(midnight + timedelta(seconds=270)), at(midnight - timedelta(seconds=30))
    epoch = ahead.acquire(TPX)
    ahead.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
    assert back.decisions(TPX, 0, [EVT, EVT2]) == ({EVT}, set(), set())
    with pytest.raises(CursorMoved):  # the copy at a later offset is refused, not applied
        back.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT]))


def test_claims_stay_small_hashes_of_at_most_32_bytes_a_claim() -> None:
    client = _client()
    # 256 hashes for 20,000 claims: about 78 each, well under Redis's default of 128 a listpack.
    store = _store(client, claim_buckets=256)
    epoch = store.acquire(TPX)
    ids = ["evt_" + secrets.token_hex(16) for _ in range(20_000)]
    acked = -1
    for n in range(0, len(ids), 1000):
        store.commit(
            Commit(TPX, epoch, acked, 0, Progress(acked_through=n), claims=ids[n : n + 1000])
        )
        acked = n
    keys = list(client.scan_iter(match=store.prefix(TPX) + "claims:*", count=1000))
    hashes = [k for k in keys if not k.endswith(b":claims:days")]  # beside them: the days written
    assert len(hashes) == 256 and len(keys) == 257
    assert {client.object("encoding", k) for k in hashes} == {b"listpack"}
    per_claim = sum(client.memory_usage(k) or 0 for k in keys) / len(ids)
    assert per_claim <= 32, per_claim
    assert store.claimed(TPX, 0, ids[::997]) == set(ids[::997])


def test_a_claim_of_the_old_day_sets_is_still_found_and_new_ones_go_to_hashes() -> None:
    client = _client()
    store = _store(client)
    epoch = store.acquire(TPX)
    today = int(store.clock.now().timestamp() * 1000) // DAY_MS
    old_today = f"{store.prefix(TPX)}claims:{today}"
    old_yesterday = f"{store.prefix(TPX)}claims:{today - 1}"
    other = "ext-42"  # an id not of the evt_ form
    client.sadd(old_today, claim_member(EVT, 0))
    client.sadd(old_yesterday, claim_member(other, 0, dead=True))
    assert store.decisions(TPX, 0, [EVT, EVT2, other]) == ({EVT}, {other}, set())
    with pytest.raises(CursorMoved):  # an upgrade never applies a duplicate
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
    store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT2, other]))
    assert client.smembers(old_today) == {claim_member(EVT, 0)}  # the old sets only expire
    assert store.decisions(TPX, 0, [EVT, EVT2, other]) == ({EVT, EVT2, other}, {other}, set())
    written = {f"{old_today}:{claim_bucket(claim_field(e), 1024)}" for e in (EVT2, other)}
    assert {client.type(k) for k in written} == {b"hash"}


def test_commits_and_lookups_survive_a_flushed_script_cache() -> None:
    client = _client()
    store = _store(client)
    epoch = store.acquire(TPX)
    other = TP(TPX.topic, TPX.partition + 1)
    other_epoch = store.acquire(other)
    store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
    client.script_flush()  # as after a restart of Redis
    assert store.decisions_many([(TPX, 0, [EVT]), (other, 0, [EVT])]) == [
        ({EVT}, set(), set()),
        (set(), set(), set()),
    ]
    client.script_flush()
    answers = store.commit_many(
        [
            Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT2]),
            Commit(other, other_epoch, -1, 0, Progress(acked_through=0), claims=[EVT]),
        ]
    )
    assert answers == [None, None]
    client.script_flush()
    store.replace_fold(TPX, None, (1, 0), Progress(acked_through=1), None, dead_claims=[EVT])
    assert store.decisions(TPX, 0, [EVT, EVT2]) == ({EVT, EVT2}, {EVT}, set())


def test_a_claim_bucket_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="claim_buckets"):
        _store(_client(), claim_buckets=0)


def test_a_commit_not_looked_up_meets_a_claim_of_an_earlier_day() -> None:
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
    clock.advance(2 * DAY_S)  # the copy arrives two days later: its claim is in that day's hash
    late = Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT2, EVT], looked=False)
    assert [type(r) for r in store.commit_many([late])] == [ClaimsFound]
    assert store.decisions(TPX, 0, [EVT2]) == (set(), set(), set())


def _claim_hashes(client: redis.Redis[bytes], store: RedisStore) -> list[bytes]:
    keys = client.scan_iter(match=store.prefix(TPX) + "claims:*", count=1000)
    return [k for k in keys if not k.endswith(b":claims:days")]


def test_every_claim_hash_has_its_expiry_given_once_a_day_and_again_after_a_loss() -> None:
    """The expiry of today's claim hashes is one EXPIREAT a hash a day, not one a commit: every
    hash still has it, also one written again after Redis lost it (and the days with it)."""
    client = _client()
    store = _store(client, claim_buckets=8)
    epoch = store.acquire(TPX)
    ids = ["evt_" + secrets.token_hex(16) for _ in range(400)]
    for n in range(0, 400, 100):
        acked = n - 100 if n else -1
        store.commit(
            Commit(TPX, epoch, acked, 0, Progress(acked_through=n), claims=ids[n : n + 100])
        )
    hashes = _claim_hashes(client, store)
    assert len(hashes) == 8 and all(client.ttl(k) > 8 * DAY_S for k in hashes)
    for key in hashes:  # marked: an expiry given again would put the 9 days back
        client.expire(key, 1000)
    more = ["evt_" + secrets.token_hex(16) for _ in range(100)]  # 100 claims touch all 8
    store.commit(Commit(TPX, epoch, 300, 0, Progress(acked_through=400), claims=more))
    assert all(0 < client.ttl(k) <= 1000 for k in hashes)  # this store had given them theirs
    # Redis loses the claims (a restart without its data): written again, they expire again.
    client.delete(*hashes, store.prefix(TPX) + "claims:days")
    again = ["evt_" + secrets.token_hex(16) for _ in range(100)]
    store.commit(Commit(TPX, epoch, 400, 0, Progress(acked_through=500), claims=again))
    rewritten = _claim_hashes(client, store)
    assert rewritten and all(client.ttl(k) > 8 * DAY_S for k in rewritten)


def test_a_day_past_the_claims_life_is_deleted_when_the_partition_next_claims() -> None:
    client = _client()
    clock = _now()
    store = RedisStore(
        client,
        env="t" + secrets.token_hex(5),
        slug="contract",
        clock=clock,
        claim_ttl_ms=2 * DAY_S * 1000,
        claim_buckets=4,
    )
    epoch = store.acquire(TPX)
    ids = ["evt_" + secrets.token_hex(16) for _ in range(40)]
    store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=ids))
    first = set(_claim_hashes(client, store))
    for key in first:  # as if their expiry were lost: the day's end still deletes them
        client.persist(key)
    clock.advance(4 * DAY_S)
    store.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT]))
    assert not first & set(_claim_hashes(client, store))


class TestRedisSlotStore(SlotStoreContract):
    def make_store(self, **options: Any) -> Store:
        return RedisStore(
            _client(),
            env="t" + secrets.token_hex(5),
            slug="contract",
            clock=_now(),
            claim_ttl_ms=8 * DAY_S * 1000,
            **{**NEW, **options},
        )

    def release(self, store: Store, *, speaks: int, writes_slot_claims: bool) -> Store:
        assert isinstance(store, RedisStore)
        return RedisStore(
            store.client,
            env=store.env,
            slug=store.slug,
            clock=store.clock,
            claim_ttl_ms=store.claim_ttl_ms,
            speaks=speaks,
            writes_slot_claims=writes_slot_claims,
        )

    def finalize(self, store: Store) -> None:
        assert isinstance(store, RedisStore)
        layout.finalize(store.client, store.env, 2)

    def record(self, store: Store, project: str) -> bytes:
        assert isinstance(store, RedisStore)
        key = f"{store.prefix(TPX)}sc:0:{OUTBOX}:{slot_claims.bucket(project, store.claim_project_buckets)}"
        found = store.client.hget(key, project)
        assert found is not None
        return found


def test_a_project_read_in_order_keeps_one_integer_per_outbox() -> None:
    client = _client()
    store = _store(client, **NEW)
    layout.finalize(client, store.env, 2)
    epoch = store.acquire(TPX)
    events = [f"evt_{n:032x}" for n in range(1, 1_001)]
    slots = {e: SlotRef.of("obx_" + "0f" * 8, "p1", n, e) for n, e in enumerate(events, 1)}
    for at, start in enumerate(range(0, len(events), 100)):
        batch = events[start : start + 100]
        store.commit(
            Commit(TPX, epoch, at - 1, 0, Progress(acked_through=at), claims=batch, slots=slots)
        )
    keys = [k.decode() for k in client.scan_iter(match=store.prefix(TPX) + "sc:*")]
    assert len(keys) == 1, keys
    assert client.hgetall(keys[0]) == {b"p1": b"1000"}
    assert client.object("encoding", keys[0]) == b"listpack"
    assert not list(client.scan_iter(match=store.prefix(TPX) + "claims:*"))  # none by id


_steps = st.lists(
    st.tuples(
        st.integers(1, 40),  # slot
        st.sampled_from(["p1", "p2"]),
        st.booleans(),  # dead-lettered
        st.integers(0, 2),  # which of the slot's candidate events
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps, st.booleans())
def test_slot_claims_in_redis_answer_as_in_memory(steps, finalized) -> None:
    """The Lua record and the Python one, on the same commits, give the same answers."""
    real = _store(_client(), **NEW)
    real.claim_gap_horizon = 6
    twin = MemoryStore(claim_gap_horizon=6, **NEW)
    if finalized:
        layout.finalize(real.client, real.env, 2)
        twin.finalize(2)
    outbox = "obx_" + "0f" * 8

    def event(slot: int, project: str, who: int) -> tuple[str, SlotRef]:
        e = f"evt_{who:02x}{project[-1]}{slot:029x}"
        return e, SlotRef.of(outbox, project, slot, e)

    for store in (real, twin):
        epoch = store.acquire(TPX)
        for at, (slot, project, dead, who) in enumerate(steps):
            e, ref = event(slot, project, who)
            found = store.decisions(TPX, 0, [e], {e: ref})
            fresh = not (found.applied | found.dead | found.conflicts)
            store.commit(
                Commit(
                    TPX,
                    epoch,
                    at - 1,
                    0,
                    Progress(acked_through=at),
                    claims=[e] if fresh and not dead else [],
                    dead_claims=[e] if fresh and dead else [],
                    slots={e: ref},
                )
            )
    slots = dict(event(s, p, w) for s in range(1, 42) for p in ("p1", "p2") for w in range(3))
    assert real.decisions(TPX, 0, list(slots), slots) == twin.decisions(TPX, 0, list(slots), slots)


def test_finalized_the_hashes_of_claims_by_id_still_get_their_expiry() -> None:
    """An outbox event's bucket is not written once finalized: it must not be remembered as a
    hash given its expiry, or the next claim by id landing there would live for ever."""
    client = _client()
    store = _store(client, claim_buckets=2, **NEW)
    layout.finalize(client, store.env, 2)
    epoch = store.acquire(TPX)
    first, slotted, later = "evt_" + "00" * 16, EVT, EVT2  # buckets 0, 1 and 1
    assert [claim_bucket(claim_field(e), 2) for e in (first, slotted, later)] == [0, 1, 1]
    ref = {slotted: SlotRef.of("obx_" + "0f" * 8, "p1", 1, slotted)}
    for at, (event, slots) in enumerate([(first, {}), (slotted, ref), (later, {})]):
        commit = Commit(TPX, epoch, at - 1, 0, Progress(acked_through=at), claims=[event])
        commit.slots = slots
        store.commit(commit)
    day = store.prefix(TPX) + f"claims:{store._today()}:"
    assert client.hexists(day + "1", claim_field(later)) and client.ttl(day + "1") > 0
