"""Parked projects on the in-memory transport and store: an event newer than the subscription's
code knows parks its project (its later events wait, other projects flow, nothing fails), the
park costs one cursor entry however long it lasts, and an upgraded consumer applies the parked
events in order, then everything after them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from consumers.runtime.memory_transport import MemoryReader, cuts_from
from consumers.runtime.metrics import RuntimeInstruments
from consumers.runtime.types import TP, Park, Record
from consumers.subscriptions.ledger import Ledger
from streams.catalog import Catalog
from streams.catalog import payloads as p
from streams.catalog.registry import EventSpec
from streams.envelopes import Event, build
from streams.errors import NewerThanKnown, Unreachable
from streams.ids import stable_event_id
from tests.support.runtime_harness import PROJECTS_SHARING, Counter, World

TYPE = "task.completed"
PROJECTS = ["alpha", "beta", "gamma", "delta", "eps"]


class Done1(p.Payload):
    n: int


class Done2(p.Payload):
    n: int
    note: str


def _upcast(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "note": "upcast"}


# What the consumer's code knows before its upgrade (version 1), and after it (1 and 2).
OLD = Catalog(events=(EventSpec(TYPE, 1, Done1, "test", "a task is done"),), commands=())
NEW = Catalog(
    events=(
        EventSpec(TYPE, 1, Done1, "test", "a task is done"),
        EventSpec(TYPE, 2, Done2, "test", "a task is done, with a note"),
    ),
    commands=(),
    upcasters={(TYPE, 1): _upcast},
)


def done(project: str, n: int, *, version: int = 1, fail: bool = False) -> Event:
    payload: dict[str, Any] = {"n": n, **({"note": "v2"} if version == 2 else {})}
    if fail:
        payload["drill"] = "fail"
    return build(
        Event,
        event_id=stable_event_id(project, TYPE, f"t{n}"),
        event_type=TYPE,
        event_version=version,
        tenant_id="tenant",
        project_id=project,
        actor="test",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=n),
        payload=payload,
        slot=n,
    )


def _parked(world: World) -> dict[TP, dict[str, Park]]:
    return {tp: world.store.load(tp).parked for tp in world.stream_partitions()}


def test_a_newer_event_parks_its_project_and_the_partition_flows_for_the_others() -> None:
    world = World()
    alpha, beta = PROJECTS_SHARING
    tp = world.tp_of(alpha)
    assert world.tp_of(beta) == tp
    world.publish(done(alpha, 1))
    parked_at = world.publish(done(alpha, 2, version=2))
    world.publish(done(alpha, 3))  # after the parked one: it must wait too
    for n in range(1, 4):
        world.publish(done(beta, n))
    runner = world.runner(Ledger(), catalog=OLD, max_batch_failures=1)
    world.drain(runner)
    assert world.ledger() == {alpha: [1], beta: [1, 2, 3]}
    assert world.dead.list() == [] and runner.stats.failures == 0
    assert runner.stats.parked == 2
    progress = world.store.load(tp)
    assert progress.parked == {alpha: Park(parked_at, TYPE, 2)}
    assert progress.acked_through == world.log.end(tp) - 1  # not stuck


def test_the_park_costs_one_entry_however_many_events_wait() -> None:
    sizes = []
    for waiting in (1, 300):
        world = World()
        world.publish(done("alpha", 1, version=2))
        for n in range(2, waiting + 2):
            world.publish(done("alpha", n, fail=(n % 7 == 0)))
        world.drain(world.runner(Ledger(), catalog=OLD), max_rounds=2000)
        fields = world.store.load(world.tp_of("alpha")).as_fields()
        sizes.append(fields["parked"])
    assert sizes[0] == sizes[1]


def test_an_upgraded_consumer_applies_the_parked_events_in_order_then_the_new_ones() -> None:
    world = World()
    alpha, beta = PROJECTS_SHARING
    for n in range(1, 4):
        world.publish(done(alpha, n, version=2 if n == 2 else 1))
        world.publish(done(beta, n))
    old = world.runner(Ledger(), catalog=OLD)
    world.drain(old)
    old.close()
    assert world.ledger() == {alpha: [1], beta: [1, 2, 3]}
    # Published while the upgraded consumer drains: after the parked ones, never before.
    world.publish(done(alpha, 4))
    new = world.runner(Ledger(), catalog=NEW, parked_drain_records=1, cuts=cuts_from([1] * 50))
    world.drain(new)
    assert world.ledger() == {alpha: [1, 2, 3, 4], beta: [1, 2, 3]}
    assert set(world.ledger_counts().values()) == {1}
    assert all(not parks for parks in _parked(world).values())


def test_a_fold_is_rebuilt_without_the_parked_events_and_the_upgrade_folds_them_once() -> None:
    world = World()
    for n in range(1, 6):
        world.publish(done("alpha", n, version=2 if n == 3 else 1))
    old = world.runner(Counter(), catalog=OLD)
    world.drain(old)
    old.close()
    assert world.states()["alpha"] == {"count": 2, "seen": [1, 2]}
    # An operator's re_reduce while parked folds what was applied, not what waits.
    world.controls(Counter()).re_reduce(world.tp_of("alpha"), who="oncall", why="check")
    assert world.states()["alpha"] == {"count": 2, "seen": [1, 2]}
    world.drain(world.runner(Counter(), catalog=NEW))
    assert world.states()["alpha"] == {"count": 5, "seen": [1, 2, 3, 4, 5]}
    assert sorted(r["n"] for r in world.out_records()) == [1, 2, 3, 4, 5]


def test_past_parked_projects_max_the_partition_stops_until_the_upgrade() -> None:
    world = World()
    alpha, beta = PROJECTS_SHARING
    world.publish(done(alpha, 1, version=2))
    stopped_at = world.publish(done(beta, 1, version=2))
    world.publish(done(alpha, 2))
    world.publish(done(beta, 2))
    runner = world.runner(Ledger(), catalog=OLD, parked_projects_max=1)
    for _ in range(20):
        runner.run_once(timeout=0)
        world.clock.advance(10)
    tp = world.tp_of(alpha)
    progress = world.store.load(tp)
    assert progress.acked_through == stopped_at - 1 and list(progress.parked) == [alpha]
    assert runner.stats.failures == 0 and world.dead.list() == []
    runner.close()
    world.drain(world.runner(Ledger(), catalog=NEW, parked_projects_max=1))
    assert world.ledger() == {alpha: [1, 2], beta: [1, 2]}


def test_an_upgraded_consumer_stopped_for_want_of_room_drains_to_make_some() -> None:
    world = World()
    alpha, beta = PROJECTS_SHARING
    tp = world.tp_of(alpha)
    third = next(f"p{i}" for i in range(1000) if world.tp_of(f"p{i}") == tp and f"p{i}" != beta)
    world.publish(done(alpha, 1, version=2))
    world.publish(done(alpha, 2))
    world.drain(world.runner(Ledger(), catalog=OLD, parked_projects_max=1))
    # Newer than even the upgraded consumer knows, with no room left while alpha is parked.
    world.publish(done(third, 1, version=3))
    world.publish(done(beta, 1))
    world.drain(world.runner(Ledger(), catalog=NEW, parked_projects_max=1))
    assert world.ledger() == {alpha: [1, 2], beta: [1]}
    assert world.store.load(tp).parked == {third: Park(2, TYPE, 3)}


def test_parked_events_the_stream_lost_are_read_from_the_archive() -> None:
    world = World()
    world.publish(done("alpha", 1, version=2))
    world.publish(done("alpha", 2))
    old = world.runner(Ledger(), catalog=OLD)
    world.drain(old)
    old.close()
    tp = world.tp_of("alpha")
    runner = world.runner(Ledger(), catalog=NEW)
    assert runner.controls is not None
    stream = MemoryReader(world.log)
    stream.start[tp] = world.log.end(tp)  # retention took them all
    runner.controls.reader = stream
    world.drain(runner)  # no archive: refused, said, and left parked
    assert world.ledger() == {} and list(world.store.load(tp).parked) == ["alpha"]
    runner.controls.archive = MemoryReader(world.log)
    world.clock.advance(runner.policy.retry_backoff_max_s)
    world.drain(runner)
    assert world.ledger() == {"alpha": [1, 2]}


class _CutShort(MemoryReader):
    """A stream that stops answering after ``keep`` records of a range."""

    def __init__(self, log: Any, keep: int) -> None:
        super().__init__(log)
        self.keep = keep

    def read(self, tp: TP, start: int, end: int) -> Iterator[Record]:
        for n, record in enumerate(super().read(tp, start, end)):
            if n == self.keep:
                raise Unreachable("Kafka", "memory", f"reading {tp}: nothing more came")
            yield record


def test_a_read_cut_short_leaves_the_rest_of_the_park_for_the_next_try() -> None:
    world = World()
    for n in range(1, 5):
        world.publish(done("alpha", n, version=2 if n == 1 else 1))
    old = world.runner(Ledger(), catalog=OLD)
    world.drain(old)
    old.close()
    tp = world.tp_of("alpha")
    runner = world.runner(Ledger(), catalog=NEW, batch_size=1)
    assert runner.controls is not None
    runner.controls.reader = _CutShort(world.log, keep=2)
    world.drain(runner)  # two applied, then the stream stopped answering: the rest stays parked
    assert world.ledger() == {"alpha": [1, 2]}
    assert list(world.store.load(tp).parked) == ["alpha"]
    runner.controls.reader = MemoryReader(world.log)
    world.clock.advance(runner.policy.retry_backoff_max_s)
    world.drain(runner)
    assert world.ledger() == {"alpha": [1, 2, 3, 4]}
    assert not world.store.load(tp).parked


def test_a_redelivered_event_newer_than_the_consumer_fails_with_what_to_do() -> None:
    world = World()
    world.publish(done("alpha", 1, fail=True))
    world.drain(world.runner(Ledger(), catalog=OLD, max_batch_failures=1))
    letter = world.dead.list()[0]
    # The letter's event comes back rewritten at version 2 (a writer's newer copy of it).
    tp = world.tp_of("alpha")
    actions = world.actions()
    sent: list[bytes] = []
    send = actions.send

    def newer(topic: str, partition: int | None, key: bytes | None, value: bytes, h: Any) -> None:
        value = value.replace(b'"eventVersion":1', b'"eventVersion":2')
        sent.append(value)
        send(topic, partition, key, value, h)

    actions.send = newer
    actions.retry(letter.id, who="oncall", why="try again")
    assert sent and b'"eventVersion":2' in sent[0]
    world.drain(world.runner(Ledger(), catalog=OLD, max_batch_failures=1))
    assert world.ledger() == {}
    errors = [d.error for d in world.dead.list() if d.id != letter.id]
    assert errors and NewerThanKnown.__name__ in errors[0] and "upgrade the consumer" in errors[0]
    assert world.store.load(tp).parked == {}


def test_the_parked_projects_gauge_counts_per_partition() -> None:
    world = World()
    alpha, beta = PROJECTS_SHARING
    world.publish(done(alpha, 1, version=2))
    world.publish(done(beta, 1, version=2))
    world.publish(done("gamma", 1))
    reader = InMemoryMetricReader()
    instruments = RuntimeInstruments(MeterProvider([reader]).get_meter("test"))
    runner = world.runner(Ledger(), catalog=OLD)
    instruments.watch_parked(runner.processor.slug, runner._parked_counts)
    world.drain(runner)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (str(a["topic"]), str(a["partition"])): point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "rhumbatron_parked_projects"
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint) and (a := point.attributes or {})
    }
    tp = world.tp_of(alpha)
    assert points[(tp.topic, str(tp.partition))] == 2
    assert set(points) == {(t.topic, str(t.partition)) for t in world.stream_partitions()}
    assert sum(points.values()) == 2


# -- the property ----------------------------------------------------------------------------------
# One step of a workload: a project, and what it publishes next (an event its consumer knows, one
# of a newer version, one that fails every time, or a copy of its latest event).
KINDS = ["v1", "v1", "v1", "v2", "fail", "copy"]
Step = tuple[int, str]


def _publish(world: World, steps: list[Step], start: dict[str, int]) -> list[Event]:
    """Publish ``steps``; the events in log order (copies included), numbered on from
    ``start``."""
    published: list[Event] = []
    latest: dict[str, Event] = {}
    for index, kind in steps:
        project = PROJECTS[index]
        if kind == "copy" and project in latest:
            ev = latest[project]
        else:
            start[project] = n = start.get(project, 0) + 1
            ev = done(project, n, version=2 if kind == "v2" else 1, fail=kind == "fail")
            latest[project] = ev
        world.publish(ev)
        published.append(ev)
    return published


def _oracle(events: list[Event], knows: Callable[[Event], bool]) -> dict[str, list[int]]:
    """Per project, the slots applied in order: each event once, failing ones left out (dead
    lettered), and nothing from a project's first event its consumer does not know on."""
    applied: dict[str, list[int]] = {}
    seen: set[str] = set()
    parked: set[str] = set()
    for ev in events:
        if ev.event_id in seen:
            continue
        seen.add(ev.event_id)
        if ev.project_id in parked or not knows(ev):
            parked.add(ev.project_id)
            continue
        if ev.payload.get("drill") != "fail":
            applied.setdefault(ev.project_id, []).append(ev.slot or 0)
    return applied


steps_strategy = st.lists(
    st.tuples(st.integers(0, len(PROJECTS) - 1), st.sampled_from(KINDS)), max_size=30
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=steps_strategy,
    after=steps_strategy,
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=20),
    drain_records=st.integers(1, 12),
)
def test_parking_keeps_every_project_in_order_and_the_upgrade_completes_it(
    before: list[Step], after: list[Step], cuts: list[int], drain_records: int
) -> None:
    note(f"{before=} {after=} {cuts=} {drain_records=}")
    world = World()
    numbers: dict[str, int] = {}
    first = _publish(world, before, numbers)
    old = world.runner(Ledger(), catalog=OLD, cuts=cuts_from(cuts * 50))
    world.drain(old, max_rounds=3000)
    expected = _oracle(first, lambda ev: not OLD.is_newer(ev))
    assert world.ledger() == {p: slots for p, slots in expected.items() if slots}
    assert set(world.ledger_counts().values()) <= {1}
    # No parked event failed or was dead-lettered: only events the consumer read, each letter
    # after exactly max_batch_failures attempts.
    parked_projects = {ev.project_id for ev in first if OLD.is_newer(ev)}
    letters = world.dead.list()
    for letter in letters:
        parks = world.store.load(TP(letter.source_topic, letter.source_partition)).parked
        for entry in letter.entries:
            assert entry.value is not None and b'"eventVersion":2' not in entry.value
            park = parks.get(entry.project_id or "")
            assert park is None or entry.offset < park.offset
    assert old.stats.failures == 5 * len(letters)
    # One entry per parked project, whatever waits behind it.
    by_partition = _parked(world)
    assert {p for by_project in by_partition.values() for p in by_project} == parked_projects
    for tp, by_project in by_partition.items():
        assert len(world.store.load(tp).as_fields()["parked"]) <= 2 + 64 * len(by_project)
    old.close()

    # The upgrade, with more events arriving while it applies what waited.
    second = _publish(world, after, numbers)
    new = world.runner(
        Ledger(), catalog=NEW, cuts=cuts_from(cuts * 50), parked_drain_records=drain_records
    )
    world.drain(new, max_rounds=3000)
    expected = _oracle(first + second, lambda ev: True)
    assert world.ledger() == {p: slots for p, slots in expected.items() if slots}
    assert set(world.ledger_counts().values()) <= {1}
    assert all(not by_project for by_project in _parked(world).values())
