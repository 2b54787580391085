"""A finished segment's seal as a file: its lines as the stored log's gzip (`gzipstream.gzip_blocks`,
deterministic), written beside its name as ``.partial`` for the store to sync and name, and its
lines read back from it, or made into a lines file again."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from archiver.live.segment import READ_BLOCK, Sealed, SegmentRow, sealed_path
from archiver.store.gzipstream import gunzip, gzip_blocks

#: How a seal, or a lines file made again from one, is opened (the archiver's alone: 0o600).
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def partial(path: Path) -> Path:
    """Where a seal (or a lines file made again from one) is written before it is named."""
    return path.with_name(path.name + ".partial")


def write(row: SegmentRow, lines: Iterable[bytes]) -> SegmentRow:
    """The finished segment with its seal: ``lines`` (its bytes) as the stored log's gzip, written
    as the seal's ``.partial`` (the caller syncs and names it)."""
    target = partial(sealed_path(row))
    digest = hashlib.sha256()
    size = 0
    try:
        with open(os.open(target, _NEW_FILE, 0o600), "wb") as out:
            for data in gzip_blocks(lines):
                digest.update(data)
                out.write(data)
                size += len(data)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        raise
    return dataclasses.replace(row, sealed=Sealed(size, digest.hexdigest()))


def lines_of(row: SegmentRow) -> Iterator[bytes]:
    """The lines of a sealed segment, from its seal, in blocks."""
    seal = sealed_path(row)
    with open(seal, "rb") as f:
        yield from gunzip(iter(lambda: f.read(READ_BLOCK), b""), seal.name)


def unseal_to(row: SegmentRow, path: Path) -> None:
    """Make ``path`` a lines file holding the sealed segment's lines, named whole: a reader never
    sees it half made (an error leaves nothing), and none is made without a seal (opened first)."""
    blocks = lines_of(row)
    first = next(blocks, b"")
    try:
        with open(os.open(partial(path), _NEW_FILE, 0o600), "wb") as out:
            out.write(first)
            out.writelines(blocks)
    except BaseException:  # a full disk: nothing half made is left behind
        with contextlib.suppress(FileNotFoundError):
            partial(path).unlink()
        raise
    os.replace(partial(path), path)


class Unsynced:
    """Seals named but not yet synced, each until its due time (`--follow-logs-seal-sync-delay`):
    one whose every name is gone by then (its upload done, its capture removed) never reaches the
    disk: its pages are dropped before the kernel writes them back. Each is held by an open
    descriptor, as its spool hard link may be its only name left. Thread-safe."""

    def __init__(self, delay: float, directory_fd: int, room: int) -> None:
        self.delay = delay
        self._directory_fd = directory_fd
        #: Most seals held at once (`live.loop.seals_room`: open files); one more is synced at once.
        self._room = room
        self._lock = threading.Lock()
        #: (due, descriptor) in the order they were named.
        self._held: list[tuple[float, int]] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def add(self, path: Path, now: float) -> None:
        """``path``, just named, is synced at ``now`` + the delay (by `settle` then)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        with self._lock:
            full = len(self._held) >= self._room
            self._held.append((now if full else now + self.delay, fd))

    def settle(self, now: float | None) -> int:
        """Sync the seals due by ``now`` (None: all) that still have a name, then their directory;
        let go of those without one (at once, due or not: the sooner their pages are dropped, the
        surer the kernel never wrote them). The seals synced."""
        with self._lock:
            held, self._held = self._held, []
        kept: list[tuple[float, int]] = []
        synced = 0
        try:
            while held:
                due, fd = held.pop(0)
                if os.fstat(fd).st_nlink and (now is not None and due > now):
                    kept.append((due, fd))
                    continue
                try:
                    if os.fstat(fd).st_nlink:
                        os.fdatasync(fd)
                        synced += 1
                except BaseException:
                    kept.append((due, fd))  # tried again at the next settle
                    raise
                os.close(fd)
            if synced:
                os.fsync(self._directory_fd)
        finally:
            with self._lock:
                self._held[:0] = kept + held
        return synced

    def close(self) -> None:
        """Let go of every seal, synced or not (the store is closing after `settle(None)`)."""
        with self._lock:
            held, self._held = self._held, []
        for _, fd in held:
            os.close(fd)
