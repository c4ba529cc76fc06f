"""The operator server's pid file (``rhumbatron serve --pid-file PATH``).

The file holds the server's pid (so ``kill $(cat PATH)`` stops it) and the server holds an
``fcntl.flock`` on it while it runs, which the kernel releases when the server dies, however it
dies. So "the file names a live server of ours" is "the file is locked", not "some process has
that pid": a pid left by a server that crashed, and since taken by an unrelated process, is
never signalled. The file is 0600 (streams/files.py) and removed at a clean exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from streams.errors import ConfigurationError
from streams.files import open_private


class PidFile:
    """A pid file this process holds: its pid written, the lock taken (see ``acquire``)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, path: str | os.PathLike[str]) -> PidFile:
        """Lock ``path`` and write this process's pid there, replacing a stale one; refused
        (one line) while another server holds it."""
        path = Path(path).absolute()
        while True:
            try:
                fd = open_private(path, os.O_RDWR, tighten=True)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot open --pid-file {path}: {exc.strerror}; it must be a file in a "
                    "directory that exists and that this user may write"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                who = f"pid {pid}" if pid is not None else "its pid not written yet"
                stop = f"stop it first (kill {pid})" if pid is not None else "stop it first"
                raise ConfigurationError(
                    f"--pid-file {path} names an operator server that is running ({who}): "
                    f"{stop}, or give another --pid-file"
                ) from None
            # The previous holder removes the file at its exit: the file opened may be gone
            # from the path by the time its lock is ours; then lock the one at the path.
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Remove the file (while still holding it, so no starting server sees it half-gone),
        then drop the lock."""
        try:
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                    self.path.unlink()
        finally:
            os.close(self._fd)


def running_server(path: str | os.PathLike[str]) -> int | None:
    """The pid of the live server holding ``path``, or None when none holds it (no file, or a
    stale one whatever pid it names)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd)
        return None  # our shared lock goes with the descriptor
    finally:
        os.close(fd)


def recorded_pid(path: str | os.PathLike[str]) -> int | None:
    """The pid written in ``path``, live or not (for messages)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
