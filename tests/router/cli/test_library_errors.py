"""No raw library error reaches the user: a broker that does not answer, a Redis that answers
with an error, an outbox path that is no SQLite file, an archive directory that is a file — each
is one ``rhumbatron: …`` line naming what was tried, and exit 2, from the real command line
against the real servers (or none listening)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.processor import view_key
from consumers.subscriptions.projector.view import _store
from router.settings import Settings
from tests.support.environment import (
    cleanup_environment,
    make_settings,
    run_cli,
    subprocess_env,
)

pytestmark = pytest.mark.integration

NOBODY = "127.0.0.1:1"  # loopback port 1: nothing listens, every connection is refused at once


def _cli(s: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(s, RHUMBATRON_CONNECT_TIMEOUT_S="3", **extra)
    return run_cli(s, *args, env=env, timeout=120)  # the timeout bounds every case: none may hang


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """What main() promises for our errors: exit 2, one line ``rhumbatron: …``, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rhumbatron: "), result.stderr
    assert result.returncode == 2
    return lines[0]


def test_counting_points_with_kafka_down_names_the_broker() -> None:
    line = _one_line_error(_cli(make_settings(kafka_bootstrap=NOBODY), "analytics-points"))
    assert f"Kafka at {NOBODY} is unreachable" in line and "metrics" in line


def test_a_control_with_kafka_down_names_the_broker_and_the_partition() -> None:
    s = make_settings(kafka_bootstrap=NOBODY)
    topic = s.topology.stream_names()[0]
    try:
        result = _cli(
            s, "subscription", "skip-through", "--subscription", "ledger", "--topic", topic,
            "--partition", "0", "--offset", "0", "--who", "ann", "--reason", "drill",
        )  # fmt: skip
        line = _one_line_error(result)
    finally:
        cleanup_environment(make_settings(env=s.env))  # the control's Redis keys
    assert f"Kafka at {NOBODY} is unreachable" in line and f"{topic}[0]" in line


def test_a_view_with_redis_down_names_redis() -> None:
    s = make_settings(redis_url=f"redis://{NOBODY}/0")
    line = _one_line_error(_cli(s, "view", "proj-1"))
    assert f"Redis at {NOBODY} is unreachable" in line


@pytest.mark.parametrize("command", ["view", "feed"])
def test_a_view_key_of_another_type_is_refused_naming_redis_and_the_project(command: str) -> None:
    s = make_settings()
    topic, partition = s.topology.partition_of("proj-1")
    client = connect(s.redis_url, timeout=5)
    part = "feed" if command == "feed" else "counts"
    key = _store(client, s.env).key(TP(topic, partition), view_key("proj-1", part))
    client.set(key, b"not a hash or list")  # as a stranger sharing the database might
    try:
        line = _one_line_error(_cli(s, command, "proj-1"))
    finally:
        cleanup_environment(s)
        client.close()
    assert "Redis at 127.0.0.1:" in line and "refused the request" in line
    assert "proj-1" in line and "WRONGTYPE" in line and "RHUMBATRON_ENV" in line


def test_outbox_stats_of_a_directory_or_a_corrupt_file_is_one_line(tmp_path: Path) -> None:
    s = make_settings()
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not sqlite at all " * 300)
    line = _one_line_error(_cli(s, "outbox", "stats", "--outbox", str(tmp_path)))
    assert str(tmp_path) in line and "not a directory" in line
    line = _one_line_error(_cli(s, "outbox", "stats", "--outbox", str(corrupt)))
    assert f"{corrupt} is not a SQLite database" in line


def test_publish_with_an_unusable_lock_file_is_one_line(tmp_path: Path) -> None:
    s = make_settings(kafka_bootstrap=NOBODY)
    outbox = tmp_path / "o.db"
    made = _cli(s, "produce", "--outbox", str(outbox), "--projects", "1", "--events", "1")
    assert made.returncode == 0, made.stderr
    lock = tmp_path / "o.db.publisher.lock"
    lock.mkdir()  # where the publisher's lock file must go
    line = _one_line_error(_cli(s, "publish", "--outbox", str(outbox), "--until-empty"))
    assert str(lock) in line and "writable file" in line


@pytest.mark.parametrize(
    "command",
    [("archive", "count"), ("archive", "expire"), ("archive", "verify", "--day", "2024-05-01")],
)
def test_an_archive_dir_that_is_a_file_is_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    not_a_dir = tmp_path / "archive"
    not_a_dir.write_text("a file where the archive directory should be")
    s = make_settings(archive_store="local", archive_dir=str(not_a_dir))
    line = _one_line_error(_cli(s, *command))
    assert f"{not_a_dir} is not a directory" in line and "RHUMBATRON_ARCHIVE_DIR" in line
