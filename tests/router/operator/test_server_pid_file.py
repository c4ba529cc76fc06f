"""``rhumbatron serve --pid-file PATH``: the pid written 0600 while the server runs and removed at
its clean exit; a second server on the same file refused in one line; a stale file replaced,
and the unrelated process whose pid it names left alone."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.operator.pid_file import PidFile, recorded_pid, running_server
from router.settings import Settings
from streams.errors import ConfigurationError
from tests.support.environment import ROOT, make_settings, subprocess_env
from tests.support.files import mode_of, umask


def _serve(s: Settings, pid_file: Path) -> subprocess.Popen[str]:
    with umask(0o022):  # the child inherits it: the file's mode must not come from it
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "router.cli",
                "serve",
                "--port",
                "0",
                "--pid-file",
                str(pid_file),
            ],
            cwd=ROOT,
            env=subprocess_env(s),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the socket is bound, the pid file written
    assert line.startswith("operator page at "), line + (proc.stderr.read() if proc.stderr else "")


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is no operator server of ours."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def test_the_pid_file_is_written_0600_held_while_serving_and_removed_at_exit(
    tmp_path: Path,
) -> None:
    s, pid_file = make_settings(), tmp_path / "operator.pid"
    first = _serve(s, pid_file)
    try:
        _started(first)
        assert pid_file.read_text() == f"{first.pid}\n"
        assert mode_of(pid_file) == 0o600
        assert running_server(pid_file) == first.pid
        second = _serve(s, pid_file)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 2 and out == ""
        assert err.splitlines() == [
            f"rhumbatron: --pid-file {pid_file} names an operator server that is running "
            f"(pid {first.pid}): stop it first (kill {first.pid}), or give another --pid-file"
        ]
        assert first.poll() is None and pid_file.read_text() == f"{first.pid}\n"
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert not pid_file.exists()


def test_a_stale_pid_file_is_replaced_and_the_process_it_names_left_alone(
    tmp_path: Path, unrelated: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "operator.pid"
    pid_file.write_text(f"{unrelated.pid}\n")
    pid_file.chmod(0o644)
    assert running_server(pid_file) is None and recorded_pid(pid_file) == unrelated.pid
    proc = _serve(make_settings(), pid_file)
    try:
        _started(proc)
        assert pid_file.read_text() == f"{proc.pid}\n" and mode_of(pid_file) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert unrelated.poll() is None  # never signalled


def test_a_failed_start_removes_the_pid_file_it_wrote(tmp_path: Path) -> None:
    pid_file = tmp_path / "operator.pid"
    proc = _serve(make_settings(operator_host="0.0.0.0"), pid_file)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not a loopback address" in err
    assert not pid_file.exists()


def test_a_pid_file_in_a_missing_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot open --pid-file .*No such file"):
        PidFile.acquire(tmp_path / "nowhere" / "operator.pid")
