"""project-view-projector on the real broker and Redis: the real CLI consumes a workload published
twice (plus projects whose slots arrive out of order), and ``rhumbatron view`` / ``feed`` print
exactly what the events say, computed independently in tests/support/projector_oracle.py."""

from __future__ import annotations

import re
import subprocess

import orjson
import pytest

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import (
    count_gaps_recorded,
    count_views,
    read_feed,
    read_view,
)
from router.settings import Settings
from streams.envelopes import Event
from streams.workload import project_events, slotted_events, workload
from tests.support.projector_oracle import expected_feed, expected_view
from tests.support.runtime_processes import (
    cli,
    consume_cli,
    publish,
    runtime_settings,
)

pytestmark = pytest.mark.integration

SLUG = "project-view-projector"


@pytest.fixture
def rs(settings: Settings) -> Settings:
    return runtime_settings(settings, project_feed_length=7)


def _arrivals() -> tuple[list[Event], list[Event], int]:
    """What to publish, in order: a workload over 6 projects, twice; a project whose slot 6
    arrives after 7 and 8 (a gap recorded, then closed); and one whose slots 4 and 5 never
    arrive (a gap left open). Returns (first copy, everything published, gaps expected)."""
    events = slotted_events(workload("pv", 6, 150), tenant_id="t")
    late = slotted_events(project_events("proj-pv-late", 10), tenant_id="t")
    holed = slotted_events(project_events("proj-pv-holed", 8), tenant_id="t")
    first = [*events, *late[:5], late[6], late[7], late[5], *late[8:]]
    first += [e for e in holed if e.slot not in (4, 5)]
    return first, [*first, *first], 2


def _consume(s: Settings, **env: str) -> subprocess.CompletedProcess[str]:
    return consume_cli(s, SLUG, timeout=180, env=env)


def _check_views(s: Settings, arrived: list[Event], gaps: int) -> None:
    projects = sorted({e.project_id for e in arrived})
    client = connect(s.redis_url, timeout=5)
    for p in projects:
        tp = TP(*s.topology.partition_of(p))
        assert read_view(client, s.env, tp, p) == expected_view(p, tp, arrived), p
        assert read_feed(client, s.env, tp, p) == expected_feed(p, arrived, s.project_feed_length)
    # And through the command line, for one project of each kind.
    for p in ("proj-pv-late", "proj-pv-holed", projects[0]):
        tp = TP(*s.topology.partition_of(p))
        shown = orjson.loads(cli(s, "view", p, "--json").stdout)
        assert shown == expected_view(p, tp, arrived), p
        feed = orjson.loads(cli(s, "feed", p, "--json").stdout)
        assert feed == expected_feed(p, arrived, s.project_feed_length), p
    assert count_views(client, s.env) == len(projects)
    assert count_gaps_recorded(client, s.env) == gaps


def test_views_of_a_workload_published_twice_equal_the_expected_views(rs: Settings) -> None:
    first, arrived, gaps = _arrivals()
    cli(rs, "provision")
    publish(rs, arrived)
    done = _consume(rs)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = re.search(r"(\d+) records, (\d+) applied, (\d+) duplicates", done.stderr)
    assert stats is not None, done.stderr[-2000:]
    assert [int(n) for n in stats.groups()] == [len(arrived), len(first), len(first)]
    _check_views(rs, arrived, gaps)
    holed = orjson.loads(cli(rs, "view", "proj-pv-holed", "--json").stdout)
    assert holed["gap"] is True and holed["missingSlots"] == [4, 5]
    late = orjson.loads(cli(rs, "view", "proj-pv-late", "--json").stdout)
    assert late["gap"] is False and late["gapsRecorded"] == 1 and late["highSlot"] == 10

    text = cli(rs, "view", "proj-pv-holed").stdout
    assert "GAP, missing 4, 5" in text
    missing = cli(rs, "view", "proj-nobody", "--json", check=False)
    assert missing.returncode == 2 and missing.stdout == ""
    assert "project 'proj-nobody' has no view" in missing.stderr and rs.env in missing.stderr
    assert cli(rs, "feed", "proj-nobody", check=False).returncode == 2


def test_a_consumer_killed_right_after_a_commit_leaves_the_views_exact(rs: Settings) -> None:
    _, arrived, gaps = _arrivals()
    cli(rs, "provision")
    publish(rs, arrived)
    killed = _consume(rs, RHUMBATRON_FAILPOINTS="runtime.after_store_commit@3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = _consume(rs)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_views(rs, arrived, gaps)
