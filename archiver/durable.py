"""Local durability primitives: fsync of directory entries and file data; the one-writer lock of a state dir."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from archiver.errors import ConfigError


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a create, link or rename inside it) to disk."""
    _synced(path, os.O_RDONLY | os.O_DIRECTORY, os.fsync)


def fdatasync_file(path: Path) -> None:
    """Flush a file's data (and what reading it back needs) to disk, by its path."""
    _synced(path, os.O_RDONLY | os.O_CLOEXEC, os.fdatasync)


def _synced(path: Path, flags: int, sync: Callable[[int], None]) -> None:
    fd = os.open(path, flags)
    try:
        sync(fd)
    finally:
        os.close(fd)


class StateDirLock:
    """An exclusive `flock` on `<state dir>/lock`, held for the life of the process that writes there.

    Two writers would each "recover" the other's in-flight work (SQLite allows one writer anyway);
    the lock turns that into a clear error. The kernel drops it when the process dies, so a
    `kill -9` never leaves a stale lock behind.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"state dir {self.path.parent}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"state dir {self.path.parent} is in use by another archiver process "
                "(stop it, or give this one its own --state-dir)"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
