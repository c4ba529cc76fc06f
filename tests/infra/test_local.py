"""infra/local.sh on private instances: stop, kill and restart keep data; a snapshot restored
brings back what it held and nothing written after it, and stays after a restart; the cluster
survives losing a broker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis

from streams.admin import admin_client, ensure_reachable
from tests.support.infra import LOCAL_SH, PrivateServices

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_redis_kill_and_restart_keeps_append_only_data() -> None:
    with PrivateServices(kafka=False) as svc:
        client = redis.Redis.from_url(svc.redis_url)
        client.set("k", "v")
        client.close()
        svc.redis_kill()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(svc.redis_url, socket_connect_timeout=1).ping()
        svc.redis_start()
        assert redis.Redis.from_url(svc.redis_url).get("k") == b"v"
        assert "already running" in svc.run("redis-start")


def test_redis_restored_from_a_snapshot_holds_what_it_held_and_stays_so(tmp_path: Path) -> None:
    with PrivateServices(kafka=False) as svc:
        client = redis.Redis.from_url(svc.redis_url)
        client.set("before", "1")
        with pytest.raises(RuntimeError, match="could not write the snapshot to .*missing"):
            svc.redis_snapshot(tmp_path / "missing" / "snapshot.rdb")
        svc.redis_snapshot(tmp_path / "snapshot.rdb")
        client.set("after", "2")
        client.close()
        svc.redis_restore(tmp_path / "snapshot.rdb")
        restored = redis.Redis.from_url(svc.redis_url)
        assert sorted(restored.keys()) == [b"before"]
        restored.set("since", "3")  # append-only again: kept across a kill
        restored.close()
        svc.redis_kill()
        svc.redis_start()
        assert sorted(redis.Redis.from_url(svc.redis_url).keys()) == [b"before", b"since"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["redis-snapshot"], "redis-snapshot needs the file to write"),
        (["redis-snapshot", "snap.rdb"], "redis is not answering on"),
        (["redis-restore", "missing.rdb"], "redis-restore needs a snapshot file; 'missing.rdb'"),
    ],
)
def test_a_snapshot_or_restore_that_cannot_be_made_says_why(
    args: list[str], said: str, tmp_path: Path
) -> None:
    env = {**os.environ, "RHUMBATRON_LOCAL_DIR": str(tmp_path), "RHUMBATRON_REDIS_PORT": "1"}
    done = subprocess.run(
        [str(LOCAL_SH), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and said in done.stderr, done.stderr


@pytest.mark.slow  # 47 s of broker starts and stops
def test_kafka_stop_start_and_kill_are_idempotent_and_report() -> None:
    with PrivateServices(redis=False) as svc:
        base = {"bootstrap.servers": svc.bootstrap}
        ensure_reachable(admin_client(base), base, 10)
        assert "already running" in svc.run("kafka-start")
        assert "killed" in svc.run("kafka-kill")
        assert "not running" in svc.run("kafka-kill")
        svc.kafka_start()
        ensure_reachable(admin_client(base), base, 10)
        assert "stopped" in svc.run("kafka-stop")
        assert "kafka node single: stopped" in svc.run("status")
