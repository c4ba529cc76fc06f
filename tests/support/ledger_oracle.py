"""What a run of the ``ledger`` subscription must have left: every event's effect once, each
project's events applied in slot order, and no effect still pending on any stream partition.
Tests that run real ledger members (a fleet, separate ``consume`` processes) check with this."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from consumers.runtime.types import TP
from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from router.wiring.subscription import redis_client, store
from streams.clock import SystemClock
from streams.envelopes import Draft


def applied(s: Settings) -> int:
    """How many distinct events the ledger has applied so far."""
    return len(read_ledger(redis_client(s), s.env)["counts"])


def assert_applied_once_in_order(s: Settings, drafts: Sequence[Draft]) -> None:
    ledger = read_ledger(redis_client(s), s.env)
    counts: dict[str, int] = ledger["counts"]
    assert len(counts) == len(drafts), f"{len(counts)} of {len(drafts)} events applied"
    twice = {event_id: n for event_id, n in counts.items() if n != 1}
    assert not twice, f"effects applied other than once: {dict(list(twice.items())[:10])}"
    per_project = Counter(d.project_id for d in drafts)
    assert ledger["projects"] == {p: list(range(1, n + 1)) for p, n in per_project.items()}
    ledger_store = store(s, redis_client(s), "ledger", SystemClock())
    pending = [
        (topic, partition)
        for topic in s.topology.stream_names()
        for partition in range(s.partitions)
        if ledger_store.load(TP(topic, partition)).pending_effects
    ]
    assert not pending, f"effects still pending on {pending}"
