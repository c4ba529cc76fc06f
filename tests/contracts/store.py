"""One contract for every Store (STYLE: shared test classes per interface). Subclasses provide
``make_store``; the in-memory store runs it in unit tests, the Redis store against real Redis, the
SQL store against real PostgreSQL. An effect is written and read back through ``effect`` and
``effect_of`` (a Redis key, or a row the SQL store's statements write); what only Redis effects
have (their ops) is checked where ``redis_effects``."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from consumers.runtime.store import Commit, Store
from consumers.runtime.types import TP, OutRecord, Progress, RedisOp
from streams.errors import ClaimsFound, CursorMoved, Fenced, PendingEffects

TPX = TP("rhumbatron_events_00_t", 1)
EVT = "evt_" + "ab" * 16
EVT2 = "evt_" + "cd" * 16
EVT3 = "evt_" + "ef" * 16


class StoreContract:
    redis_effects: ClassVar[bool] = True  # the store applies RedisOp effects

    def make_store(self) -> Store:
        raise NotImplementedError

    def effect(self, value: str, tp: TP = TPX) -> dict[str, Any]:
        """A commit's fields (of ``tp``) that write one effect: ``value`` under its ``k``."""
        return {"redis": [RedisOp("SET", "k", (value,))]}

    def effect_of(self, store: Store, tp: TP) -> object:
        """The partition's ``k`` as an effect wrote it; None when none did."""
        return store.read(tp, "k")

    def test_epochs_fence_stale_owners(self) -> None:
        store = self.make_store()
        old = store.acquire(TPX)
        new = store.acquire(TPX)
        assert new == old + 1 and store.epoch(TPX) == new
        with pytest.raises(Fenced):
            store.commit(Commit(TPX, old, -1, 0, Progress(acked_through=0), claims=[EVT]))
        assert store.load(TPX).acked_through == -1
        assert store.claimed(TPX, 0, [EVT]) == set()

    def test_commit_is_compare_and_set_on_the_cursor(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=4)))
        with pytest.raises(CursorMoved):
            store.commit(Commit(TPX, epoch, 2, 0, Progress(acked_through=9)))
        with pytest.raises(CursorMoved):
            store.commit(Commit(TPX, epoch, 4, 1, Progress(acked_through=9, cursor_revision=1)))
        assert store.load(TPX).acked_through == 4

    def test_claims_are_per_cursor_revision(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
        assert store.claimed(TPX, 0, [EVT, EVT2]) == {EVT}
        assert store.claimed(TPX, 1, [EVT]) == set()
        with pytest.raises(CursorMoved):  # the same claim twice means someone raced us
            store.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), claims=[EVT]))

    def test_a_commit_not_looked_up_is_refused_by_any_claim_of_its_events(self) -> None:
        """``looked=False`` (the live path's one round trip): a claim of any of its events, at
        this revision or an earlier one, applied or dead-lettered, among its claims or only
        checked (``unclaimed``), refuses it with ClaimsFound, and it writes nothing: not its
        other claims (taken back), not its effects, states or cursor."""
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
        store.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), dead_claims=[EVT2]))
        new = "evt_" + "12" * 16
        cases = [
            (0, {"claims": [new, EVT]}),  # applied at this revision, after a new one
            (0, {"claims": [EVT2, new]}),  # dead-lettered at it
            (0, {"claims": [new], "unclaimed": [EVT]}),  # judged fresh, failed, claimed after all
            (1, {"claims": [new, EVT]}),  # applied at an earlier revision
        ]
        for revision, claims in cases:
            if revision:  # an operator's reprocess moved the cursor to revision 1
                store.replace_fold(
                    TPX, None, (1, 0), Progress(acked_through=1, cursor_revision=1), None
                )
            before = store.load(TPX)
            refused = store.commit_many(
                [
                    Commit(
                        TPX,
                        epoch,
                        1,
                        revision,
                        Progress(acked_through=5, cursor_revision=revision),
                        states={"p": {}},
                        looked=False,
                        **self.effect("v"),
                        **claims,  # type: ignore[arg-type]
                    )
                ]
            )
            assert [type(r) for r in refused] == [ClaimsFound], (revision, claims)
            assert store.load(TPX).as_fields() == before.as_fields()
            assert store.decisions(TPX, revision, [new]) == (set(), set(), set()), claims
            assert self.effect_of(store, TPX) is None and store.states(TPX, ["p"]) == {"p": None}

    def test_a_commit_not_looked_up_without_claims_met_lands_whole(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), claims=[EVT]))
        answers = store.commit_many(
            [
                Commit(
                    TPX,
                    epoch,
                    0,
                    0,
                    Progress(acked_through=3),
                    claims=[EVT2],
                    unclaimed=[EVT3],  # checked, not claimed: it failed
                    looked=False,
                    **self.effect("v"),
                )
            ]
        )
        assert answers == [None]
        assert store.decisions(TPX, 0, [EVT, EVT2, EVT3]) == ({EVT, EVT2}, set(), set())
        assert self.effect_of(store, TPX) == "v" and store.load(TPX).acked_through == 3

    def test_effects_claims_state_and_cursor_land_together(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        if not self.redis_effects:
            first = Commit(
                TPX,
                epoch,
                -1,
                0,
                Progress(acked_through=3),
                claims=[EVT],
                states={"p1": {"k": [1, 2]}, "p2": {"v": 1}},
                **self.effect("x"),
            )
            store.commit(first)
            assert first.state_bytes == {"p1": len(b'{"k":[1,2]}'), "p2": len(b'{"v":1}')}
            assert self.effect_of(store, TPX) == "x" and store.claimed(TPX, 0, [EVT]) == {EVT}
            assert store.states(TPX, ["p1", "p3"]) == {"p1": {"k": [1, 2]}, "p3": None}
            store.commit(Commit(TPX, epoch, 3, 0, Progress(acked_through=5), states={"p2": None}))
            assert store.all_states(TPX) == {"p1": {"k": [1, 2]}}
            return
        ops = [
            RedisOp("HSET", "view", ("name", "x")),
            RedisOp("HINCRBY", "view", ("n", 2)),
            RedisOp("HINCRBY", "view", ("n", 3)),
            RedisOp("HMAX", "view", ("gen", 7)),
            RedisOp("HMAX", "view", ("gen", 5)),
            RedisOp("SADD", "agents", ("a",)),
            RedisOp("SADD", "agents", ("b",)),
            RedisOp("SREM", "agents", ("a",)),
            RedisOp("LPUSHTRIM", "feed", ("e1", 2)),
            RedisOp("LPUSHTRIM", "feed", ("e2", 2)),
            RedisOp("LPUSHTRIM", "feed", ("e3", 2)),
            RedisOp("RPUSH", "log", ("1",)),
            RedisOp("RPUSH", "log", ("2",)),
            RedisOp("SET", "last", ("z",)),
            RedisOp("INCRBY", "count", (4,)),
            RedisOp("SLOT", "slots", ("missing", 1, 100)),
            RedisOp("SLOT", "slots", ("missing", 4, 100)),
            RedisOp("SLOT", "slots", ("missing", 2, 100)),
        ]
        first = Commit(
            TPX,
            epoch,
            -1,
            0,
            Progress(acked_through=3),
            claims=[EVT],
            redis=ops,
            states={"p1": {"k": [1, 2]}, "p2": {"v": 1}},
        )
        store.commit(first)
        # Each state's size as written (the runner bounds the folds it keeps by it).
        assert first.state_bytes == {"p1": len(b'{"k":[1,2]}'), "p2": len(b'{"v":1}')}
        assert store.read(TPX, "view") == {"name": "x", "n": "5", "gen": "7"}
        assert store.read(TPX, "agents") == {"b"}
        assert store.read(TPX, "feed") == ["e3", "e2"]
        assert store.read(TPX, "log") == ["1", "2"]
        assert store.read(TPX, "last") == "z"
        assert store.read(TPX, "count") == "4"
        assert store.read(TPX, "slots") == {"high": "4"}
        assert store.read(TPX, "missing") == {"3"}
        assert store.states(TPX, ["p1", "p2", "p3"]) == {
            "p1": {"k": [1, 2]},
            "p2": {"v": 1},
            "p3": None,
        }
        deleting = Commit(TPX, epoch, 3, 0, Progress(acked_through=5), states={"p2": None})
        store.commit(deleting)
        assert store.all_states(TPX) == {"p1": {"k": [1, 2]}}
        assert deleting.state_bytes == {}

    def test_slot_gaps_are_capped(self) -> None:
        if not self.redis_effects:
            pytest.skip("Redis effect ops only")
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(
            Commit(
                TPX,
                epoch,
                -1,
                0,
                Progress(acked_through=0),
                redis=[RedisOp("SLOT", "s", ("m", 10, 3))],
            )
        )
        assert store.read(TPX, "m") == {"1", "2", "3"}
        assert store.read(TPX, "s") == {"high": "10", "missing_overflow": "1"}

    def test_a_rejected_commit_writes_nothing(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.acquire(TPX)
        with pytest.raises(Fenced):
            store.commit(
                Commit(
                    TPX,
                    epoch,
                    -1,
                    0,
                    Progress(acked_through=3),
                    claims=[EVT],
                    states={"p": {}},
                    **self.effect("v"),
                )
            )
        assert self.effect_of(store, TPX) is None and store.states(TPX, ["p"]) == {"p": None}

    def test_pending_effects_are_kept_until_cleared_and_never_replaced(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        record = OutRecord("out", "p1", b"\x00\xffbody", "rid-1", (("h", b"\x01"),))
        store.commit(
            Commit(
                TPX,
                epoch,
                -1,
                0,
                Progress(acked_through=1, pending_effects=True),
                pending=[record],
                states={"p": {"s": 1}},
            )
        )
        assert store.pending(TPX) == [record]
        assert store.load(TPX).pending_effects
        with pytest.raises(PendingEffects):
            store.commit(
                Commit(
                    TPX,
                    epoch,
                    1,
                    0,
                    Progress(acked_through=2, pending_effects=True),
                    pending=[record],
                )
            )
        store.clear_pending(TPX, epoch)
        assert store.pending(TPX) == [] and not store.load(TPX).pending_effects
        assert store.all_states(TPX) == {"p": {"s": 1}}  # clearing pending touches nothing else
        with pytest.raises(Fenced):
            store.clear_pending(TPX, epoch - 1)

    def test_replace_fold_is_compare_and_set(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=3), states={"old": {"x": 1}}))
        with pytest.raises(CursorMoved):
            store.replace_fold(TPX, None, (2, 0), Progress(acked_through=3), {"new": {}})
        store.replace_fold(
            TPX, None, (3, 0), Progress(acked_through=3, cursor_revision=1), {"new": {"y": 2}}
        )
        assert store.all_states(TPX) == {"new": {"y": 2}}
        assert store.load(TPX).cursor_revision == 1
        store.replace_fold(TPX, epoch, (3, 1), Progress(acked_through=9, cursor_revision=1), None)
        assert store.all_states(TPX) == {"new": {"y": 2}} and store.load(TPX).acked_through == 9

    def test_failures_are_counted_per_batch_key(self) -> None:
        store = self.make_store()
        assert [store.count_failure(TPX, "17") for _ in range(3)] == [1, 2, 3]
        assert store.count_failure(TPX, "18") == 1
        store.clear_failures(TPX, "17")
        assert store.count_failure(TPX, "17") == 1

    def test_progress_round_trips(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        progress = Progress(
            acked_through=10,
            cursor_revision=2,
            reducer_version="v3",
            reduced_through=10,
            applied_beyond=[12, 14],
            dead=[11],
            redelivered_next=4,
            skipped=[[1, 3]],
        )
        store.replace_fold(TPX, epoch, (-1, 0), progress, None)
        assert store.load(TPX) == progress

    def test_a_rebuilt_fold_refuses_commits_from_folds_cached_before_it(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=1), states={"p": {"n": 1}}))
        rebuilt = Progress(acked_through=1, fold_generation=1)
        with pytest.raises(CursorMoved):  # the generation read was not 5
            store.replace_fold(TPX, None, (1, 0), rebuilt, {"p": {"n": 9}}, expected_generation=5)
        store.replace_fold(TPX, None, (1, 0), rebuilt, {"p": {"n": 9}}, expected_generation=0)
        stale = Commit(TPX, epoch, 1, 0, Progress(acked_through=2), states={"p": {"n": 2}})
        with pytest.raises(CursorMoved):
            store.commit(stale)
        assert store.states(TPX, ["p"]) == {"p": {"n": 9}}
        store.commit(
            Commit(TPX, epoch, 1, 0, Progress(acked_through=2, fold_generation=1), states={})
        )
        assert store.load(TPX).fold_generation == 1 and store.load(TPX).acked_through == 2

    def test_a_commit_clears_the_failure_counts_it_moved_past(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        assert store.count_failure(TPX, "0") == 1
        assert store.count_failure(TPX, "0") == 2
        assert store.count_failure(TPX, "7") == 1
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), cleared_failures=["0"]))
        assert store.count_failure(TPX, "0") == 1
        assert store.count_failure(TPX, "7") == 2

    def test_dead_claims_are_apart_from_claims_and_land_with_commits_and_fold_swaps(
        self,
    ) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=0), dead_claims=[EVT]))
        assert store.claimed(TPX, 0, [EVT, EVT2], dead=True) == {EVT}
        assert store.claimed(TPX, 0, [EVT, EVT2]) == set()
        assert store.decisions(TPX, 0, [EVT, EVT2]) == (set(), {EVT}, set())
        assert store.decisions(TPX, 0, []) == (set(), set(), set())
        with pytest.raises(CursorMoved):  # the same dead claim twice means someone raced us
            store.commit(Commit(TPX, epoch, 0, 0, Progress(acked_through=1), dead_claims=[EVT]))
        moved = Progress(acked_through=3, cursor_revision=1)
        store.replace_fold(TPX, None, (0, 0), moved, None, dead_claims=[EVT2])
        assert store.claimed(TPX, 1, [EVT, EVT2], dead=True) == {EVT2}
        assert store.claimed(TPX, 0, [EVT2], dead=True) == set()
        applied = Progress(acked_through=4, cursor_revision=1)
        store.commit(Commit(TPX, epoch, 3, 1, applied, claims=[EVT]))
        assert store.decisions(TPX, 1, [EVT, EVT2]) == ({EVT}, {EVT2}, set())

    def test_excluded_offsets_are_kept_per_partition_by_commits_and_fold_swaps(self) -> None:
        store = self.make_store()
        epoch = store.acquire(TPX)
        assert store.excluded(TPX) == set()
        store.commit(Commit(TPX, epoch, -1, 0, Progress(acked_through=5), excluded_add=[2, 4]))
        store.commit(
            Commit(
                TPX, epoch, 5, 0, Progress(acked_through=9), excluded_add=[7], excluded_remove=[2]
            )
        )
        assert store.excluded(TPX) == {4, 7}
        store.replace_fold(
            TPX, None, (9, 0), Progress(acked_through=9), {}, exclude=[8], readmit=[7]
        )
        assert store.excluded(TPX) == {4, 8}
        assert store.excluded(TP(TPX.topic, TPX.partition + 1)) == set()

    def test_many_partitions_in_one_call_each_commit_apart(self) -> None:
        store = self.make_store()
        a, b, c = (TP(TPX.topic, TPX.partition + n) for n in range(3))
        ea, eb, ec = store.acquire(a), store.acquire(b), store.acquire(c)
        store.acquire(b)  # b's caller is a zombie now
        answers = store.commit_many(
            [
                Commit(
                    a,
                    ea,
                    -1,
                    0,
                    Progress(acked_through=1),
                    claims=[EVT],
                    **self.effect("a", a),
                    states={"p": {"n": 1}},
                ),
                Commit(
                    b,
                    eb,
                    -1,
                    0,
                    Progress(acked_through=1),
                    claims=[EVT],
                    **self.effect("b", b),
                    states={"p": {"n": 2}},
                ),
                Commit(
                    c,
                    ec,
                    5,  # not where c's cursor is
                    0,
                    Progress(acked_through=6),
                    dead_claims=[EVT2],
                    **self.effect("c", c),
                ),
            ]
        )
        assert answers[0] is None
        assert isinstance(answers[1], Fenced) and isinstance(answers[2], CursorMoved)
        assert self.effect_of(store, a) == "a" and store.states(a, ["p"]) == {"p": {"n": 1}}
        for refused in (b, c):  # nothing of a refused commit was written
            assert self.effect_of(store, refused) is None
            assert store.states(refused, ["p"]) == {"p": None}
            assert store.load(refused).acked_through == -1
        assert (
            store.decisions_many(
                [(a, 0, [EVT, EVT2]), (b, 0, [EVT]), (c, 0, [EVT2]), (a, 1, [EVT]), (c, 0, [])]
            )
            == [({EVT}, set(), set())] + [(set(), set(), set())] * 4
        )
        record = OutRecord("out", "p1", b"v", "rid-1", ())
        answers = store.commit_many(
            [
                Commit(
                    a, ea, 1, 0, Progress(acked_through=2, pending_effects=True), pending=[record]
                ),
                Commit(c, ec, -1, 0, Progress(acked_through=0), dead_claims=[EVT2]),
            ]
        )
        assert answers == [None, None]
        answers = store.commit_many(
            [
                Commit(a, ea, 2, 0, Progress(acked_through=3), pending=[record], claims=[EVT2]),
                Commit(c, ec, 0, 0, Progress(acked_through=1), claims=[EVT]),
            ]
        )
        assert isinstance(answers[0], PendingEffects) and answers[1] is None
        assert store.decisions_many([(a, 0, [EVT, EVT2]), (c, 0, [EVT, EVT2])]) == [
            ({EVT}, set(), set()),
            ({EVT}, {EVT2}, set()),
        ]
        assert store.commit_many([]) == [] and store.decisions_many([]) == []
