"""Files and directories only their owner may read: the operator token, pid files, outboxes,
archive parts, logs and the state directory are created 0600 (files) and 0700 (directories).

The modes are set explicitly after creating, not left to the umask: a umask of 022 (the usual
default) would make a token or an outbox readable by every local user, and a stricter one must
not make a file unusable to its owner either.

Only what is created here gets these modes: an existing directory, or an existing file opened
without ``tighten``, keeps the mode its owner gave it (a group-readable outbox may be
deliberate).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: str | os.PathLike[str], *, parents: bool = True) -> Path:
    """``path`` as a directory, each one created here (with ``parents``, the missing parents
    too) 0700; an existing directory is left as it is."""
    directory = Path(path)
    if directory.is_dir():
        return directory
    if parents and not directory.parent.is_dir():
        private_dir(directory.parent, parents=True)
    with contextlib.suppress(FileExistsError):  # made meanwhile by someone else: theirs
        directory.mkdir(mode=PRIVATE_DIR)
        os.chmod(directory, PRIVATE_DIR)
    return directory


def open_private(path: str | os.PathLike[str], flags: int, *, tighten: bool = False) -> int:
    """``os.open`` of ``path``, creating it 0600 if it is missing (``os.O_CREAT`` is implied);
    with ``tighten``, an existing file is made 0600 too (for a file rewritten whole, such as a
    token or a pid). The caller closes the descriptor."""
    while True:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            created = True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            try:
                fd = os.open(path, flags & ~os.O_CREAT)
            except FileNotFoundError:
                continue  # removed between the two opens: create it after all
            created = False
        break
    try:
        if created or tighten:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path``'s contents with ``text``, the file 0600 (an existing one too)."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC, tighten=True)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def create_private(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` empty and 0600 unless it exists; True if it was created here (a file some
    other program then opens, such as a SQLite database, keeps this mode)."""
    try:
        fd = open_private(path, os.O_WRONLY | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True
