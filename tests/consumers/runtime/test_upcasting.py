"""Upcasters on every path that decodes an event for a processor, and envelopes written by a newer
writer, on the in-memory runtime (and once through the real broker).

The catalog (tests/support/versioned_catalog.py) has ``note.written`` at versions 1, 2 and 3; the
test processor's fold reads the newest model only. Live delivery, a dead letter's retry (back
through the redelivery topic into the same runner), a refold, a reprocess, a rebuild from the
archive and the testing harness all hand it version 3; the archiver keeps every event as written
(its version, and fields this code does not know)."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.runtime.controls import Controls, MemoryAuditLog
from consumers.runtime.memory_transport import MemoryReader, cuts_from
from consumers.runtime.types import (
    JSON,
    TP,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    Progress,
    RedisOp,
)
from consumers.subscriptions.archive.archiver import AuditArchiver, PartLimits
from consumers.subscriptions.archive.reader import StoreArchiveReader
from consumers.subscriptions.projector.processor import ProjectViewProjector
from rhumbatron import testing
from streams.catalog import Catalog
from streams.envelopes import Event, build, decode_event, encode
from streams.ids import stable_event_id
from streams.workload import project_events, slotted_events
from tests.support.archive import MemoryObjects
from tests.support.causal_router import drive as drive_router
from tests.support.causal_router import graph_history, make_router, open_test_outbox
from tests.support.runtime_harness import LIMIT, PARTITIONS, STREAMS, World
from tests.support.versioned_catalog import (
    NOTE,
    NOTE_SPECS,
    READ,
    VERSIONED,
    NoteV1,
    NoteV3,
    note_2_to_3,
    spec,
)

PROJECTS = ["alpha", "beta", "gamma"]
STREAM_INDEX = {name: n for n, name in enumerate(STREAMS)}
START = datetime(2026, 1, 1, tzinfo=UTC)


def note(
    project: str, n: int, version: int, *, newer_writer: bool = False, event_type: str = NOTE
) -> Event:
    """Note n of ``project``, written at ``version``; by a newer writer, with a field this code
    does not know in the envelope and one in the payload."""
    payload: dict[str, Any] = (
        {"name": f"n{n}"} if version == 1 else {"title": f"n{n}", "priority": n % 3}
    )
    if version == 2:
        del payload["priority"]
    extra: dict[str, Any] = {}
    if newer_writer:
        payload["colour"] = "red"
        extra["traceState"] = {"vendor": [n, None]}
    return build(
        Event,
        event_id=stable_event_id(None, event_type, None, f"{project}/{n}"),
        event_type=event_type,
        event_version=version,
        tenant_id="t",
        project_id=project,
        actor="tests",
        timestamp=START + timedelta(seconds=n),
        payload=payload,
        **extra,
    )


def read_as_newest(ev: Event) -> list[Any]:
    """What the fold should hold for ``ev``: its title, and its priority (0 before version 3)."""
    title = ev.payload.get("title", ev.payload.get("name"))
    n = ev.payload.get("priority", 0) if ev.event_version == 3 else 0
    return [title, n, 3]


class NoteFold(BaseProcessor):
    """Folds each project's notes as the newest model reads them; records the version each
    event reached ``process`` with."""

    slug: ClassVar[str] = "note-fold"
    consumes: ClassVar[frozenset[str] | None] = frozenset({NOTE})
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS
    failing: ClassVar[set[str]] = set()  # event ids whose process raises

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        model = NoteV3.model_validate(event.payload)  # the newest version only
        notes = (state or {}).get("notes", [])
        return {"notes": [*notes, [model.title, model.priority, event.event_version]]}

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if event.event_id in self.failing:
            raise RuntimeError("the service behind it is down")
        return Effects(redis=[RedisOp("HSET", "seen", (event.event_id, event.event_version))])


def seen_versions(world: World) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in world.store.space.data.items():
        if key.endswith("|seen"):
            out.update({k: int(v) for k, v in value.items()})  # type: ignore[attr-defined]
    return out


def drain(world: World, processor: Any, **kw: Any) -> None:
    runner = world.runner(processor, **kw)
    world.drain(runner)
    runner.close()


def archiver(objects: MemoryObjects) -> AuditArchiver:
    return AuditArchiver(
        objects, PartLimits(4, 1 << 20, 60.0), STREAM_INDEX, max_envelope_bytes=LIMIT
    )


def archived_events(objects: MemoryObjects) -> dict[str, bytes]:
    """Each archived event's envelope bytes, by event id."""
    out: dict[str, bytes] = {}
    for key in objects.list("events/"):
        for raw in gzip.decompress(objects.get(key)).splitlines():
            envelope = orjson.loads(raw)["event"]
            out[envelope["eventId"]] = orjson.dumps(envelope)
    return out


def expected_folds(events: list[Event]) -> dict[str, JSON]:
    folds: dict[str, JSON] = {}
    for ev in events:
        if ev.event_type == NOTE:
            folds.setdefault(ev.project_id, {"notes": []})["notes"].append(read_as_newest(ev))
    return folds


def rebuild_from_archive(world: World, objects: MemoryObjects, catalog: Catalog) -> int:
    """Every partition's fold wiped and rebuilt by re_reduce, the stream holding only its last
    record: the rest comes from the archive. Returns the number of archive parts read."""
    reader = MemoryReader(world.log)
    archive = StoreArchiveReader(objects, STREAM_INDEX)
    controls = Controls(
        NoteFold(),
        world.store,
        reader,
        MemoryAuditLog(),
        world.dead,
        world.clock,
        LIMIT,
        archive=archive,
        catalog=catalog,
    )
    for tp in (TP(s, p) for s in STREAMS for p in range(PARTITIONS)):
        if not world.log.end(tp):
            continue
        reader.start[tp] = world.log.end(tp) - 1
        progress = world.store.load(tp)
        world.store.replace_fold(
            tp, None, (progress.acked_through, progress.cursor_revision), progress, {}
        )
        controls.re_reduce(tp, who="test", why="rebuild from the archive")
    return archive.parts_read


# -- the property: live over mixed versions == rebuilt from the archive --------------------------

mixed = st.lists(
    st.tuples(st.sampled_from(PROJECTS), st.integers(1, 3), st.booleans(), st.booleans()),
    min_size=1,
    max_size=24,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed, st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_a_fold_over_mixed_versions_is_the_same_live_and_rebuilt_from_the_archive(
    items: list[tuple[str, int, bool, bool]], cuts: list[int]
) -> None:
    world = World(catalog=VERSIONED)
    events = []
    for n, (project, version, newer, other_type) in enumerate(items, start=1):
        ev = note(project, n, version, newer_writer=newer, event_type=READ if other_type else NOTE)
        world.publish(ev)
        events.append(ev)
    objects = MemoryObjects()
    drain(World(log=world.log, catalog=VERSIONED), archiver(objects))
    drain(world, NoteFold(), cuts=cuts_from(cuts))

    live = world.states()
    assert live == expected_folds(events)
    assert set(seen_versions(world).values()) <= {3}  # process saw the newest version too
    # The archive holds every event as it was written: its version, the newer writer's fields.
    archived = archived_events(objects)
    assert archived == {ev.event_id: encode(ev, max_bytes=LIMIT) for ev in events}

    parts_read = rebuild_from_archive(world, objects, VERSIONED)
    assert world.states() == live
    assert parts_read > 0 or all(world.log.end(tp) <= 1 for tp in world.stream_partitions())


def test_a_newer_writers_fields_are_kept_in_the_archive_and_ignored_by_the_fold() -> None:
    world = World(catalog=VERSIONED)
    plain = [note("alpha", n, 1 + n % 3) for n in range(1, 7)]
    newer = [note("beta", n, 1 + n % 3, newer_writer=True) for n in range(1, 7)]
    for ev in [*plain, *newer]:
        world.publish(ev)
    objects = MemoryObjects()
    drain(World(log=world.log, catalog=VERSIONED), archiver(objects))
    drain(world, NoteFold())
    states = world.states()
    assert states["alpha"] == states["beta"]  # the unknown fields changed nothing
    for ev in newer:
        line = orjson.loads(archived_events(objects)[ev.event_id])
        assert line["traceState"] == ev.model_extra["traceState"]  # type: ignore[index]
        assert line["payload"]["colour"] == "red"
        assert line["eventVersion"] == ev.event_version  # as written, not upcast


def test_an_envelope_not_in_canonical_form_is_archived_as_written_not_upcast() -> None:
    # The archiver writes such an event again (the record's bytes are not its encoding): it must
    # write the event it decoded, not the upcast one.
    world = World(catalog=VERSIONED)
    ev = note("alpha", 1, 1, newer_writer=True)
    wire = orjson.loads(encode(ev, max_bytes=LIMIT))
    first = {"traceState": wire.pop("traceState"), **wire}  # the unknown field first
    world.publish_raw(world.tp_of("alpha"), orjson.dumps(first))
    objects = MemoryObjects()
    drain(World(log=world.log, catalog=VERSIONED), archiver(objects))
    assert archived_events(objects) == {ev.event_id: encode(ev, max_bytes=LIMIT)}


# -- every other path ------------------------------------------------------------------------------


def test_a_retried_dead_letter_comes_back_through_the_runner_upcast() -> None:
    world = World(catalog=VERSIONED)
    old = note("alpha", 1, 1)
    world.publish(old)
    NoteFold.failing = {old.event_id}
    try:
        runner = world.runner(NoteFold())
        world.drain(runner)
        (letter,) = world.dead.list()
        assert letter.entries[0].value == encode(old, max_bytes=LIMIT)  # the bytes as written
        assert world.states() == {}
        NoteFold.failing = set()
        world.actions().retry(letter.id, who="oncall", why="the service is back")
        world.drain(runner)
    finally:
        NoteFold.failing = set()
    assert world.states() == {"alpha": {"notes": [["n1", 0, 3]]}}
    assert seen_versions(world) == {old.event_id: 3}


def test_re_reduce_and_reprocess_read_the_newest_version() -> None:
    world = World(catalog=VERSIONED)
    events = [note(p, n, 1 + n % 3) for n in range(1, 10) for p in PROJECTS[:2]]
    for ev in events:
        world.publish(ev)
    drain(world, NoteFold())
    live = world.states()
    assert live == expected_folds(events)
    controls = world.controls(NoteFold())
    for tp in (TP(s, p) for s in STREAMS for p in range(PARTITIONS)):
        progress = world.store.load(tp)
        if not progress.has_cursor():
            continue
        controls.re_reduce(tp, who="test", why="refold")
        assert world.store.all_states(tp) == {k: live[k] for k in world.store.all_states(tp)}
        controls.reprocess_from(tp, 2, progress.cursor_revision, who="test", why="again")
    drain(world, NoteFold())
    assert world.states() == live


def test_a_reader_one_release_behind_folds_what_it_knows_and_not_the_newest() -> None:
    # Its catalog stops at version 2: version 1 is upcast to 2, version 2 is as written; the
    # fold here reads the v2 model. (A version 3 event is newer than it knows: parked, not
    # handed over; that is the parking's own test.)
    class V2Fold(NoteFold):
        def reduce(self, state: JSON | None, event: Event) -> JSON | None:
            notes = (state or {}).get("notes", [])
            return {"notes": [*notes, [event.payload["title"], event.event_version]]}

    behind = Catalog(
        events=(*NOTE_SPECS[:2], spec(READ, 1, NoteV1)),
        commands=(),
        upcasters={(NOTE, 1): VERSIONED.upcasters[(NOTE, 1)]},
    )
    world = World(catalog=behind)
    for n, version in ((1, 1), (2, 2), (3, 1)):
        world.publish(note("alpha", n, version))
    drain(world, V2Fold())
    assert world.states() == {"alpha": {"notes": [["n1", 2], ["n2", 2], ["n3", 2]]}}


def _exploding(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["title"] == "n2":
        raise KeyError("priority source")
    return note_2_to_3(payload)


def test_an_upcaster_that_raises_fails_its_event_and_only_its_project() -> None:
    broken = Catalog(
        events=VERSIONED.events,
        commands=(),
        upcasters={**VERSIONED.upcasters, (NOTE, 2): _exploding},
    )
    world = World(catalog=broken)
    alpha = [note("alpha", n, 2) for n in (1, 2, 3)]
    for ev in [*alpha, note("gamma", 4, 2)]:
        world.publish(ev)
    drain(world, NoteFold())
    (letter,) = world.dead.list()
    assert letter.entries[0].event_id == alpha[1].event_id
    assert "UpcastFailed" in letter.error and "KeyError" in letter.error
    assert "from version 2 to 3" in letter.error and "priority source" in letter.error
    states = world.states()
    assert states["gamma"] == {"notes": [["n4", 0, 3]]}
    # Dead-lettered after its tries, then its project moved on.
    assert states["alpha"] == {"notes": [["n1", 0, 3], ["n3", 0, 3]]}
    # A fold of the same log leaves it out the same way, and reports it.
    tp = world.tp_of("alpha")
    fresh = World(log=world.log, catalog=broken)
    fold = fresh.controls(NoteFold()).fold(tp, Progress(), world.log.end(tp) - 1)
    assert fold.states["alpha"] == states["alpha"]
    assert [e.event_id for _, e, _ in fold.refused] == [alpha[1].event_id]


def test_the_testing_harness_hands_the_processor_the_newest_version() -> None:
    events = [note(p, n, 1 + n % 3, newer_writer=n % 2 == 0) for n in range(1, 7) for p in PROJECTS]
    result = testing.run(NoteFold, events, catalog=VERSIONED)
    assert result.folds == expected_folds(events)
    clean = testing.assert_exactly_once(
        NoteFold, events[:5], catalog=VERSIONED, exhaustive_up_to=2, random_shapes=2
    )
    assert clean.folds == expected_folds(events[:5])
    moved = testing.run(NoteFold, events, catalog=VERSIONED, operator_move=("reprocess", 8))
    assert moved.folds == expected_folds(events)


# -- the built-in subscriptions treat a newer writer's envelope as before ------------------------


def _newer(ev: Event) -> Event:
    """``ev`` as a newer writer would write it: an envelope field and a payload field more."""
    fields = {name: getattr(ev, name) for name in Event.model_fields}
    fields["payload"] = {**ev.payload, "colourOfTheDay": "red"}
    return build(Event, **fields, traceState={"vendor": "x"}, writerRelease=7)


def test_the_projector_treats_a_newer_writers_events_as_before() -> None:
    events = slotted_events(project_events("alpha", 30), tenant_id="t", start=START)
    projector = ProjectViewProjector(feed_length=50, missing_cap=1000)
    before = testing.run(projector, events)
    after = testing.run(
        ProjectViewProjector(feed_length=50, missing_cap=1000), [_newer(e) for e in events]
    )
    assert after.redis == before.redis
    assert after.dead_letters == before.dead_letters == []


def test_the_causal_router_treats_a_newer_writers_events_as_before(tmp_path: Path) -> None:
    events = graph_history().events
    before = drive_router(make_router(open_test_outbox(tmp_path / "a.db")), events)
    newer = [decode_event(encode(_newer(e), max_bytes=LIMIT), max_bytes=LIMIT) for e in events]
    after = drive_router(make_router(open_test_outbox(tmp_path / "b.db")), newer)
    assert before and after == before
