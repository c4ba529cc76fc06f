"""The SQLite outbox's files are the owner's alone: the database it creates and the ``-wal`` and
``-shm`` files SQLite makes beside it are 0600, its publisher lock too, whatever the umask; an
outbox that exists keeps its owner's mode."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.files import mode_of, umask
from tests.support.outbox import drafts, sqlite_outbox


def test_a_new_outbox_and_its_wal_and_shm_files_are_0600(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with umask(0o022):
        store = sqlite_outbox(path)
        try:
            with store.transaction() as unit:
                unit.append("proj-a", drafts("proj-a", 2), tenant_id="t")
            with store.publisher_lease():
                lock = Path(f"{path}.publisher.lock")
                assert mode_of(lock) == 0o600
            siblings = [Path(f"{path}-wal"), Path(f"{path}-shm")]
            assert all(p.exists() for p in siblings), list(tmp_path.iterdir())
            assert [mode_of(p) for p in (path, *siblings)] == [0o600] * 3
        finally:
            store.close()


def test_an_existing_outbox_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    sqlite_outbox(path).close()
    os.chmod(path, 0o640)
    with umask(0o022):
        store = sqlite_outbox(path)
        try:
            with store.transaction() as unit:
                unit.append("proj-a", drafts("proj-a", 1), tenant_id="t")
            assert mode_of(path) == 0o640
            assert mode_of(Path(f"{path}-wal")) == 0o640  # SQLite: the database's mode
        finally:
            store.close()
