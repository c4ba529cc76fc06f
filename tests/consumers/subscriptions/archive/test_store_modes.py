"""The directory store's parts are 0600 and the directories it makes 0700, whatever the umask:
an archive holds every event's payload."""

from __future__ import annotations

import os
from pathlib import Path

from consumers.subscriptions.archive.store import LocalObjectStore
from tests.support.files import mode_of, umask


def test_parts_are_0600_and_the_directories_made_0700(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    root = tmp_path / "archive"
    key = "events/2026-01-01/stream-00/a.gz"
    with umask(0o022):
        store = LocalObjectStore(root)
        store.put(key, b"x")
        store.put(key, b"y")  # a replaced part too
    assert (root / key).read_bytes() == b"y" and mode_of(root / key) == 0o600
    made = [root, *(root / key).parents]
    made = [d for d in made if d == root or root in d.parents]
    assert {d: mode_of(d) for d in made} == {d: 0o700 for d in made}
    assert mode_of(tmp_path) == 0o755
