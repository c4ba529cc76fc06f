"""Dense per-project slots, one contract over both backends (SQLite and PostgreSQL): random
interleavings of writers with stale views (hypothesis), real threads, real processes;
bump-and-report returns exactly the missed events; strict mode refuses exactly when the project
moved, and then writes nothing at all."""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import secrets
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.errors import OutboxError, SlotConflict
from streams.outbox.slots import plan_append
from tests.support.outbox import OutboxBackend, drafts, open_test_store, placeholders

WRITER_TABLE = "CREATE TABLE IF NOT EXISTS decisions (writer INTEGER, project_id TEXT, n INTEGER)"
DECIDE = "INSERT INTO decisions VALUES (?, ?, ?)"


def test_plan_refuses_bad_input() -> None:
    items = drafts("proj-a", 2)
    with pytest.raises(
        OutboxError, match="belongs to project 'proj-a' but was appended to project 'proj-b'"
    ):
        plan_append("proj-b", items, head=0, existing=set(), seen_slot=None, strict=False)
    with pytest.raises(OutboxError, match="strict append to project 'proj-a' needs seen_slot"):
        plan_append("proj-a", items, head=0, existing=set(), seen_slot=None, strict=True)
    with pytest.raises(OutboxError, match=r"seen_slot 5 for project 'proj-a' is outside 0..3"):
        plan_append("proj-a", items, head=3, existing=set(), seen_slot=5, strict=False)


class Model:
    """What the outbox should hold: each project's event ids in slot order."""

    def __init__(self) -> None:
        self.log: dict[str, list[str]] = {}


OPS = st.lists(
    st.tuples(
        st.integers(0, 2),  # writer
        st.sampled_from(["proj-a", "proj-b"]),
        st.integers(0, 3),  # new events
        st.booleans(),  # strict
        st.booleans(),  # the writer reloads the project before deciding
        st.booleans(),  # it also re-appends one event that already exists
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_interleaved_writers_get_dense_slots_and_exact_reports(
    outbox_backend: OutboxBackend, ops
) -> None:
    # One outbox for every example; each example has projects of its own.
    tag = secrets.token_hex(4)
    store = outbox_backend.store()
    model = Model()
    views: dict[tuple[int, str], int] = {}  # the highest slot each writer has seen
    decisions = 0
    decide = outbox_backend.sql(DECIDE)
    with store.transaction() as unit:
        unit.execute(WRITER_TABLE)
    try:
        for writer, name, count, strict, reload, repeat in ops:
            project = f"{tag}-{name}"
            log = model.log.setdefault(project, [])
            if reload:
                views[(writer, project)] = len(log)
            seen = views.get((writer, project), 0)
            new = drafts(project, count)
            batch = list(new)
            if repeat and log:  # a retried step writing an event that is already there
                batch.insert(0, dataclasses.replace(drafts(project, 1)[0], event_id=log[0]))
            moved = len(log) > seen
            if strict and moved:
                with pytest.raises(SlotConflict) as refused, store.transaction() as unit:
                    unit.execute(decide, (writer, project, count))
                    unit.append(project, batch, tenant_id="t", seen_slot=seen, strict=True)
                assert (refused.value.seen_slot, refused.value.head) == (seen, len(log))
                assert [e.event_id for e in refused.value.missed] == log[seen:]
                assert store.last_slot(project) == len(log)  # nothing written
                continue
            with store.transaction() as unit:
                unit.execute(decide, (writer, project, count))
                result = unit.append(project, batch, tenant_id="t", seen_slot=seen, strict=strict)
            decisions += 1
            assert result.slots == list(range(len(log) + 1, len(log) + 1 + count))
            assert [e.event_id for e in result.events] == [d.event_id for d in new]
            assert [e.event_id for e in result.missed] == log[seen:]
            assert result.missed_complete and result.bumped == moved
            assert result.duplicates == ((log[0],) if repeat and log else ())
            log.extend(d.event_id for d in new)
            views[(writer, project)] = result.head
            assert result.head == len(log)
        mine = {p: s for p, s in outbox_backend.slots().items() if p.startswith(tag)}
        assert mine == {p: list(range(1, len(ids) + 1)) for p, ids in model.log.items() if ids}
        assert outbox_backend.query(
            f"SELECT COUNT(*) FROM decisions WHERE project_id LIKE '{tag}-%'"
        ) == [(decisions,)]
    finally:
        store.close()


def test_the_missed_report_is_capped_and_says_so(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store(missed_limit=3)
    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 10), tenant_id="t")
    with store.transaction() as unit:
        result = unit.append("proj-a", drafts("proj-a", 1), tenant_id="t", seen_slot=2)
    assert [e.slot for e in result.missed] == [3, 4, 5]
    assert not result.missed_complete and result.bumped
    assert result.slots == [11]


def test_a_duplicate_event_uses_no_slot(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    first = drafts("proj-a", 2)
    with store.transaction() as unit:
        unit.append("proj-a", first, tenant_id="t")
    again = [first[1], *drafts("proj-a", 1), first[1]]
    with store.transaction() as unit:
        result = unit.append("proj-a", again, tenant_id="t")
    assert result.duplicates == (first[1].event_id, first[1].event_id)
    assert result.slots == [3]
    assert outbox_backend.slots() == {"proj-a": [1, 2, 3]}
    assert outbox_backend.counters() == {"proj-a": 3}


def test_threads_appending_to_shared_projects_leave_no_gap_or_duplicate(
    outbox_backend: OutboxBackend,
) -> None:
    store = outbox_backend.store()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        rng = random.Random(n)
        try:
            for _ in range(60):
                project = rng.choice(["proj-a", "proj-b", "proj-c"])
                with store.transaction() as unit:
                    unit.append(
                        project, drafts(project, rng.randint(1, 3)), tenant_id="t", seen_slot=0
                    )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    slots = outbox_backend.slots()
    assert sum(len(s) for s in slots.values()) > 8 * 60
    for project, found in slots.items():
        assert found == list(range(1, len(found) + 1)), project
        assert store.last_slot(project) == len(found)


def _process_writer(address: str, seed: int, appends: int, start_at: float) -> int:
    store = open_test_store(address)
    decide = placeholders(address, DECIDE)
    time.sleep(max(start_at - time.time(), 0))  # all processes start appending together
    rng = random.Random(seed)
    written = 0
    seen: dict[str, int] = {}
    for _ in range(appends):
        project = rng.choice(["proj-a", "proj-b", "proj-c"])
        with store.transaction() as unit:
            result = unit.append(
                project,
                drafts(project, rng.randint(1, 3)),
                tenant_id="t",
                seen_slot=seen.get(project, 0),
            )
            unit.execute(decide, (seed, project, 1))
        seen[project] = result.head
        written += len(result.events)
    store.close()
    return written


def test_processes_appending_to_one_outbox_leave_no_gap_or_duplicate(
    outbox_backend: OutboxBackend,
) -> None:
    store = outbox_backend.store()
    with store.transaction() as unit:
        unit.execute(WRITER_TABLE)
    store.close()
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        start_at = time.time() + 3  # spawned interpreters take a moment to start
        written = pool.starmap(
            _process_writer,
            [(outbox_backend.address, seed, 300, start_at) for seed in range(4)],
        )
    slots = outbox_backend.slots()
    assert sum(len(s) for s in slots.values()) == sum(written)
    for project, found in slots.items():
        assert found == list(range(1, len(found) + 1)), project
    assert outbox_backend.query("SELECT COUNT(*) FROM decisions") == [(4 * 300,)]


def test_strict_refusal_rolls_back_the_writers_own_change(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    with store.transaction() as unit:
        unit.execute(WRITER_TABLE)
        unit.append("proj-a", drafts("proj-a", 2), tenant_id="t")
    with (
        pytest.raises(
            SlotConflict, match=r"saw up to slot 1 but the project is at slot 2.*seen_slot=2"
        ),
        store.transaction() as unit,
    ):
        unit.execute("INSERT INTO decisions VALUES (1, 'proj-a', 1)")
        unit.append("proj-a", drafts("proj-a", 1), tenant_id="t", seen_slot=1, strict=True)
    with store.transaction() as unit:
        assert unit.execute("SELECT COUNT(*) FROM decisions").fetchone()[0] == 0
        ok = unit.append("proj-a", drafts("proj-a", 1), tenant_id="t", seen_slot=2, strict=True)
    assert ok.slots == [3] and not ok.bumped
