"""File modes in tests: a known umask, and a path's permission bits."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process umask set to ``mask`` inside the block: 0o022, the usual default, leaves
    group and others able to read what is created without an explicit mode."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
