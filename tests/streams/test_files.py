"""streams/files.py: what it creates is 0600 / 0700 whatever the umask; what exists keeps its
mode unless it is rewritten whole."""

from __future__ import annotations

import os
from pathlib import Path

from streams.files import create_private, open_private, private_dir, write_private
from tests.support.files import mode_of, umask


def test_directories_made_are_0700_with_their_missing_parents(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    with umask(0o022):
        made = private_dir(existing / "a" / "b")
    assert made.is_dir()
    assert mode_of(existing / "a") == 0o700 and mode_of(existing / "a" / "b") == 0o700
    assert mode_of(existing) == 0o755  # not ours to change


def test_an_existing_directory_is_left_as_it_is(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    private_dir(tmp_path)
    assert mode_of(tmp_path) == 0o755


def test_a_file_written_whole_is_0600_even_if_it_existed_wider(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    os.chmod(token, 0o644)
    with umask(0o022):
        write_private(token, "new\n")
        write_private(tmp_path / "fresh", "x")
    assert token.read_text() == "new\n" and mode_of(token) == 0o600
    assert mode_of(tmp_path / "fresh") == 0o600


def test_a_file_created_is_0600_and_an_existing_one_keeps_its_mode(tmp_path: Path) -> None:
    with umask(0o022):
        assert create_private(tmp_path / "db") is True
        assert create_private(tmp_path / "db") is False
        shared = tmp_path / "shared"
        shared.write_bytes(b"kept")
        os.chmod(shared, 0o640)
        os.close(open_private(shared, os.O_RDWR))
    assert mode_of(tmp_path / "db") == 0o600
    assert mode_of(shared) == 0o640 and shared.read_bytes() == b"kept"


def test_a_strict_umask_does_not_lock_the_owner_out(tmp_path: Path) -> None:
    with umask(0o277):
        write_private(tmp_path / "f", "x")
        private_dir(tmp_path / "d")
    assert mode_of(tmp_path / "f") == 0o600 and mode_of(tmp_path / "d") == 0o700
