"""The causal router's companion with ``router_publish_outbox`` off: the maintenance tick runs,
no publisher thread does, and the outbox's publisher lease stays free for the process that
publishes it (the fleet's publisher member)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from consumers.subscriptions.causal_router.processor import SLUG
from router.settings import Settings
from router.wiring.causal import RouterCompanion, open_router_outbox
from streams.clock import ManualClock
from tests.support.runtime_processes import runtime_settings

pytestmark = pytest.mark.integration  # the maintenance tick reads Redis


@pytest.mark.parametrize(
    ("publishes", "threads"),
    [(False, ["maintenance"]), (True, ["publisher", "maintenance"])],
    ids=["router_publish_outbox-off", "router_publish_outbox-on"],
)
def test_the_companion_runs_a_publisher_thread_only_when_it_publishes_the_outbox(
    settings: Settings, tmp_path: Path, publishes: bool, threads: list[str]
) -> None:
    s = runtime_settings(
        settings,
        router_outbox_path=str(tmp_path / "router.sqlite"),
        router_publish_outbox=publishes,
        maintenance_enabled=True,
    )
    outbox = open_router_outbox(s)
    companion = RouterCompanion(
        s, connect(s.redis_url, timeout=5), ManualClock(datetime.now(UTC)), outbox
    )
    companion.start()
    try:
        assert [t.name for t in companion.threads] == [f"{SLUG}-{name}" for name in threads]
        assert all(t.is_alive() for t in companion.threads)
        if not publishes:
            with open_router_outbox(s).publisher_lease():  # free: nobody here holds it
                assert not companion.publishing.is_set()
    finally:
        companion.close()
        outbox.close()
