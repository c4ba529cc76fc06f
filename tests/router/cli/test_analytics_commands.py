"""`rhumbatron analytics-rollup` on the real broker: the rollup's own topics are created, as faust
would declare them, and served before its worker starts.

faust creates its changelog and leader topics just before its consumer joins the group; a topic
that new can be missing from the consumer's metadata at the join, and every fold then fails
(PartitionsMismatch) until that metadata refreshes, five minutes later."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import pytest

from consumers.subscriptions.analytics import rollup as rollup_module
from router.cli.analytics_commands import analytics_rollup
from router.settings import Settings
from router.wiring.analytics import rollup_app_id
from router.wiring.provisioning import provision_environment
from streams.admin import admin_client
from streams.errors import ConfigurationError
from tests.support.prometheus import free_port
from tests.support.runtime_processes import runtime_settings

pytestmark = pytest.mark.integration


def test_the_rollup_topics_are_served_before_its_worker_starts(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A port of its own: another test's rollup may hold the default one meanwhile.
    s = runtime_settings(
        settings, analytics_rollup_dir=str(tmp_path / "rollup"), analytics_rollup_port=free_port()
    )
    provision_environment(s)
    seen: dict[str, Any] = {}

    def instead_of_the_worker(app: Any, **_: Any) -> None:
        names = [spec.name for spec in rollup_module.internal_topics(app)]
        metadata = admin_client(s.kafka_config()).list_topics(timeout=10)
        seen.update({n: metadata.topics.get(n) for n in names})

    monkeypatch.setattr(rollup_module, "run_worker", instead_of_the_worker)
    assert analytics_rollup(s, argparse.Namespace(log_level="warning")) == 0
    assert len(seen) == 4
    for name, topic in seen.items():
        assert topic is not None, f"{name} did not exist when the worker would start"
        assert topic.partitions and all(p.leader >= 0 for p in topic.partitions.values()), name
    changelog = seen[f"{rollup_app_id(s)}-by_metric-changelog"]
    assert len(changelog.partitions) == s.partitions


def test_a_taken_web_port_is_one_clear_error_before_anything_starts(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_worker(app: Any, **_: Any) -> None:
        raise AssertionError("the worker must not start")

    monkeypatch.setattr(rollup_module, "run_worker", no_worker)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = runtime_settings(
            settings, analytics_rollup_dir=str(tmp_path / "rollup"), analytics_rollup_port=port
        )
        with pytest.raises(ConfigurationError) as refused:
            analytics_rollup(s, argparse.Namespace(log_level="warning"))
    assert f"cannot serve its web view on 127.0.0.1:{port}" in str(refused.value)
    assert "RHUMBATRON_ANALYTICS_ROLLUP_PORT" in str(refused.value)
