"""The Redis store coalesces a commit's effect ops into fewer calls; the memory store applies them
one by one and is the reference. For random op sequences, many on the same keys and fields, both
end in the same state (and both refuse the same unknown op)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.redis_conn import connect
from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.redis_store import (
    COALESCE_MIN_OPS_PER_KEY,
    RedisStore,
    coalesce,
    effect_calls,
    one_by_one,
)
from consumers.runtime.store import Commit
from consumers.runtime.types import TP, Progress, RedisOp
from streams.clock import ManualClock
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration

TPX = TP("rhumbatron_events_00_t", 0)
# Keys by type, so no sequence trips over WRONGTYPE; fields and members few, so ops collide.
HASHES = ["h1", "h2", "slots"]
SETS = ["s1", "missing"]
LISTS = ["l1", "l2"]
STRINGS = ["k1"]
FIELDS = ["a", "b", "c", "high"]
VALUES = st.integers(-3, 9).map(str) | st.integers(-3, 9)


def _op(draw: st.DrawFn) -> RedisOp:
    kind = draw(
        st.sampled_from(
            ["HSET", "HDEL", "HINCRBY", "HMAX", "SET", "INCRBY", "SADD", "SREM", "RPUSH"]
            + ["LPUSHTRIM", "DEL", "SLOT", "SLOT", "SLOT"]  # SLOTs often, so their runs join
        )
    )
    field = draw(st.sampled_from(FIELDS))
    if kind in ("HSET", "HINCRBY", "HMAX"):
        return RedisOp(kind, draw(st.sampled_from(HASHES[:2])), (field, draw(VALUES)))
    if kind == "HDEL":
        return RedisOp(kind, draw(st.sampled_from(HASHES)), (field,))
    if kind in ("SET", "INCRBY"):
        return RedisOp(kind, STRINGS[0], (draw(VALUES),))
    if kind in ("SADD", "SREM"):
        return RedisOp(kind, draw(st.sampled_from(SETS)), (draw(st.integers(0, 5)),))
    if kind == "RPUSH":
        return RedisOp(kind, draw(st.sampled_from(LISTS)), (draw(VALUES),))
    if kind == "LPUSHTRIM":
        cap = draw(st.integers(0, 3))
        return RedisOp(kind, draw(st.sampled_from(LISTS)), (draw(VALUES), cap))
    if kind == "DEL":
        return RedisOp(kind, draw(st.sampled_from(HASHES + SETS + LISTS + STRINGS)), ())
    return RedisOp(
        "SLOT", "slots", ("missing", draw(st.integers(1, 8)), draw(st.sampled_from([1, 3])))
    )


@st.composite
def _commits(draw: st.DrawFn) -> list[list[RedisOp]]:
    return [
        [_op(draw) for _ in range(draw(st.integers(0, 25)))] for _ in range(draw(st.integers(1, 3)))
    ]


def _state(read: object) -> object:
    # Redis keeps no empty hash, set or list (the memory keyspace may hold one).
    return None if read in ({}, set(), []) else read


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_commits())
def test_coalesced_ops_end_in_the_state_of_ops_one_by_one(batches: list[list[RedisOp]]) -> None:
    memory = MemoryStore()
    redis_store = RedisStore(
        connect(TEST_REDIS, timeout=5),
        env="t" + secrets.token_hex(5),
        slug="ops",
        clock=ManualClock(datetime.now(UTC)),
        claim_ttl_ms=86_400_000,
    )
    for store in (memory, redis_store):
        epoch = store.acquire(TPX)
        for n, ops in enumerate(batches):
            store.commit(Commit(TPX, epoch, n - 1, 0, Progress(acked_through=n), redis=ops))
    for key in HASHES + SETS + LISTS + STRINGS:
        assert _state(redis_store.read(TPX, key)) == _state(memory.read(TPX, key)), key
    for ops in batches:
        assert len(coalesce(ops)) <= len(ops)


def test_runs_join_only_across_ops_that_commute() -> None:
    ops = [
        RedisOp("HSET", "h", ("a", 1)),
        RedisOp("HINCRBY", "h", ("n", 1)),
        RedisOp("SADD", "s", ("x",)),
        RedisOp("HSET", "h", ("b", 2)),  # joins the first HSET: nothing between touches h.b
        RedisOp("HINCRBY", "h", ("n", 4)),  # joins the HINCRBY: a sum
        RedisOp("HSET", "h", ("n", 0)),  # h.n was incremented since the HSET run: a new run
        RedisOp("LPUSHTRIM", "l", ("e1", 2)),
        RedisOp("LPUSHTRIM", "l", ("e2", 2)),
        RedisOp("LPUSHTRIM", "l", ("e3", 3)),  # another cap: a new run
        RedisOp("HMAX", "m", ("t", 5)),
        RedisOp("HMAX", "m", ("t", 9)),
        RedisOp("HMAX", "m", ("t", "7")),
    ]
    assert coalesce(ops) == [
        ["HSET", "h", "a", "1", "b", "2"],
        ["HINCRBY", "h", "n", "5"],
        ["SADD", "s", "x"],
        ["HSET", "h", "n", "0"],
        ["LPUSHTRIM", "l", "2", "e1", "e2"],
        ["LPUSHTRIM", "l", "3", "e3"],
        ["HMAX", "m", "t", "9"],
    ]
    with pytest.raises(ValueError, match="unknown Redis effect op"):
        coalesce([RedisOp("EVAL", "k", ())])


@st.composite
def _ops(draw: st.DrawFn) -> list[RedisOp]:
    return [_op(draw) for _ in range(draw(st.integers(0, 12)))]


@settings(max_examples=100, deadline=None)
@given(_ops())
def test_ops_one_by_one_are_the_calls_coalescing_makes_of_ops_on_distinct_keys(
    ops: list[RedisOp],
) -> None:
    # Coalescing is held to the ops applied one by one above; with no key shared it joins
    # nothing, so its calls are each op's own call: the form one_by_one must give every op.
    distinct = [RedisOp(op.op, f"{op.key}-{n}", op.args) for n, op in enumerate(ops)]
    distinct = [
        RedisOp(op.op, op.key, (f"{op.args[0]}-{n}", *op.args[1:])) if op.op == "SLOT" else op
        for n, op in enumerate(distinct)
    ]
    assert one_by_one(distinct) == coalesce(distinct)


def test_effect_calls_coalesce_only_ops_that_come_back_to_their_keys() -> None:
    apart = [RedisOp("HSET", f"view:{n}", ("a", n)) for n in range(10)]
    assert effect_calls(apart) == one_by_one(apart)
    together = [RedisOp("HSET", "view", ("a", n)) for n in range(COALESCE_MIN_OPS_PER_KEY)]
    assert effect_calls(together) == coalesce(together) == [["HSET", "view", "a", "1"]]
    with pytest.raises(ValueError, match="unknown Redis effect op"):
        one_by_one([RedisOp("EVAL", "k", ())])


def _slot(n: int, cap: int = 4) -> RedisOp:
    return RedisOp("SLOT", "meta", ("missing", n, cap))


def test_slots_of_one_hash_join_until_something_touches_their_high_or_missing_set() -> None:
    slot = _slot
    ops = [
        slot(3),
        RedisOp("HMAX", "meta", ("last_ms", 1)),  # another field: the SLOT run goes on
        slot(5),
        slot(2, cap=9),  # another cap: a run of its own
        slot(7),  # the cap-9 run touched high since: a new run
        RedisOp("SREM", "missing", (6,)),
        slot(8),  # the missing set was touched since: a new run
        slot(9),
    ]
    assert coalesce(ops) == [
        ["SLOT", "meta", "missing", "4", "3", "5"],
        ["HMAX", "meta", "last_ms", "1"],
        ["SLOT", "meta", "missing", "9", "2"],
        ["SLOT", "meta", "missing", "4", "7"],
        ["SREM", "missing", "6"],
        ["SLOT", "meta", "missing", "4", "8", "9"],
    ]
