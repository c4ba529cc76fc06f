"""The pump's run over the reference feed (HTTP on 127.0.0.1) and the in-memory sink: every
case of docs/pump.md — a new installation, resume, another corpus or lineage, a malformed or
missing identity, legacy sequences ambiguous and attested, a bad line, feed and commit failures
mid-run — checked against the feed file itself: every event published once, in order, and the
checkpoint at the last one published."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from streams.errors import (
    FeedIdentityError,
    FeedLineRejected,
    FeedUnavailable,
    LegacyCheckpointAmbiguous,
    PumpError,
    TransactionFailed,
)
from streams.pump.http import HttpFeed
from streams.pump.identity import Checkpoint, Identity
from streams.pump.pump import Backoff, Limits, Pump, skip_through
from streams.pump.reference_server import FeedServer
from tests.support.pump import (
    CORPUS,
    IDENTITY,
    LINEAGE,
    OTHER,
    MemoryLegacy,
    MemorySink,
    control,
    feed,
    serving,
    write_feed,
)

LIMITS = Limits(page_size=20, batch_max_events=7, batch_max_bytes=1 << 20, max_envelope_bytes=8192)
LINES = feed("pump", 95, step=2)  # sequences 1, 3, ..., 189
SEQUENCES = [orjson.loads(line)["sequence"] for line in LINES]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FeedServer]:
    with serving(write_feed(tmp_path / "feed.ndjson", LINES), page_size=20) as running:
        yield running


def pump_of(server: FeedServer, sink: MemorySink, **options: object) -> Pump:
    return Pump(HttpFeed(server.url, timeout_s=5, max_page_bytes=1 << 24), sink, LIMITS, **options)  # type: ignore[arg-type]


def published(sink: MemorySink) -> list[int]:
    return [e.sequence for e in sink.committed]


def test_a_new_installation_stores_the_identity_first_then_every_event_once(
    server: FeedServer,
) -> None:
    sink = MemorySink()
    result = pump_of(server, sink).pass_once()
    assert published(sink) == SEQUENCES
    assert sink.saved == Checkpoint(IDENTITY, SEQUENCES[-1]) == result.checkpoint
    # The identity's own commit (no events) came first; then batches of at most 7 events.
    assert sink.commits == 1 + sum(-(-n // 7) for n in (20, 20, 20, 20, 15))
    state = control(server)
    assert state["seen_expected"][0] == [None, None]  # nothing to expect before a checkpoint
    assert all(seen == [CORPUS, LINEAGE] for seen in state["seen_expected"][1:])


def test_a_resumed_run_sends_the_expected_pair_on_its_first_request(server: FeedServer) -> None:
    sink = MemorySink(saved=Checkpoint(IDENTITY, 99))
    pump_of(server, sink).pass_once()
    assert published(sink) == [s for s in SEQUENCES if s > 99]
    assert control(server)["seen_expected"][0] == [CORPUS, LINEAGE]


@pytest.mark.parametrize(
    "saved",
    [Identity(OTHER, LINEAGE), Identity(CORPUS, OTHER)],
    ids=["another-corpus", "another-lineage"],
)
def test_a_checkpoint_of_another_corpus_or_lineage_publishes_nothing(
    server: FeedServer, saved: Identity
) -> None:
    sink = MemorySink(saved=Checkpoint(saved, 5))
    with pytest.raises(FeedIdentityError) as refused:
        pump_of(server, sink).pass_once()
    assert str(saved) in str(refused.value) and str(IDENTITY) in str(refused.value)
    assert sink.committed == [] and sink.saved == Checkpoint(saved, 5) and sink.commits == 0


@pytest.mark.parametrize("identity", ["missing", "malformed", "corpus-only"])
@pytest.mark.parametrize("saved", [None, Checkpoint(IDENTITY, 5)], ids=["new", "resumed"])
def test_a_malformed_or_missing_identity_changes_nothing(
    server: FeedServer, identity: str, saved: Checkpoint | None
) -> None:
    control(server, identity=identity)
    sink = MemorySink(saved=saved)
    with pytest.raises(FeedIdentityError):
        pump_of(server, sink).pass_once()
    assert sink.commits == 0 and sink.saved == saved


def test_the_feed_changing_lineage_mid_run_stops_before_the_next_page(server: FeedServer) -> None:
    sink = MemorySink()
    calls = 0

    def after_batch() -> bool:
        nonlocal calls
        calls += 1
        if calls == 3:  # the first page is published (3 batches): the corpus is rewritten
            control(server, lineage=OTHER)
        return False

    with pytest.raises(FeedIdentityError, match="lineage differ"):
        pump_of(server, sink, should_stop=after_batch).pass_once()
    assert published(sink) == SEQUENCES[:20]
    assert sink.saved == Checkpoint(IDENTITY, SEQUENCES[19])


def test_an_ambiguous_legacy_sequence_fails_closed(server: FeedServer) -> None:
    sink, legacy = MemorySink(), MemoryLegacy(41)
    with pytest.raises(LegacyCheckpointAmbiguous, match="sequence 41"):
        pump_of(server, sink, legacy=legacy).pass_once()
    assert legacy.value == 41 and legacy.deletes == 0 and sink.commits == 0
    assert control(server)["served"] == 0  # not even a request


def test_an_attested_legacy_sequence_is_migrated_when_the_feed_confirms_it(
    server: FeedServer,
) -> None:
    sink, legacy = MemorySink(), MemoryLegacy(41)
    result = pump_of(server, sink, legacy=legacy, attested=IDENTITY).pass_once()
    assert result.migrated and legacy.value is None and legacy.deletes == 1
    assert published(sink) == [s for s in SEQUENCES if s > 41]
    assert control(server)["seen_expected"][0] == [CORPUS, LINEAGE]


@pytest.mark.parametrize("attested", [Identity(OTHER, LINEAGE), Identity(CORPUS, OTHER)])
def test_an_attested_migration_the_feed_disagrees_with_changes_nothing(
    server: FeedServer, attested: Identity
) -> None:
    sink, legacy = MemorySink(), MemoryLegacy(41)
    with pytest.raises(FeedIdentityError):
        pump_of(server, sink, legacy=legacy, attested=attested).pass_once()
    assert legacy.value == 41 and legacy.deletes == 0 and sink.commits == 0


def test_a_v1_checkpoint_wins_over_a_legacy_value_which_is_deleted(server: FeedServer) -> None:
    sink, legacy = MemorySink(saved=Checkpoint(IDENTITY, 99)), MemoryLegacy(3)
    pump_of(server, sink, legacy=legacy).pass_once()
    assert legacy.value is None and published(sink) == [s for s in SEQUENCES if s > 99]


def test_a_migration_whose_checkpoint_commit_fails_leaves_the_legacy_value(
    server: FeedServer,
) -> None:
    sink, legacy = MemorySink(fail_at={1}), MemoryLegacy(41)
    with pytest.raises(TransactionFailed):
        pump_of(server, sink, legacy=legacy, attested=IDENTITY).pass_once()
    assert legacy.value == 41 and sink.saved is None
    # The next run migrates: nothing was lost or half done.
    pump_of(server, sink, legacy=legacy, attested=IDENTITY).pass_once()
    assert legacy.read() is None and published(sink) == [s for s in SEQUENCES if s > 41]


def test_a_bad_line_publishes_the_lines_before_it_and_stops(tmp_path: Path) -> None:
    lines = [*LINES[:30], b'{"sequence": 61, "event": {"oops": 1}}', *LINES[31:]]
    with serving(write_feed(tmp_path / "bad.ndjson", lines), page_size=20) as server:
        sink = MemorySink()
        with pytest.raises(FeedLineRejected) as refused:
            pump_of(server, sink).pass_once()
        assert refused.value.sequence == 61 and refused.value.line == 11  # of its page
        assert published(sink) == SEQUENCES[:30]
        assert sink.saved == Checkpoint(IDENTITY, SEQUENCES[29])
        # Run again: it stops at the same line, publishing nothing twice.
        with pytest.raises(FeedLineRejected):
            pump_of(server, sink).pass_once()
        assert published(sink) == SEQUENCES[:30]
        # The audited way past it: the checkpoint moved through the bad line.
        before, after = skip_through(sink, 61)
        assert (before.sequence, after.sequence) == (SEQUENCES[29], 61)
        pump_of(server, sink).pass_once()
        assert published(sink) == SEQUENCES[:30] + SEQUENCES[31:]


def test_skip_through_refuses_without_a_checkpoint_or_backwards() -> None:
    with pytest.raises(PumpError, match="no checkpoint"):
        skip_through(MemorySink(), 5)
    with pytest.raises(PumpError, match="does not move forward"):
        skip_through(MemorySink(saved=Checkpoint(IDENTITY, 9)), 9)


@pytest.mark.parametrize("fail_at", [1, 2, 5, 9])
def test_a_commit_failing_mid_run_loses_and_doubles_nothing(
    server: FeedServer, fail_at: int
) -> None:
    sink = MemorySink(fail_at={fail_at})
    with pytest.raises(TransactionFailed):
        pump_of(server, sink).pass_once()
    pump_of(server, sink).pass_once()
    assert published(sink) == SEQUENCES


@pytest.mark.parametrize("after_batches", [0, 1, 3, 7])
def test_the_feed_failing_mid_run_loses_and_doubles_nothing(
    server: FeedServer, after_batches: int
) -> None:
    sink = MemorySink()
    done = 0

    def fail_the_feed_later() -> bool:
        nonlocal done
        done += 1
        if done == after_batches:
            control(server, fail=1, fail_status=503)
        return False

    if after_batches == 0:
        control(server, fail=1, fail_status=503)
    with pytest.raises(FeedUnavailable, match="503"):
        pump_of(server, sink, should_stop=fail_the_feed_later).pass_once()
    assert published(sink) == SEQUENCES[: len(sink.committed)]
    pump_of(server, sink).pass_once()
    assert published(sink) == SEQUENCES


def test_a_long_running_pump_retries_an_unavailable_feed_and_goes_on(server: FeedServer) -> None:
    control(server, fail=3, fail_status=502)
    sink = MemorySink()
    stop = threading.Event()
    pump = pump_of(server, sink)

    def watch() -> None:
        while not stop.is_set():
            if sink.saved is not None and sink.saved.sequence == SEQUENCES[-1]:
                stop.set()
            stop.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    pump.run(once=False, stop=stop, poll_interval_s=0.01, backoff=Backoff(0.01, 0.05))
    watcher.join()
    assert published(sink) == SEQUENCES and pump.stats.retries == 3


def test_an_identity_error_stops_a_long_running_pump(server: FeedServer) -> None:
    control(server, identity="missing")
    with pytest.raises(FeedIdentityError):
        pump_of(server, MemorySink()).run(
            once=False, stop=threading.Event(), poll_interval_s=0.01, backoff=Backoff(0.01, 0.05)
        )


def test_stopping_between_batches_finishes_the_batch_and_resumes_after_it(
    server: FeedServer,
) -> None:
    sink = MemorySink()
    stop = threading.Event()
    calls = 0

    def stop_after_four() -> bool:  # the fourth ask
        nonlocal calls
        calls += 1
        if calls >= 4:
            stop.set()
        return stop.is_set()

    result = pump_of(server, sink, should_stop=stop_after_four).pass_once()
    # Asked after each batch and at each page's end: the first page's three batches, whole.
    assert result.stopped and published(sink) == SEQUENCES[:20]
    pump_of(server, sink).pass_once()
    assert published(sink) == SEQUENCES


def test_a_feed_serving_smaller_pages_than_asked_is_read_to_its_end(tmp_path: Path) -> None:
    with serving(write_feed(tmp_path / "small.ndjson", LINES), page_size=8) as server:
        sink = MemorySink()
        result = pump_of(server, sink).pass_once()  # asks for 20 lines a page, gets 8
        assert published(sink) == SEQUENCES
        assert result.pages == -(-len(LINES) // 8) + 1  # the last one empty: caught up
