"""The command line on a PostgreSQL outbox (``--outbox postgresql://…``): a second publisher
asked not to stand by, as from another machine, is refused in one line naming the holder (one
that stands by: test_publish_standby.py); ``outbox stats`` reads it;
a URL that cannot connect is one line naming host, port and database, never the password."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from router.settings import Settings
from streams.admin import admin_client, provision
from tests.support.environment import ROOT, run_cli
from tests.support.outbox import OutboxBackend, cli_env, drafts

pytestmark = pytest.mark.integration


def _cli(s: Settings, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *argv, env=cli_env(s), timeout=300)


def test_a_second_publisher_without_standby_is_refused_naming_the_holder(
    settings: Settings, pg: OutboxBackend
) -> None:
    base = settings.kafka_config()
    specs = settings.topology.stream_specs()
    provision(admin_client(base), base, specs, topology=settings.topology, timeout=30)
    first = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "publish", "--outbox", pg.address],
        cwd=ROOT,
        env=cli_env(settings),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not pg.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE "
            f"'rhumbatron publisher pid {first.pid} on %'"
        ):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first publisher never took the lease"
            time.sleep(0.05)
        second = _cli(settings, "publish", "--outbox", pg.address, "--no-standby")
        assert second.returncode == 2
        assert "already has a publisher (rhumbatron publisher pid " in second.stderr
        assert f"pid {first.pid} on " in second.stderr and "PostgreSQL backend" in second.stderr
        assert "advisory lock" in second.stderr
        first.send_signal(signal.SIGTERM)  # a clean stop
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)


def test_outbox_stats_reads_a_postgresql_outbox(settings: Settings, pg: OutboxBackend) -> None:
    store = pg.store()
    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 3), tenant_id="t")
    shown = _cli(settings, "outbox", "stats", "--outbox", pg.address, "--json")
    assert shown.returncode == 0, shown.stderr
    stats = json.loads(shown.stdout)
    assert stats["pending"] == 3 and stats["outbox"] == store.location
    password = str(psycopg.conninfo.conninfo_to_dict(pg.address)["password"])
    assert password not in shown.stdout


def test_a_url_that_cannot_connect_is_one_line_without_the_password(settings: Settings) -> None:
    refused = _cli(
        settings, "outbox", "stats", "--outbox", "postgresql://app:hunter2-pw@127.0.0.1:1/orders"
    )
    assert refused.returncode != 0
    assert "host 127.0.0.1 port 1 database orders" in refused.stderr
    assert "hunter2-pw" not in refused.stderr + refused.stdout
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_publish_and_stats_never_show_the_password(settings: Settings, pg: OutboxBackend) -> None:
    base = settings.kafka_config()
    specs = settings.topology.stream_specs()
    provision(admin_client(base), base, specs, topology=settings.topology, timeout=30)
    store = pg.store()
    with store.transaction() as unit:
        unit.append("proj-a", drafts("proj-a", 2), tenant_id="t")
    password = str(psycopg.conninfo.conninfo_to_dict(pg.address)["password"])
    published = _cli(settings, "publish", "--outbox", pg.address, "--until-empty")
    assert published.returncode == 0, published.stderr
    assert f"publish {store.location}: env {settings.env}" in published.stderr
    stats = _cli(settings, "outbox", "stats", "--outbox", pg.address)
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.startswith(f"outbox {store.location}\n")
    assert "published 2" in stats.stdout
    for shown in (published, stats):
        assert password not in shown.stdout + shown.stderr


def test_outbox_init_creates_the_schema_once_and_refuses_another_version(
    settings: Settings,
) -> None:
    from tests.support.postgres import FreshSchema

    schema = FreshSchema(init=False)
    try:
        before = _cli(settings, "outbox", "stats", "--outbox", schema.url)
        assert before.returncode == 2 and "run `rhumbatron outbox init" in before.stderr
        made = _cli(settings, "outbox", "init", "--outbox", schema.url)
        assert made.returncode == 0, made.stderr
        created = re.fullmatch(
            rf"outbox schema version 3 created in schema {schema.name} at host 127\.0\.0\.1 "
            r"port \d+ database rhumbatron; identity (obx_[0-9a-f]{16})",
            made.stdout.strip(),
        )
        assert created, made.stdout
        identity = created.group(1)
        again = _cli(settings, "outbox", "init", "--outbox", schema.url)
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith(f"outbox schema version 3 already in schema {schema.name}")
        assert again.stdout.strip().endswith(f"identity {identity}"), again.stdout
        stats = _cli(settings, "outbox", "stats", "--outbox", schema.url, "--json")
        assert stats.returncode == 0 and json.loads(stats.stdout)["total"] == 0, stats.stderr
        assert json.loads(stats.stdout)["outbox_id"] == identity
        shown = _cli(settings, "outbox", "stats", "--outbox", schema.url)
        assert f"  identity {identity}\n" in shown.stdout, shown.stdout
        with schema.connect() as conn:
            conn.execute("UPDATE outbox_schema_version SET version = 7")
        refused = _cli(settings, "outbox", "init", "--outbox", schema.url)
        assert refused.returncode == 2
        line = refused.stderr.strip()
        assert line.startswith("rhumbatron: ") and len(line.splitlines()) == 1, line
        assert "version 7" in line and "versions 1 to 3" in line
        password = str(psycopg.conninfo.conninfo_to_dict(schema.url)["password"])
        for shown in (made, again, refused):
            assert password not in shown.stdout + shown.stderr
    finally:
        schema.drop()
