"""The PostgreSQL outbox under the publisher's failures (the SQLite twins are in tests/chaos/):

- through the command line (``rhumbatron publish --outbox postgresql://…``): a publisher killed
  (SIGKILL, fail-point ``publisher.after_ack``) between Kafka's acknowledgement and the mark
  leaves its advisory lock to die with its connection; the next publisher starts, re-sends
  exactly that pass's rows and loses nothing; first occurrences stay in slot order;
- a private broker stopped in the middle of a publish and started again: rows wait in
  retry_wait, nothing fails, no row uses an attempt, and afterwards every event has arrived, in
  slot order per project (duplicates only after their originals);
- a private PostgreSQL server restarted under an open store and a held lease."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from router.settings import Settings
from router.wiring.outbox import build_publisher, kafka_senders, publisher_policy
from streams.admin import admin_client, provision
from streams.outbox.postgres import PostgresOptions, PostgresOutbox, init_outbox
from streams.outbox.publisher import PublisherTotals
from streams.outbox.store import RowState
from streams.workload import workload
from tests.support.environment import ROOT, cleanup_environment, make_settings
from tests.support.infra import PrivateServices
from tests.support.kafka import events_of, read_all
from tests.support.outbox import (
    OutboxBackend,
    SlowSender,
    cli_env,
    drafts,
    records_in,
    write_drafts,
)

# A broker stopped and restarted, a server restarted: minutes under load, so `make test-slow`.
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

PROJECTS, EVENTS, PER_PASS = 50, 3000, 10  # 60 events a project: six passes of 10


@pytest.fixture(params=["serial", "pipelined"])
def crash_settings(request: pytest.FixtureRequest) -> Iterator[Settings]:
    s = make_settings(outbox_ordering=request.param, outbox_rows_per_project_per_pass=PER_PASS)
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)
    yield s
    cleanup_environment(s)


def _publish(s: Settings, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", "publish", "--outbox", url, "--until-empty"],
        cwd=ROOT,
        env=cli_env(s, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_crash_between_ack_and_mark_resends_and_loses_nothing_on_postgres(
    crash_settings: Settings, pg: OutboxBackend
) -> None:
    s = crash_settings
    store = pg.store()
    assert write_drafts(store, workload("crash", PROJECTS, EVENTS)) == EVENTS

    crashed = _publish(s, pg.address, RHUMBATRON_FAILPOINTS="publisher.after_ack@3")
    assert crashed.returncode == -9, crashed.stderr  # SIGKILL at the fail-point
    counts = store.counts()
    # Two passes were marked; the third reached Kafka but was never marked.
    assert counts[RowState.PUBLISHED] == 2 * PROJECTS * PER_PASS
    assert counts[RowState.PENDING] == EVENTS - 2 * PROJECTS * PER_PASS

    # The killed publisher's lock went with its connection: this one is not refused.
    restarted = _publish(s, pg.address)
    assert restarted.returncode == 0, restarted.stderr
    assert store.counts()[RowState.PUBLISHED] == EVENTS

    resent = PROJECTS * PER_PASS
    messages = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=EVENTS + resent)
    slots: dict[str, list[int]] = defaultdict(list)
    for event in events_of(messages):
        slots[event.project_id].append(event.slot or 0)
    assert sum(len(v) for v in slots.values()) == EVENTS + resent
    for project, found in slots.items():
        first: list[int] = []
        for slot in found:
            if slot not in first:
                first.append(slot)
        assert first == list(range(1, EVENTS // PROJECTS + 1)), project  # nothing missing, in order
        twice = sorted(slot for slot, n in Counter(found).items() if n > 1)
        assert twice == list(range(2 * PER_PASS + 1, 3 * PER_PASS + 1)), project  # the lost marks


@pytest.mark.parametrize("ordering", ["serial", "pipelined"])
def test_a_broker_stopped_mid_publish_fails_nothing_and_loses_nothing_on_postgres(
    ordering: str, pg: OutboxBackend
) -> None:
    projects, events = 100, 12_000
    with PrivateServices(redis=False) as services:
        s = make_settings(
            kafka_bootstrap=services.bootstrap,
            outbox_ordering=ordering,
            outbox_delivery_timeout_s=2.0,
            outbox_backoff_initial_s=0.2,
            outbox_backoff_max_s=1.0,
            outbox_rows_per_project_per_pass=10,
        )
        base = s.kafka_config()
        provision(
            admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=60
        )
        store = pg.store()
        assert write_drafts(store, workload("outage", projects, events)) == events
        real = kafka_senders(s, publisher_policy(s))
        # About 2,000 rows a second, so the outage lands in the middle of the publish.
        publisher = build_publisher(s, store, senders=lambda: SlowSender(real(), 0.0005))
        result: list[PublisherTotals | BaseException] = []

        def run() -> None:
            try:
                result.append(publisher.run(until_empty=True))
            except BaseException as exc:  # surfaced by the main thread
                result.append(exc)

        thread = threading.Thread(target=run, name="publisher")
        thread.start()
        try:
            while store.counts()[RowState.PUBLISHED] < events // 5:
                assert thread.is_alive(), result
                time.sleep(0.05)
            services.kafka_stop()
            waiting_seen = 0
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                counts = store.counts()
                assert counts[RowState.FAILED] == 0
                waiting_seen = max(waiting_seen, counts[RowState.RETRY_WAIT])
                time.sleep(0.2)
            assert counts[RowState.PUBLISHED] < events  # the outage really interrupted it
            assert waiting_seen > 0  # rows waited in retry_wait during the outage
            services.kafka_start()
            thread.join(300)
            assert not thread.is_alive(), "the publisher did not finish after the broker returned"
        finally:
            if thread.is_alive():
                thread.join(300)
            publisher.close()
        [totals] = result
        assert isinstance(totals, PublisherTotals), totals
        assert totals.deferred > 0 and totals.failed == 0 and totals.row_faults == 0
        counts = store.counts()
        assert counts[RowState.PUBLISHED] == events and counts[RowState.FAILED] == 0
        attempts = [r.attempts for r in store.rows_in_state(RowState.PUBLISHED, events)]
        assert max(attempts) == 0  # an outage is not the rows' fault

        streams = s.topology.stream_names()
        held = records_in(services.bootstrap, streams)
        assert held >= events
        messages = read_all(services.bootstrap, streams, expect=held)
        slots: dict[str, list[int]] = defaultdict(list)
        for event in events_of(messages):
            slots[event.project_id].append(event.slot or 0)
        assert len(slots) == projects
        for project, found in slots.items():
            first: list[int] = []
            for slot in found:
                if slot not in first:
                    first.append(slot)
            assert first == list(range(1, events // projects + 1)), project


def test_the_store_carries_on_across_a_server_restart() -> None:
    """A private server (infra/local.sh on its own port) stopped and started between two writes
    and two passes: the pool replaces the connections that died with it, and the publisher
    takes its lease again before selecting."""
    state = Path(tempfile.mkdtemp(prefix="rhumbatron-private-pg-"))
    port = _free_port()
    env = {**os.environ, "RHUMBATRON_LOCAL_DIR": str(state), "RHUMBATRON_POSTGRES_PORT": str(port)}

    def local(*args: str) -> str:
        done = subprocess.run(
            [str(Path(ROOT) / "infra" / "local.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    started = local("postgres-start")
    home = Path(started.split("initialising a PostgreSQL cluster in ", 1)[1].split()[0]).parent
    try:
        password = (state / "postgres" / "password").read_text().strip()
        url = f"postgresql://rhumbatron:{quote(password)}@127.0.0.1:{port}/rhumbatron"
        init_outbox(url)
        store = PostgresOutbox(
            url, options=PostgresOptions(max_envelope_bytes=1 << 18, missed_report_limit=10)
        )
        try:
            with store.publisher_lease():
                with store.transaction() as unit:
                    assert unit.append("proj-a", drafts("proj-a", 2), tenant_id="t").slots == [1, 2]
                local("postgres-stop")
                local("postgres-start")
                with store.transaction() as unit:
                    assert unit.append("proj-a", drafts("proj-a", 1), tenant_id="t").slots == [3]
                assert [r.slot for r in store.sendable(10, 10, None)] == [1, 2, 3]
        finally:
            store.close()
    finally:
        subprocess.run(
            [str(Path(ROOT) / "infra" / "local.sh"), "postgres-stop"],
            env=env,
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
