"""The outbox's identity on the records, read back from the real broker: ``rhumbatron publish``
sets the ``outbox`` header on every event it sends, the identity ``outbox stats`` shows; a
PostgreSQL outbox at schema version 2 publishes without it and says to migrate, and after
``outbox migrate`` the next publisher names the outbox."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from router.settings import Settings
from streams.admin import admin_client, provision
from streams.envelopes import decode_event
from streams.headers import OUTBOX
from streams.outbox.identity import OutboxPosition, is_outbox_id, outbox_position
from tests.support.environment import run_cli
from tests.support.kafka import read_all
from tests.support.outbox import OutboxBackend, cli_env

pytestmark = pytest.mark.integration


def _cli(s: Settings, *argv: str) -> subprocess.CompletedProcess[str]:
    done = run_cli(s, *argv, env=cli_env(s), timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def _provision(s: Settings) -> None:
    base = s.kafka_config()
    provision(admin_client(base), base, s.topology.stream_specs(), topology=s.topology, timeout=30)


def _positions(s: Settings, expect: int) -> list[OutboxPosition | None]:
    messages = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=expect)
    assert len(messages) == expect
    return [
        outbox_position(m.headers(), decode_event(m.value(), max_bytes=s.max_envelope_bytes))
        for m in messages
    ]


def _identity(s: Settings, outbox: str) -> str | None:
    shown = orjson.loads(_cli(s, "outbox", "stats", "--outbox", outbox, "--json").stdout)
    found = shown["outbox_id"]
    assert found is None or is_outbox_id(found)
    return str(found) if found is not None else None


def test_every_record_published_from_a_sqlite_outbox_names_it(
    settings: Settings, tmp_path: Path
) -> None:
    _provision(settings)
    path = str(tmp_path / "outbox.db")
    _cli(settings, "produce", "--outbox", path, "--projects", "5", "--events", "60")
    _cli(settings, "publish", "--outbox", path, "--until-empty")
    identity = _identity(settings, path)
    assert identity is not None
    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=60)
    slots: dict[str, list[int]] = defaultdict(list)
    for message in messages:
        event = decode_event(message.value(), max_bytes=settings.max_envelope_bytes)
        position = outbox_position(message.headers(), event)
        assert position == (identity, event.slot), message.headers()
        slots[event.project_id].append(position.slot)
    assert sum(map(len, slots.values())) == 60
    assert all(found == list(range(1, len(found) + 1)) for found in slots.values())


def test_a_v2_postgres_outbox_publishes_without_it_until_migrated_and_restarted(
    settings: Settings, pg_v2: OutboxBackend
) -> None:
    _provision(settings)
    assert pg_v2.schema is not None
    url = pg_v2.schema.url
    _cli(settings, "produce", "--outbox", url, "--projects", "2", "--events", "10")
    assert _identity(settings, url) is None
    old = _cli(settings, "publish", "--outbox", url, "--until-empty")
    assert old.stderr.count("holds no identity") == 1, old.stderr
    assert "rhumbatron outbox migrate --outbox URL" in old.stderr
    assert _positions(settings, 10) == [None] * 10
    migrated = _cli(settings, "outbox", "migrate", "--outbox", url)
    assert "migrated from schema version 2 to 3" in migrated.stdout
    identity = _identity(settings, url)
    assert identity is not None and migrated.stdout.strip().endswith(f"identity {identity}")
    _cli(settings, "produce", "--outbox", url, "--projects", "2", "--events", "10")
    new = _cli(settings, "publish", "--outbox", url, "--until-empty")
    assert "holds no identity" not in new.stderr
    positions = _positions(settings, 20)
    assert positions.count(None) == 10
    named = [p for p in positions if p is not None]
    assert {p.outbox_id for p in named} == {identity} and len(named) == 10
    messages = read_all(settings.kafka_bootstrap, settings.topology.stream_names(), expect=20)
    assert sum(1 for m in messages for k, _ in list(m.headers() or []) if k == OUTBOX) == 10
