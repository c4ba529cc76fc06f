"""The loop's batching on the in-memory twin: one store commit for every partition of a poll
(claims checked by the commit; a lookup and a second commit only for partitions whose commit met
claims), a refused partition handled alone, and larger polls while behind."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest

from consumers.runtime.memory_store import MemoryStore
from consumers.runtime.store import NO_SLOTS, Commit, Decisions, Slots
from consumers.runtime.types import TP, Progress, Record
from router.settings import Settings
from router.wiring.subscription import policy as subscription_policy
from tests.support.runtime_harness import World, event

PROJECTS = ["pa", "pb", "pc", "pj", "pk", "pd", "pe", "pl"]  # two on each of the four partitions


class CountingStore(MemoryStore):
    """A MemoryStore that counts its lookups and commits, and can act from outside once, right
    before the poll's commit (another owner, an operator)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.meanwhile: Callable[[], object] | None = None

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str], slots: Slots = NO_SLOTS
    ) -> Decisions:
        self._count("decisions")
        return super().decisions(tp, revision, event_ids, slots)

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]], slots: Slots = NO_SLOTS
    ) -> list[Decisions]:
        self._count("decisions_many")
        return [MemoryStore.decisions(self, tp, rev, ids, slots) for tp, rev, ids in asks]

    def commit(self, commit: Commit) -> None:
        self._count("commit")
        super().commit(commit)

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        self._count("commit_many")
        if self.meanwhile is not None:
            act, self.meanwhile = self.meanwhile, None
            act()
        refusals: list[Exception | None] = []
        for c in commits:
            try:
                MemoryStore.commit(self, c)
            except Exception as exc:
                refusals.append(exc)
            else:
                refusals.append(None)
        return refusals


def _world() -> tuple[World, CountingStore, list[TP]]:
    store = CountingStore()
    world = World(store=store)
    for n in (1, 2, 3):
        for p in PROJECTS:
            world.publish(event(p, n))
    tps = sorted({world.tp_of(p) for p in PROJECTS})
    assert len(tps) == 4
    return world, store, tps


def test_a_poll_over_several_partitions_commits_the_store_once() -> None:
    world, store, tps = _world()
    runner = world.runner(batch_size=500)
    assert runner.run_once(timeout=0) == 3 * len(PROJECTS)
    assert store.calls == {"commit_many": 1}
    assert all(store.load(tp).acked_through >= 0 for tp in tps)
    assert world.ledger() == {p: [1, 2, 3] for p in PROJECTS}


def test_a_partition_whose_commit_meets_claims_is_looked_up_and_processed_again_alone() -> None:
    """A copy of an applied event in a poll: its partition's commit meets the claim and writes
    nothing; that partition alone is looked up and processed again (the copy a duplicate), and
    every count is the one a looked-up batch gives."""
    world, store, _ = _world()
    first = world.runner(batch_size=500)
    first.run_once(timeout=0)
    copied = event(PROJECTS[0], 2)  # a publisher's re-send of an applied event
    world.publish(copied)
    world.publish(event(PROJECTS[0], 4))
    world.publish(event(PROJECTS[1], 4))
    for p in PROJECTS[2:]:
        world.publish(event(p, 4))
    store.calls.clear()
    handled = first.run_once(timeout=0)
    assert handled == len(PROJECTS) + 1
    assert store.calls == {"commit_many": 2, "decisions_many": 1}
    assert first.stats.duplicates == 1
    assert first.stats.applied == 3 * len(PROJECTS) + len(PROJECTS)
    assert world.ledger() == {p: [1, 2, 3, 4] for p in PROJECTS}


def test_one_fenced_partition_is_dropped_while_the_others_of_its_poll_commit() -> None:
    world, store, tps = _world()
    runner = world.runner(batch_size=500)
    lost = tps[0]
    store.meanwhile = lambda: store.acquire(lost)  # another process took it
    runner.run_once(timeout=0)
    assert lost not in runner.parts and runner.stats.fenced == 1
    assert store.load(lost).acked_through == -1
    assert all(store.load(tp).acked_through >= 0 for tp in tps[1:])
    assert {p for p, seen in world.ledger().items() if seen} == {
        p for p in PROJECTS if world.tp_of(p) != lost
    }


def test_the_revoke_of_a_partition_dropped_when_fenced_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log is the history of what the group gave and took: a partition this process had
    dropped on being fenced is still said to be revoked when the group takes it."""
    world, store, tps = _world()
    runner = world.runner(batch_size=500)
    lost = tps[0]
    store.meanwhile = lambda: store.acquire(lost)
    runner.run_once(timeout=0)
    assert lost not in runner.parts
    runner.transport.revoke([lost, tps[1]])  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="rhumbatron.runtime"):
        runner.run_once(timeout=0)
    said = [r.getMessage() for r in caplog.records if ": revoked " in r.getMessage()]
    assert said == [f"{runner.processor.slug}: revoked {tp}" for tp in (lost, tps[1])]
    assert set(runner.parts) == set(tps[2:])


def test_a_partition_whose_cursor_moved_reloads_while_the_others_of_its_poll_commit() -> None:
    world, store, tps = _world()
    runner = world.runner(batch_size=500)
    moved = tps[-1]

    def operator_moves_it() -> None:
        old = store.load(moved)
        new = Progress.from_fields(old.as_fields())
        new.acked_through = 0  # skip_through 0, from outside
        store.replace_fold(moved, None, (old.acked_through, old.cursor_revision), new, None)

    store.meanwhile = operator_moves_it
    runner.run_once(timeout=0)
    assert runner.parts[moved].progress.acked_through == 0  # reloaded from the store
    assert store.load(moved).acked_through == 0
    assert all(store.load(tp).acked_through >= 1 for tp in tps[:-1])
    # Read again from the moved cursor: everything after it applies once.
    world.drain(runner)
    assert all(store.load(tp).acked_through >= 1 for tp in tps)


def test_polls_take_batch_size_behind_while_a_full_batch_was_waiting() -> None:
    world, _, _ = _world()  # 24 records waiting
    runner = world.runner(batch_size=5, batch_size_behind=15)
    asked: list[int] = []
    poll = runner.transport.poll

    def counting(max_records: int, timeout: float) -> list[Record]:
        asked.append(max_records)
        return poll(max_records, timeout)

    runner.transport.poll = counting  # type: ignore[method-assign]
    handled = [runner.run_once(timeout=0) for _ in range(4)]
    # Normal, then behind after a full batch; still behind after 15, normal after 4 (< 5).
    assert asked == [5, 15, 15, 5]
    assert handled == [5, 15, 4, 0]


def test_without_batch_size_behind_every_poll_takes_batch_size() -> None:
    world, _, _ = _world()
    runner = world.runner(batch_size=5)
    assert [runner.run_once(timeout=0) for _ in range(3)] == [5, 5, 5]


def test_the_settings_give_the_runner_its_batch_size_behind() -> None:
    policy = subscription_policy(Settings(batch_size=300, batch_size_behind=1234), "ledger")
    assert (policy.batch_size, policy.behind_batch_size()) == (300, 1234)
