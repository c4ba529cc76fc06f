"""The broker stopped in the middle of publishing and started again, or frozen (SIGSTOP) with
requests in flight and thawed (a private broker, so no other test is disturbed): rows wait in
retry_wait during the outage, nothing fails, no row uses an attempt, and afterwards everything
has arrived, in slot order per project. A frozen broker still writes the requests it had
received once thawed, after the publisher gave up on them: those come back as duplicates,
never ahead of an earlier slot."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from router.wiring.outbox import build_publisher, kafka_senders, publisher_policy
from streams.admin import admin_client, provision
from streams.outbox.publisher import PublisherTotals
from streams.outbox.store import RowState, RowUpdate
from streams.workload import workload, write_workload
from tests.support.environment import make_settings
from tests.support.infra import PrivateServices
from tests.support.kafka import events_of, read_all
from tests.support.outbox import SlowSender, first_arrivals, outbox_for, records_in

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

PROJECTS, EVENTS = 100, 12_000


def _broker_pid(services: PrivateServices) -> int:
    return int((services.dir / "kafka" / "single" / "kafka.pid").read_text())


# One pair in `make test`, the other three in `make test-slow` (a private broker each: about a
# minute a pair).
@pytest.mark.parametrize(
    ("ordering", "outage"),
    [
        ("serial", "stop"),
        pytest.param("pipelined", "freeze", marks=pytest.mark.slow),
        pytest.param("pipelined", "stop", marks=pytest.mark.slow),
        pytest.param("serial", "freeze", marks=pytest.mark.slow),
    ],
)
def test_a_broker_outage_mid_publish_fails_nothing_and_loses_nothing(
    ordering: str, outage: str, tmp_path: Path
) -> None:
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
        store = outbox_for(s, tmp_path / "outbox.db")
        write_workload(store, workload("outage", PROJECTS, EVENTS), writers=4, events_per_write=5)
        # What the publisher wrote once the outage began, not a sample of the counts: a deferred
        # row may wait only the first backoff (0.2 s) before its next try, which then blocks for
        # seconds on the unanswered broker with the row pending again.
        outage_began = threading.Event()
        put_in_retry_wait = 0
        apply = store.apply

        def recording_apply(updates: Sequence[RowUpdate]) -> int:
            nonlocal put_in_retry_wait
            if outage_began.is_set():
                put_in_retry_wait += sum(u.state is RowState.RETRY_WAIT for u in updates)
            return apply(updates)

        store.apply = recording_apply  # type: ignore[method-assign]
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
            while store.counts()[RowState.PUBLISHED] < EVENTS // 5:
                assert thread.is_alive(), result
                time.sleep(0.05)
            outage_began.set()
            if outage == "stop":
                services.kafka_stop()
            else:
                os.kill(_broker_pid(services), signal.SIGSTOP)
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                counts = store.counts()
                assert counts[RowState.FAILED] == 0
                time.sleep(0.2)
            assert counts[RowState.PUBLISHED] < EVENTS  # the outage really interrupted it
            assert put_in_retry_wait > 0  # rows were deferred to retry_wait during the outage
            if outage == "stop":
                services.kafka_start()
            else:
                os.kill(_broker_pid(services), signal.SIGCONT)
            thread.join(300)
            assert not thread.is_alive(), "the publisher did not finish after the broker returned"
        finally:
            if outage == "freeze":
                os.kill(_broker_pid(services), signal.SIGCONT)  # never leave it frozen
            if thread.is_alive():
                thread.join(300)
            publisher.close()
        [totals] = result
        assert isinstance(totals, PublisherTotals), totals
        assert totals.deferred > 0 and totals.failed == 0 and totals.row_faults == 0
        counts = store.counts()
        assert counts[RowState.PUBLISHED] == EVENTS and counts[RowState.FAILED] == 0
        attempts = [r.attempts for r in store.rows_in_state(RowState.PUBLISHED, EVENTS)]
        assert max(attempts) == 0  # an outage is not the rows' fault

        streams = s.topology.stream_names()
        held = records_in(services.bootstrap, streams)
        assert held >= EVENTS
        messages = read_all(services.bootstrap, streams, expect=held)
        assert len(messages) == held
        slots: dict[str, list[int]] = defaultdict(list)
        for event in events_of(messages):
            slots[event.project_id].append(event.slot or 0)
        assert len(slots) == PROJECTS
        for project, found in slots.items():
            # Copies (records in flight when it stopped) are allowed, only after their originals.
            first, _ = first_arrivals(found)
            assert first == list(range(1, EVENTS // PROJECTS + 1)), project
        store.close()
