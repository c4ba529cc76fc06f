"""A subscription of your own, named in a settings table, through every surface a built-in has,
on the real broker and Redis: provision makes its redelivery topic; acls grant its role; the
fleet plans its members and the manifests render them; consume runs it (by slug, the table
naming its path), its metrics carry its slug; status and the operator's lag show its group;
its failing event is dead-lettered after the fifth failure and an operator's retry sends it
back; the operator controls move its cursor."""

from __future__ import annotations

import json
import select
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from router.deploy import manifests
from router.fleet import plan
from router.operator.service import OperatorService
from router.settings import Settings
from streams.envelopes import Event
from tests.support.environment import NO_SUBSCRIPTIONS, cleanup_environment, make_settings
from tests.support.runtime_harness import event
from tests.support.runtime_processes import cli, publish, runtime_settings, start_consume_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SLUG = "task-counts"
TABLE = {SLUG: {"processor": "tests.support.plugins:TaskCounts"}}


@pytest.fixture
def s() -> Iterator[Settings]:
    settings = runtime_settings(
        make_settings(subscriptions=TABLE, fleet_subscriptions={**NO_SUBSCRIPTIONS, SLUG: 2})
    )
    yield settings
    cleanup_environment(settings)


def _events() -> list[Event]:
    done = [event(p, n) for p in ("alpha", "beta") for n in (1, 2, 3)]
    failing = event("gamma", 1).model_copy(update={"payload": {"drill": "fail"}})
    return [*done, failing]


def _metrics(proc: subprocess.Popen[str]) -> str:
    """The /metrics address a consume process prints on stderr as it starts."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if "metrics endpoint " in line:
                return line.split("metrics endpoint ", 1)[1].strip()
            if not line and proc.poll() is not None:
                raise AssertionError(f"consume exited {proc.returncode} before serving metrics")
    raise AssertionError("no metrics endpoint printed")


def _applied(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rhumbatron_events_applied_total"
        and sample.labels.get("subscription") == SLUG
    )


def test_every_surface_treats_a_subscription_of_your_own_as_a_built_in(
    s: Settings, tmp_path: Path
) -> None:
    redelivery = s.topology.redelivery_spec(SLUG).name
    # provision: its redelivery topic, as for a built-in
    assert f"created {redelivery}" in cli(s, "provision").stdout
    # acls: a role of its own, its group and its redelivery topic
    grants = json.loads(cli(s, "acls", "--role", SLUG, "--json").stdout)["roles"]
    [grant] = grants
    names = {(a["resource"], a["name"]) for a in grant["kafka"]}
    assert ("GROUP", f"rhumbatron-{SLUG}-{s.env}") in names
    assert ("TOPIC", redelivery) in names
    assert "transactional" not in json.dumps(grant["kafka"]).lower()  # Redis effects: none
    # the fleet plans its members; the manifests render them
    members = [m for m in plan(s) if m.subscription == SLUG]
    assert [m.name for m in members] == [f"{SLUG}-1", f"{SLUG}-2"]
    assert members[0].argv == ("consume", "--subscription", SLUG)
    rendered = manifests(s.model_copy(update={"archive_store": "none"}), "", image="img:1")
    deployed = [
        m["metadata"]["name"] for m in rendered if m["kind"] in ("Deployment", "StatefulSet")
    ]
    assert [name for name in deployed if SLUG in name] == [SLUG]
    # consume, by its slug: the table names its path
    publish(s, _events())
    proc = start_consume_cli(s, SLUG, until_idle=4, RHUMBATRON_METRICS_PORT="0")
    try:
        url = _metrics(proc)
        wait_until(lambda: _applied(url) == 6, timeout=120, what="six events applied")
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    client: redis.Redis[bytes] = redis.Redis.from_url(s.redis_url)
    done: dict[str, int] = {}
    for key in client.scan_iter(match=f"rh:{s.env}:{{{SLUG}|*:x:done", count=1000):
        for project, n in client.hgetall(key).items():
            done[project.decode()] = done.get(project.decode(), 0) + int(n)
    assert done == {"alpha": 3, "beta": 3}
    # its failing event: dead-lettered after the fifth failure, under its slug
    letters = json.loads(cli(s, "dead-letters", "list", "--json").stdout)
    [letter] = [x for x in letters if x["subscription"] == SLUG]
    assert letter["attempts"] == 5
    # status and the operator's lag: its group, read to the end
    lag = {g.subscription: g for g in OperatorService(s).lag().subscriptions}
    assert lag[SLUG].group == f"rhumbatron-{SLUG}-{s.env}" and lag[SLUG].total_lag == 0
    assert f"rhumbatron-{SLUG}-{s.env}" in cli(s, "status", "--json").stdout
    # an operator's retry sends the letter back through its redelivery topic
    cli(s, "dead-letters", "retry", letter["id"], "--reason", "test")
    # the operator controls: reprocess a partition of its from the start
    progress = json.loads(cli(s, "subscription", "progress", "--subscription", SLUG).stdout)
    name = next(tp for tp, p in progress.items() if int(p["acked_through"]) >= 0)
    topic, partition = name.rstrip("]").split("[")
    cli(
        s,
        "subscription",
        "reprocess-from",
        "--subscription",
        SLUG,
        "--topic",
        topic,
        "--partition",
        partition,
        "--offset",
        "0",
        "--expected-revision",
        "0",
        "--reason",
        "test",
    )
    after = json.loads(cli(s, "subscription", "progress", "--subscription", SLUG).stdout)
    assert after[name]["cursor_revision"] == "1"
