"""Where running captures' lines files live: a memory-backed scratch directory within a byte bound,
or the captures directory itself.

Why (issue 35): a running session's lines are not synced (`store`'s module doc), yet on a disk the
kernel still writes a capture file back 30 s after its first line, and its tail page again every
half minute while the session runs; a flood of endings paid those pages for files that a seal
replaced seconds later. With ``--follow-logs-scratch-dir`` on a tmpfs (an ``emptyDir`` of medium
``Memory`` in the chart), a running capture costs no disk write while the daemon runs: only the
seal, made when the segment finishes, is written and synced to the captures directory. A ``kill
-9`` keeps the files (the tmpfs is not the process's); a stop moves them to the captures directory
first (`CaptureStore.release`: a pod replaced by a rollout gets a new, empty tmpfs). What is lost
is what a machine crash or a pod killed without a stop takes: the running captures, which their
sessions' replays give again, but not the logs of a session that ended meanwhile where the service
forgets them (on a disk, only the lines of the last half minute were at risk).

The bound: a lines file that would take the scratch past ``limit`` bytes (or finds the tmpfs full)
is moved to the captures directory first (a spill; the copy is named whole before the scratch file
goes, so a crash in between leaves twins, and the captures directory's copy wins at recovery) and
goes on there. The scratch is namespaced by an id kept in the captures directory, so daemons with
their own state dirs may share one scratch mount, and a state dir moved elsewhere finds its files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from archiver.durable import fdatasync_file, fsync_dir
from archiver.errors import StateError

#: The file in the captures directory that names its scratch subdirectory.
ID_FILE = "scratch.id"
#: How a spill's copy is opened (a lines file is the archiver's alone: 0o600).
_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
#: Errors of a write that a spill answers: the scratch filesystem is full.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class Scratch:
    """The scratch subdirectory of one captures directory, and the bytes its lines files hold."""

    def __init__(self, root: Path, home: Path, limit: int) -> None:
        self.home = home
        self.limit = limit
        self._lock = threading.Lock()
        self.used = 0
        self.spills = 0
        try:
            id_file = home / ID_FILE
            if not id_file.is_file() or not id_file.read_text().strip():  # empty: a crash as it was made
                partial = id_file.with_name(ID_FILE + ".partial")
                partial.write_text(secrets.token_hex(16) + "\n")
                fdatasync_file(partial)
                os.replace(partial, id_file)
                fsync_dir(home)
            name = id_file.read_text().strip()
            if len(name) != 32 or not all(c in "0123456789abcdef" for c in name):
                raise StateError(f"live captures: {id_file} is damaged: delete it (running captures start afresh)")
            self.directory = root / name
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"live capture scratch dir {root}: {exc.strerror or exc}") from None

    # --- where a lines file is ----------------------------------------------------------------

    def locate(self, name: str) -> Path:
        """The lines file called ``name``: the captures directory's (a spill's copy wins over its
        twin), else the scratch's; a file in neither is placed in the scratch."""
        home = self.home / name
        return home if home.exists() else self.directory / name

    def place(self, name: str, size: int = 0) -> Path:
        """Where a new lines file of ``size`` bytes goes: the scratch while it has room for them
        (then counted), else the captures directory."""
        if size:
            room = self.take(size)
        else:
            with self._lock:
                room = self.used < self.limit
        return (self.directory if room else self.home) / name

    def make(self, name: str, size: int, write: Callable[[Path], None]) -> Path:
        """A new lines file of ``size`` bytes named ``name``, made whole by ``write`` (which leaves
        nothing on an error): in the scratch if it has room for them, else (or once the tmpfs proves
        full) in the captures directory."""
        path = self.place(name, size)
        try:
            write(path)
        except OSError as exc:
            if not self.holds(path):
                raise
            self.charge(-size)
            if not is_full(exc):
                raise
            path = self.home / name
            write(path)
        return path

    def holds(self, path: Path) -> bool:
        return path.parent == self.directory

    # --- its bytes ----------------------------------------------------------------------------

    def counted(self) -> None:
        """Count the lines files the scratch holds (at open: a restart finds them as they were)."""
        total = 0
        for entry in self.directory.iterdir():
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
        with self._lock:
            self.used = total

    def take(self, size: int) -> bool:
        """Whether ``size`` more bytes keep the scratch within its bound; counted if they do."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def charge(self, size: int) -> None:
        """Count (or, negative, give back) ``size`` bytes whatever the bound."""
        with self._lock:
            self.used = max(0, self.used + size)

    def unlink(self, path: Path) -> None:
        """Delete a lines file (of either place), its bytes no longer counted."""
        try:
            size = path.stat().st_size if self.holds(path) else 0
            path.unlink()
        except FileNotFoundError:
            return
        with self._lock:
            self.used = max(0, self.used - size)

    def spill(self, path: Path, fd: int) -> tuple[Path, int]:
        """Move a lines file open for appending (``fd``) to the captures directory: its new path and
        fd. The copy is named whole before the scratch file goes; on an error (the disk is full
        too) nothing moved and the error is raised."""
        target = self.home / path.name
        partial = target.with_name(target.name + ".partial")
        try:
            with open(path, "rb") as src, open(os.open(partial, _NEW, 0o600), "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, target)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            raise
        new_fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.close(fd)
        self.unlink(path)
        with self._lock:
            self.spills += 1
        return target, new_fd


def is_full(exc: OSError) -> bool:
    """Whether a write failed for want of room (a spill answers it)."""
    return exc.errno in FULL
