"""The pump on the real broker and Redis, over the reference feed: each case of the source
(initialization, resume, another corpus or lineage, a malformed or missing identity, legacy
sequences ambiguous, attested and disputed), failures of the feed, of Kafka and of the
checkpoint mid-run, a SIGKILL mid-batch, two pumps at once and SIGTERM — every one checked
against the feed file by a read-committed reader: each event on the streams exactly once, in
the feed's order per project, and nothing the checkpoint has not passed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumers.redis_conn import connect
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.pump import limits
from router.wiring.pump import sink as kafka_sink
from streams.errors import TransactionFailed
from streams.pump.http import HttpFeed
from streams.pump.identity import Checkpoint
from streams.pump.pump import Pump
from streams.pump.reference_server import FeedServer
from tests.support.environment import (
    ROOT,
    cleanup_environment,
    make_settings,
    run_cli,
    subprocess_env,
)
from tests.support.pump import (
    CORPUS,
    IDENTITY,
    LINEAGE,
    OTHER,
    committed_events,
    control,
    feed,
    serving,
    write_feed,
)

pytestmark = pytest.mark.integration

COUNT = 120
LINES = feed("kafka", COUNT, projects=9, step=2)
IDS = [orjson.loads(line)["event"]["eventId"] for line in LINES]
SEQUENCE = {i: orjson.loads(line)["sequence"] for i, line in zip(IDS, LINES, strict=True)}


@pytest.fixture
def s() -> Iterator[Settings]:
    made = make_settings(
        pump_page_size=25,
        pump_batch_max_events=10,
        pump_backoff_s=0.05,
        pump_backoff_max_s=0.2,
        pump_poll_interval_s=0.1,
    )
    # The legacy key in the test's own environment (cleaned up with it).
    made = Settings(**{**made.model_dump(), "pump_legacy_key": f"rh:{made.env}:last_sequence"})
    provision_environment(made)
    yield made
    cleanup_environment(made)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FeedServer]:
    with serving(write_feed(tmp_path / "feed.ndjson", LINES), page_size=25) as running:
        yield running


def pump_cli(
    s: Settings, server: FeedServer, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(s, "pump", "--feed", server.url, *args, env=subprocess_env(s, **env))


def checkpoint_of(s: Settings, server: FeedServer) -> Checkpoint | None:
    made = kafka_sink(s, server.url)
    try:
        return made.checkpoint()
    finally:
        made.close()


def last_audit_entry(s: Settings) -> dict[str, Any]:
    raw = connect(s.redis_url, timeout=5).lindex(f"rh:{s.env}:{{audit}}:pump", 0)
    assert raw is not None, "no audit entry"
    return orjson.loads(raw)  # type: ignore[no-any-return]


def assert_exactly_once(s: Settings, upto: int | None = None) -> None:
    """Every feed event through ``upto`` (by sequence; all by default) committed exactly once,
    none after it, each project's in feed order."""
    expected = [i for i in IDS if upto is None or SEQUENCE[i] <= upto]
    found = committed_events(s)
    ids = [e.event_id for e in found]
    assert len(ids) == len(set(ids)), "an event was committed twice"
    assert sorted(ids) == sorted(expected)
    by_project: dict[str, list[int]] = defaultdict(list)
    for event in found:
        assert event.slot is None
        by_project[event.project_id].append(SEQUENCE[event.event_id])
    for sequences in by_project.values():
        assert sequences == sorted(sequences)


def test_a_new_installation_publishes_everything_once_and_resumes(
    s: Settings, server: FeedServer, tmp_path: Path
) -> None:
    ran = pump_cli(s, server, "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    summary = orjson.loads(ran.stdout)
    assert summary["published"] == COUNT
    assert summary["checkpoint"] == {
        "version": 1,
        "corpus_id": CORPUS,
        "history_lineage": LINEAGE,
        "sequence": SEQUENCE[IDS[-1]],
    }
    assert_exactly_once(s)
    shown = run_cli(s, "pump", "checkpoint", "--feed", server.url, "--json", check=True)
    assert orjson.loads(shown.stdout)["checkpoint"] == summary["checkpoint"]
    # Resume: a run with nothing new publishes nothing; then the feed grows.
    again = pump_cli(s, server, "--once", "--json")
    assert again.returncode == 0 and orjson.loads(again.stdout)["published"] == 0
    assert_exactly_once(s)
    assert control(server)["seen_expected"][-1] == [CORPUS, LINEAGE]


@pytest.mark.parametrize("change", [{"corpus_id": OTHER}, {"lineage": OTHER}])
def test_another_corpus_or_lineage_stops_the_pump_and_changes_nothing(
    s: Settings, server: FeedServer, change: dict[str, str]
) -> None:
    assert pump_cli(s, server, "--once").returncode == 0
    before = checkpoint_of(s, server)
    control(server, **change)
    ran = pump_cli(s, server, "--once")
    assert ran.returncode == 2
    assert OTHER in ran.stderr and CORPUS in ran.stderr and LINEAGE in ran.stderr
    assert checkpoint_of(s, server) == before
    assert_exactly_once(s)


@pytest.mark.parametrize("identity", ["missing", "malformed", "corpus-only"])
def test_a_malformed_or_missing_identity_stops_a_new_installation(
    s: Settings, server: FeedServer, identity: str
) -> None:
    control(server, identity=identity)
    ran = pump_cli(s, server, "--once")
    assert ran.returncode == 2 and "identity" in ran.stderr
    assert checkpoint_of(s, server) is None
    assert committed_events(s) == []


def test_legacy_sequences_ambiguous_attested_and_disputed(s: Settings, server: FeedServer) -> None:
    redis = connect(s.redis_url, timeout=5)
    redis.set(s.pump_legacy_key, b"41")
    # Ambiguous: no attested pair. Nothing changes, and the feed is not even asked.
    ran = pump_cli(s, server, "--once")
    assert ran.returncode == 2 and "legacy checkpoint (sequence 41)" in ran.stderr
    assert redis.get(s.pump_legacy_key) == b"41" and checkpoint_of(s, server) is None
    assert control(server)["served"] == 0
    # Attested, but the feed disagrees: nothing changes.
    ran = pump_cli(s, server, "--once", "--legacy-corpus-id", CORPUS, "--legacy-lineage", OTHER)
    assert ran.returncode == 2 and OTHER in ran.stderr
    assert redis.get(s.pump_legacy_key) == b"41" and checkpoint_of(s, server) is None
    assert committed_events(s) == []
    # Attested and confirmed: migrated, the legacy value deleted, only what follows published.
    ran = pump_cli(
        s, server, "--once", "--json", "--legacy-corpus-id", CORPUS, "--legacy-lineage", LINEAGE
    )
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["migrated"] is True
    assert redis.get(s.pump_legacy_key) is None
    assert sorted(e.event_id for e in committed_events(s)) == sorted(
        i for i in IDS if SEQUENCE[i] > 41
    )


def test_a_legacy_value_that_is_no_sequence_is_refused(s: Settings, server: FeedServer) -> None:
    redis = connect(s.redis_url, timeout=5)
    redis.set(s.pump_legacy_key, b"forty-one")
    ran = pump_cli(s, server, "--once", "--legacy-corpus-id", CORPUS, "--legacy-lineage", LINEAGE)
    assert ran.returncode == 2 and "'forty-one', not a sequence" in ran.stderr
    assert redis.get(s.pump_legacy_key) == b"forty-one"


@pytest.mark.parametrize("point", ["pump.after_events", "pump.before_commit"])
@pytest.mark.parametrize("nth", [1, 2, 5])
def test_kafka_or_the_checkpoint_failing_mid_run_doubles_and_skips_nothing(
    s: Settings, server: FeedServer, point: str, nth: int
) -> None:
    """In process: the transaction's events produced (``after_events``), or its checkpoint too
    (``before_commit``), then the commit fails: aborted, and the next run publishes it again."""
    made = kafka_sink(s, server.url)
    hits = 0

    def failing(name: str) -> None:
        nonlocal hits
        if name == point:
            hits += 1
            if hits == nth:
                raise TransactionFailed(made.producer.transactional_id or "", "failing on purpose")

    made.failpoint = failing
    feed_client = HttpFeed(server.url, timeout_s=5, max_page_bytes=1 << 24)
    try:
        with pytest.raises(TransactionFailed):
            Pump(feed_client, made, limits(s)).pass_once()
        Pump(feed_client, made, limits(s)).pass_once()
    finally:
        made.close()
        feed_client.close()
    assert_exactly_once(s)


@pytest.mark.parametrize(
    "failpoint", ["pump.after_events@1", "pump.before_commit@2", "pump.before_commit@6"]
)
def test_a_pump_killed_mid_batch_resumes_with_nothing_doubled(
    s: Settings, server: FeedServer, failpoint: str
) -> None:
    killed = pump_cli(s, server, "--once", RHUMBATRON_FAILPOINTS=failpoint)
    assert killed.returncode == -signal.SIGKILL
    # The killed pump's transaction is open; the next pump fences it before reading.
    ran = pump_cli(s, server, "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    assert_exactly_once(s)


def test_the_feed_failing_mid_run_doubles_and_skips_nothing(
    s: Settings, server: FeedServer
) -> None:
    # --once stops on the failure; a long-running pump retries it.
    control(server, fail=1, fail_status=503)
    ran = pump_cli(s, server, "--once")
    assert ran.returncode == 2 and "503" in ran.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "pump", "--feed", server.url],
        cwd=ROOT,
        env=subprocess_env(s),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        control(server, fail=3, fail_status=500)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = checkpoint_of(s, server)
            if found is not None and found.sequence == SEQUENCE[IDS[-1]]:
                break
            time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "trying again" in err
    assert_exactly_once(s)


def test_two_pumps_at_once_one_is_fenced_and_nothing_is_doubled(
    s: Settings, server: FeedServer
) -> None:
    # Each page takes three seconds (six pages): the second pump starts, and fences the first,
    # while the first is still reading. (At one second a page, a second pump slow to start on a
    # loaded machine found the first done: CI saw it exit 0.) Once the first is gone, the pages
    # come at once for the second.
    control(server, delay_s=3.0)

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "router.cli", "pump", "--feed", server.url, "--once"],
            cwd=ROOT,
            env=subprocess_env(s),
            stderr=subprocess.PIPE,
            text=True,
        )

    first = start()
    deadline = time.monotonic() + 60
    while (checkpoint_of(s, server) or Checkpoint(IDENTITY, 0)).sequence == 0:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    second = start()
    _, first_err = first.communicate(timeout=120)
    control(server, delay_s=0)
    _, second_err = second.communicate(timeout=120)
    assert second.returncode == 0, second_err
    assert first.returncode == 2 and "fenced" in first_err.lower(), first_err
    assert_exactly_once(s)


def test_sigterm_finishes_the_batch_in_hand_and_the_next_run_goes_on(
    s: Settings, server: FeedServer
) -> None:
    control(server, delay_s=0.2)
    process = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "pump", "--feed", server.url, "--json"],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while (checkpoint_of(s, server) or Checkpoint(IDENTITY, 0)).sequence == 0:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    stopped_at = orjson.loads(out)["checkpoint"]["sequence"]
    assert_exactly_once(s, upto=stopped_at)
    control(server, delay_s=0)
    assert pump_cli(s, server, "--once").returncode == 0
    assert_exactly_once(s)


def test_a_bad_line_stops_the_pump_until_an_audited_skip(s: Settings, tmp_path: Path) -> None:
    bad = b'{"sequence": %d, "event": {"not": "an event"}}' % (SEQUENCE[IDS[40]] + 1)
    path = write_feed(tmp_path / "bad.ndjson", [*LINES[:41], bad, *LINES[41:]])
    with serving(path, page_size=25) as server:
        ran = pump_cli(s, server, "--once")
        assert ran.returncode == 2 and f"sequence {SEQUENCE[IDS[40]] + 1}" in ran.stderr
        assert checkpoint_of(s, server) == Checkpoint(IDENTITY, SEQUENCE[IDS[40]])
        assert_exactly_once(s, upto=SEQUENCE[IDS[40]])
        refused = run_cli(s, "pump", "skip-through", "5", "--feed", server.url, "--reason", "r")
        assert refused.returncode == 2 and "does not move forward" in refused.stderr
        run_cli(
            s,
            "pump",
            "skip-through",
            str(SEQUENCE[IDS[40]] + 1),
            "--feed",
            server.url,
            "--reason",
            "upstream confirmed the line is garbage",
            "--who",
            "alice",
            check=True,
        )
        entry = last_audit_entry(s)
        assert entry["action"] == "skip_through" and entry["who"] == "alice"
        assert entry["to"] == SEQUENCE[IDS[40]] + 1 and entry["from"] == SEQUENCE[IDS[40]]
        assert pump_cli(s, server, "--once").returncode == 0
        assert_exactly_once(s)


def test_a_lineage_change_is_taken_only_after_an_audited_forget(
    s: Settings, server: FeedServer
) -> None:
    assert pump_cli(s, server, "--once").returncode == 0
    control(server, lineage=OTHER)  # the corpus's history was rewritten
    assert pump_cli(s, server, "--once").returncode == 2
    run_cli(s, "pump", "forget", "--feed", server.url, "--reason", "new lineage", check=True)
    assert checkpoint_of(s, server) is None
    refused = run_cli(s, "pump", "forget", "--feed", server.url, "--reason", "again")
    assert refused.returncode == 2 and "no checkpoint to forget" in refused.stderr
    ran = pump_cli(s, server, "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    checkpoint = orjson.loads(ran.stdout)["checkpoint"]
    assert checkpoint["history_lineage"] == OTHER and checkpoint["sequence"] == SEQUENCE[IDS[-1]]
    entry = last_audit_entry(s)
    assert entry["action"] == "forget" and entry["history_lineage"] == LINEAGE
    # The new lineage's history is published from its start (consumers dedupe by event id).
    assert len(committed_events(s)) == 2 * COUNT
