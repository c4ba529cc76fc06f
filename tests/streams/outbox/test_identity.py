"""The outbox's identity: made once with the outbox and kept in its database (the same outbox
under another address, or restored from a backup, keeps it; openers racing to make it agree on
one), set by every publisher of the outbox on every record it sends (the ``outbox`` header), read
back by :func:`outbox_position`, which refuses anything malformed without raising, and carried
by an operator's retry of a dead letter."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import (
    DeadLetter,
    Entry,
    LetterKind,
    LetterStatus,
    MemoryDeadLetters,
    batch_letter_id,
)
from consumers.runtime.types import TP
from streams.clock import ManualClock
from streams.envelopes import Event, format_time
from streams.headers import ATTEMPT, EVENT_ID, EVENT_TYPE, ORIGIN_TOPIC, OUTBOX, is_ours
from streams.outbox.identity import (
    ID_PATTERN,
    OutboxPosition,
    is_outbox_id,
    new_outbox_id,
    outbox_position,
)
from streams.outbox.publisher import Publisher
from streams.outbox.standby import take_over
from streams.outbox.store import RowState
from streams.producer import DeliveryCallback, Headers
from tests.support.outbox import OutboxBackend, SimulatedKafka, append_all, drafts, policy

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
AN_ID = "obx_0123456789abcdef"


@dataclass
class RecordingKafka(SimulatedKafka):
    """SimulatedKafka that also keeps every record's headers, in send order."""

    sent: list[tuple[bytes, Headers]] = field(default_factory=list)

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        self.sent.append((value, list(headers)))
        super().produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)


def _event(slot: Any = 7) -> Event:
    event = drafts("proj-a", 1)[0].to_event(tenant_id="tenant-t", timestamp=T0, slot=1)
    return event.model_copy(update={"slot": slot})


def _named(headers: Headers, name: str) -> list[bytes]:
    return [value for key, value in headers if key == name]


# -- the id and its parse -----------------------------------------------------------------------
def test_a_new_id_is_short_random_and_matches_the_grammar_as_both_backends_spell_it() -> None:
    made = {new_outbox_id() for _ in range(500)}
    assert len(made) == 500
    for outbox_id in made:
        assert len(outbox_id) == 20 and is_outbox_id(outbox_id)
        assert re.search(ID_PATTERN, outbox_id)
    assert not is_outbox_id(None) and not is_outbox_id(b"obx_0123456789abcdef")


def test_outbox_position_is_the_header_and_the_slot() -> None:
    headers = [(EVENT_TYPE, b"task.completed"), (OUTBOX, AN_ID.encode()), (EVENT_ID, b"evt_x")]
    assert outbox_position(headers, _event(7)) == OutboxPosition(AN_ID, 7)
    # The same value twice (a header copied on by a tool) is still one identity; text is read too.
    assert outbox_position([*headers, (OUTBOX, AN_ID.encode())], _event(7)) == (AN_ID, 7)
    assert outbox_position([(OUTBOX, AN_ID)], _event(3)) == (AN_ID, 3)
    assert outbox_position(iter([(OUTBOX, bytearray(AN_ID.encode()))]), _event(3)) == (AN_ID, 3)
    # As streams.headers.header_dict gives them.
    assert outbox_position({OUTBOX: AN_ID.encode()}, _event(3)) == (AN_ID, 3)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(None, id="no-headers-at-all"),
        pytest.param([], id="empty"),
        pytest.param([(EVENT_ID, b"evt_x")], id="no-outbox-header"),
        pytest.param([(OUTBOX, None)], id="no-value"),
        pytest.param([(OUTBOX, b"")], id="empty-value"),
        pytest.param([(OUTBOX, AN_ID.upper().encode())], id="upper-case"),
        pytest.param([(OUTBOX, b"obx_0123456789abcde")], id="15-hex"),
        pytest.param([(OUTBOX, b"obx_0123456789abcdef0")], id="17-hex"),
        pytest.param([(OUTBOX, b"obx_0123456789abcdeg")], id="not-hex"),
        pytest.param([(OUTBOX, b"obx_0123456789abcdef\n")], id="trailing-newline"),
        pytest.param([(OUTBOX, b" obx_0123456789abcdef")], id="leading-space"),
        pytest.param([(OUTBOX, b"ob_0123456789abcdef0")], id="wrong-prefix"),
        pytest.param([(OUTBOX, b"obx_0123456789abcd\xff\xfe")], id="not-ascii"),
        pytest.param([(OUTBOX, "obx_\uff10123456789abcdef".encode())], id="fullwidth-digit"),
        pytest.param([(OUTBOX, 42)], id="a-number"),
        pytest.param([(OUTBOX, AN_ID.encode()), (OUTBOX, b"obx_fedcba9876543210")], id="two"),
        pytest.param([(OUTBOX, AN_ID.encode()), (OUTBOX, b"junk")], id="one-good-one-bad"),
        pytest.param([(OUTBOX,), ("x", b"y", b"z")], id="not-pairs"),
        pytest.param({OUTBOX: b"junk"}, id="a-mapping-of-junk"),
        pytest.param(42, id="not-iterable"),
        pytest.param(AN_ID, id="a-string"),
    ],
)
def test_a_malformed_or_missing_header_is_no_identity_and_never_raises(headers: Any) -> None:
    assert outbox_position(headers, _event(7)) is None


@pytest.mark.parametrize("slot", [None, 0, -1, True, 2.0, "7"])
def test_an_event_without_a_whole_slot_has_no_position(slot: Any) -> None:
    assert outbox_position([(OUTBOX, AN_ID.encode())], _event(slot)) is None


def test_a_header_iterator_that_fails_is_no_identity() -> None:
    def broken() -> Any:
        yield (OUTBOX, AN_ID.encode())
        raise RuntimeError("the client broke mid-way")

    assert outbox_position(broken(), _event(7)) is None


# -- the header travels where an event is sent on ------------------------------------------------
def test_the_outbox_header_is_an_identity_header_and_an_operator_retry_carries_it() -> None:
    assert not is_ours(OUTBOX)
    store = MemoryDeadLetters()
    source = "rhumbatron_events_00_t"
    carried: list[tuple[str, bytes | None]] = [
        (EVENT_TYPE, b"task.completed"),
        (EVENT_ID, b"evt_1"),
        (OUTBOX, AN_ID.encode()),
        (ATTEMPT, b"3"),  # ours: dropped and written afresh
    ]
    letter = DeadLetter(
        id=batch_letter_id("ledger", source, 1, 5, LetterKind.EVENT_BATCH),
        kind=LetterKind.EVENT_BATCH,
        source_topic=source,
        source_partition=1,
        error="boom",
        error_type="ValueError",
        attempts=5,
        created_at=format_time(T0),
        entries=[Entry(5, b'{"n": 5}', b"proj", carried)],
        subscription="ledger",
    )
    store.write([letter])
    sent: list[list[tuple[str, bytes]]] = []
    actions = DeadLetterActions(
        store,
        ManualClock(T0),
        lambda topic, partition, key, value, headers: sent.append(headers),
        lambda slug: f"rhumbatron_redelivery_{slug}_t",
        lambda tp: tp.partition if tp == TP(source, 1) else None,
        lambda purpose: f"rhumbatron_queue_{purpose}_t",
    )
    assert actions.retry(letter.id, who="alice").status == LetterStatus.RETRIED
    [headers] = sent
    assert _named(headers, OUTBOX) == [AN_ID.encode()]
    # Beside it the identity headers stay, ours are written afresh (the retry's origin).
    assert _named(headers, EVENT_ID) == [b"evt_1"] and not _named(headers, ATTEMPT)
    assert _named(headers, ORIGIN_TOPIC) == [source.encode()]


# -- SQLite: made with the schema, once --------------------------------------------------------
def _sqlite(path: Path, *, create: bool = True) -> Any:
    from streams.outbox.sqlite import SqliteOutbox
    from streams.outbox.sqlite_schema import SqliteOptions

    return SqliteOutbox(
        path,
        options=SqliteOptions(
            max_envelope_bytes=256 * 1024, missed_report_limit=10, busy_timeout_s=30.0
        ),
        create=create,
    )


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT one, outbox_id FROM outbox_identity").fetchall()


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def test_a_sqlite_outbox_is_given_its_identity_once_and_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    first = _sqlite(path)
    made = first.outbox_id()
    assert is_outbox_id(made)
    first.close()
    again = _sqlite(path, create=False)
    assert again.outbox_id() == made
    again.close()
    assert _rows(path) == [(1, made)]
    # A file an older release still opens: the schema's version is unchanged.
    assert _user_version(path) == 1


def test_the_same_sqlite_outbox_under_another_path_or_restored_from_a_backup_keeps_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.db"
    store = _sqlite(path)
    append_all(store, drafts("proj-a", 3))
    made = store.outbox_id()
    link = tmp_path / "elsewhere.db"
    os.symlink(path, link)
    via_link = _sqlite(link, create=False)
    assert via_link.outbox_id() == made
    via_link.close()
    restored = tmp_path / "restored" / "outbox.db"
    restored.parent.mkdir()
    with sqlite3.connect(path) as live, sqlite3.connect(restored) as copy:
        live.backup(copy)
    store.close()
    from_backup = _sqlite(restored, create=False)
    assert from_backup.outbox_id() == made and from_backup.last_slot("proj-a") == 3
    from_backup.close()


def _race(path: Path, openers: int, *, create: bool) -> list[str | None]:
    """``openers`` stores opened on ``path`` at once, each on its own connection; what each read
    as the identity right after its own open."""
    start = threading.Barrier(openers)
    seen: list[str | None] = [None] * openers
    errors: list[BaseException] = []

    def open_one(n: int) -> None:
        try:
            start.wait()
            store = _sqlite(path, create=create)
            seen[n] = store.outbox_id()
            store.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return seen


def test_openers_racing_on_a_new_sqlite_file_agree_on_one_identity(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    seen = _race(path, 8, create=True)
    [(_, kept)] = _rows(path)
    assert seen == [kept] * 8


def test_an_outbox_made_before_the_identity_gets_one_on_its_first_open_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.db"
    store = _sqlite(path)
    append_all(store, drafts("proj-a", 2))
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE outbox_identity")  # as the release before made it
    # Openers that do not create (publishers, operators) race to give it its identity.
    seen = _race(path, 6, create=False)
    [(_, kept)] = _rows(path)
    assert is_outbox_id(kept) and seen == [kept] * 6
    assert _user_version(path) == 1
    reopened = _sqlite(path, create=False)
    assert reopened.outbox_id() == kept and reopened.last_slot("proj-a") == 2
    reopened.close()


# -- both backends: every publisher of an outbox names it on every record ------------------------
def test_every_record_a_publisher_sends_names_the_outbox(outbox_backend: OutboxBackend) -> None:
    store = outbox_backend.store()
    append_all(store, [*drafts("proj-a", 3), *drafts("proj-b", 2)])
    [(stored,)] = outbox_backend.query("SELECT outbox_id FROM outbox_identity")
    assert is_outbox_id(stored) and store.outbox_id() == stored
    kafka = RecordingKafka()
    with Publisher(store, lambda: kafka, stream_for=lambda p: "s", policy=policy()) as publisher:
        assert publisher.outbox_id == stored
        publisher.run_pass()
    assert len(kafka.sent) == 5
    for _, headers in kafka.sent:
        assert _named(headers, OUTBOX) == [stored.encode()]
        assert [name for name, _ in headers][:3] == [EVENT_TYPE, EVENT_ID, OUTBOX]
    # A new store over the same outbox reads the same identity.
    assert outbox_backend.store().outbox_id() == stored


def test_a_standby_publisher_that_takes_over_names_the_same_outbox(
    outbox_backend: OutboxBackend,
) -> None:
    active_store, standby_store = outbox_backend.store(), outbox_backend.store()
    append_all(active_store, drafts("proj-a", 2))
    first, second = RecordingKafka(), RecordingKafka()
    active = Publisher(active_store, lambda: first, stream_for=lambda p: "s", policy=policy())
    active.run_pass()
    stop = threading.Event()
    taken: list[Publisher | None] = []
    standby = threading.Thread(
        target=lambda: taken.append(
            take_over(
                lambda: Publisher(
                    standby_store, lambda: second, stream_for=lambda p: "s", policy=policy()
                ),
                poll_s=0.05,
                stop=stop,
                beat_s=0.05,
                held=lambda _: append_all(active_store, drafts("proj-a", 2)),
            )
        )
    )
    standby.start()
    try:
        while standby.is_alive() and active_store.counts()[RowState.PENDING] == 0:
            stop.wait(0.01)  # the standby has been refused the lease once (it wrote rows)
        active.close()
        standby.join(60)
        assert not standby.is_alive(), "the standby never took over"
    finally:
        stop.set()
        standby.join(60)
    [publisher] = taken
    assert publisher is not None
    with publisher:
        publisher.run_pass()
    identity = active_store.outbox_id()
    assert is_outbox_id(identity)
    assert [_named(h, OUTBOX) for _, h in first.sent] == [[identity.encode()]] * 2
    assert [_named(h, OUTBOX) for _, h in second.sent] == [[identity.encode()]] * 2
