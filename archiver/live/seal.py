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

from archiver.durable import fdatasync_file
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
    descriptor, as its spool hard link may be its only name left. Without a delay, or past the
    room the open-file limit leaves, a seal is synced as it is added. The caller makes the names
    durable (a directory fsync) before the rows that name the seals commit. Thread-safe: one lock
    around every change (a settle's syncs included); the count is read without it."""

    def __init__(self, delay: float, room: int) -> None:
        self.delay = delay
        #: Most seals held at once (`live.loop.seals_room`: open files); one more is synced at once.
        self._room = room
        self._lock = threading.Lock()
        #: (due, descriptor) in the order they were named.
        self._held: list[tuple[float, int]] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, path: Path, now: float) -> None:
        """``path``, just named: synced now without a delay or room, else held until ``now`` + the delay."""
        with self._lock:
            if self.delay <= 0 or len(self._held) >= self._room:
                fdatasync_file(path)
                return
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._held.append((now + self.delay, fd))
            self._count = len(self._held)

    def settle(self, now: float | None) -> int:
        """Sync the held seals due by ``now`` (None: all) that still have a name; let go of those
        without one at once, due or not (the sooner their pages are dropped, the surer the kernel
        never wrote them). A sync that fails lets its seal go too and raises: Linux reports a
        writeback error once per open file, so a second try on it would claim a success. The
        seals synced."""
        with self._lock:
            kept: list[tuple[float, int]] = []
            synced = 0
            try:
                for at, (due, fd) in enumerate(self._held):
                    try:
                        named = os.fstat(fd).st_nlink > 0
                        if named and now is not None and due > now:
                            kept.append((due, fd))
                            continue
                        if named:
                            os.fdatasync(fd)
                            synced += 1
                    except BaseException:
                        kept.extend(self._held[at + 1 :])
                        os.close(fd)
                        raise
                    os.close(fd)
            finally:
                self._held = kept
                self._count = len(kept)
        return synced

    def close(self) -> None:
        """Let go of every seal, synced or not (the store is closing after `settle(None)`)."""
        with self._lock:
            for _, fd in self._held:
                os.close(fd)
            self._held = []
            self._count = 0
