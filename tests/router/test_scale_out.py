"""Scale-out on the real broker and Redis: a second project-view-projector process joins the
group while events flow, under the classic protocol (cooperative-sticky) and KIP-848
(``consumer``). Partitions move to it without loss or duplicate effect: the two processes'
applied counts add up to the events (each applied once, by one of them), and every view and
feed equals the one computed independently from the events (tests/support/projector_oracle.py;
the feed is the full history of the project in the order applied, so per-project order holds).

The rebalance is measured from the processes' own logs: how long the newcomer waited for its
first partitions, and for each partition that moved, the time between its revocation on the
first process and its assignment on the second (the only time no one owns it). Times are the
logs' (local time, as ``asctime`` writes it). The first process
keeps every partition it was not asked to give up: it revokes exactly the ones that moved."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import median

import pytest

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import count_views, read_feed, read_view
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.envelopes import Event
from streams.workload import slotted_events, workload
from tests.support.environment import ROOT, cleanup_environment, make_settings, subprocess_env
from tests.support.projector_oracle import expected_feed, expected_view
from tests.support.runtime_processes import publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SLUG = "project-view-projector"
PROJECTS, EVENTS = 12, 3600
PER_PROJECT = EVENTS // PROJECTS
CHUNK, PAUSE_S = 60, 0.1  # published 60 events at a time, ~600 events/s: flowing for ~6 s
ASSIGNED = re.compile(r"^(\S+ \S+) INFO \S+: \S+: assigned (\S+) at epoch")
REVOKED = re.compile(r"^(\S+ \S+) INFO \S+: \S+: revoked (\S+)$")
SUMMARY = re.compile(r"(\d+) records, (\d+) applied, (\d+) duplicates")


@dataclass
class Process:
    """One ``rhumbatron -v consume`` process and the log it writes."""

    proc: subprocess.Popen[bytes]
    log: Path

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def moves(self, pattern: re.Pattern[str]) -> dict[str, datetime]:
        """Each partition the log names (assigned or revoked) with the last time it did."""
        found: dict[str, datetime] = {}
        for line in self.lines():
            m = pattern.match(line)
            if m:
                found[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        return found

    def owned(self) -> set[str]:
        """The partitions it holds now, by its log."""
        events: list[tuple[datetime, int, str]] = []
        for kind, pattern in ((1, ASSIGNED), (0, REVOKED)):
            events += [(at, kind, tp) for tp, at in self.moves(pattern).items()]
        held: set[str] = set()
        for _, kind, tp in sorted(events):
            (held.add if kind else held.discard)(tp)
        return held

    def stop(self) -> tuple[int, int, int]:
        """SIGTERM, then (records, applied, duplicates) from its summary."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        text = self.log.read_text(errors="replace")
        assert code == 0, text[-3000:]
        found = SUMMARY.search(text)
        assert found is not None, text[-3000:]
        records, applied, duplicates = (int(n) for n in found.groups())
        return records, applied, duplicates


def _moves_and_warnings(*processes: Process) -> str:
    """What a failed wait shows: each process's partition moves, warnings and errors, and what it
    holds by them."""
    shown: list[str] = []
    for name, p in zip(("first", "second"), processes, strict=False):
        shown.append(f"{name} holds {sorted(p.owned())}:")
        shown += [
            f"  {line}"
            for line in p.lines()
            if ASSIGNED.match(line)
            or REVOKED.match(line)
            or " WARNING " in line
            or " ERROR " in line
            or line.startswith("%")
        ]
    return "\n".join(shown)


def _start(s: Settings, log: Path) -> Process:
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "-v", "consume", "--subscription", SLUG],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return Process(proc, log)


@pytest.fixture(params=["classic", "consumer"])
def scaled(request: pytest.FixtureRequest) -> Iterator[Settings]:
    s = make_settings(
        group_protocol=request.param,
        session_timeout_ms=6000,
        batch_size=50,
        batch_size_behind=50,
        project_feed_length=PER_PROJECT,  # the whole history of every project
    )
    provision_environment(s, subscriptions=[SLUG])
    yield s
    cleanup_environment(s)


def _all_applied(s: Settings, events: list[Event]) -> bool:
    client = connect(s.redis_url, timeout=5)
    total = 0
    for p in {e.project_id for e in events}:
        view = read_view(client, s.env, TP(*s.topology.partition_of(p)), p)
        total += view["events"] if view else 0
    return total == len(events)


def test_a_second_projector_process_takes_partitions_mid_run_without_loss_or_double_effect(
    scaled: Settings, tmp_path: Path
) -> None:
    s = scaled
    events = slotted_events(workload("scale", PROJECTS, EVENTS), tenant_id="t")
    everything = {f"{TP(t, p)}" for t in s.topology.stream_names() for p in range(s.partitions)}
    first = _start(s, tmp_path / "first.log")
    second: Process | None = None
    sent: list[int] = []

    def publish_steadily() -> None:
        for start in range(0, EVENTS, CHUNK):
            publish(s, events[start : start + CHUNK])
            sent.append(start + CHUNK)
            time.sleep(PAUSE_S)

    publisher = threading.Thread(target=publish_steadily, daemon=True)
    try:
        wait_until(lambda: first.owned() == everything, 120, "the first process owning all")
        publisher.start()
        wait_until(lambda: sent and sent[-1] >= EVENTS // 4, 60, "a quarter published")
        second = _start(s, tmp_path / "second.log")
        joined = second
        # Its first line is printed once its subscription is open (settings read, stores connected),
        # just before it joins the group.
        wait_until(lambda: bool(joined.lines()), 60, "the second process started")
        opened = datetime.now()

        def moves() -> str:
            return _moves_and_warnings(first, joined)

        wait_until(
            lambda: bool(joined.owned()), 120, "the second process assigned partitions", moves
        )
        wait_until(
            lambda: (
                first.owned() | joined.owned() == everything and not first.owned() & joined.owned()
            ),
            60,
            "the partitions shared between the two",
            moves,
        )
        # The rebalance, as the logs say it before the stop revokes everything.
        assigned, revoked = joined.moves(ASSIGNED), first.moves(REVOKED)
        publisher.join(timeout=120)
        assert not publisher.is_alive()
        assert sent[-1] >= EVENTS
        wait_until(lambda: _all_applied(s, events), 180, "every event in the views")
    finally:
        if publisher.is_alive():
            publisher.join(timeout=120)
        counts = [p.stop() for p in (first, second) if p is not None]
    assert second is not None

    # Each event applied once, by one of the two; the second did part of the work.
    (_, applied_first, _), (_, applied_second, _) = counts
    assert applied_first + applied_second == EVENTS, counts
    assert applied_second > 0, counts
    client = connect(s.redis_url, timeout=5)
    projects = sorted({e.project_id for e in events})
    for p in projects:
        tp = TP(*s.topology.partition_of(p))
        assert read_view(client, s.env, tp, p) == expected_view(p, tp, events), p
        assert read_feed(client, s.env, tp, p) == expected_feed(p, events, PER_PROJECT), p
    assert count_views(client, s.env) == len(projects)

    # Incremental: the first process gave up exactly what the second took, nothing else.
    assert set(revoked) == set(assigned), (revoked, assigned)
    waited = (min(assigned.values()) - opened).total_seconds()
    gaps = [(assigned[tp] - revoked[tp]).total_seconds() for tp in assigned]
    print(
        f"{s.group_protocol}: {len(assigned)} of {len(everything)} partitions moved; the "
        f"newcomer's first partitions {waited:.2f} s after its start line; unowned per moved "
        f"partition: median {median(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms; "
        f"applied {applied_first} + {applied_second}"
    )
