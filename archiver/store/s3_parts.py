"""One multipart upload part's bytes: read from its file in large blocks and hashed while still in
the CPU cache, held in buffers reused from part to part, and sent as a rewindable body without a
copy; and the check that the file read is the one its caller recorded."""

from __future__ import annotations

import io
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, BinaryIO, cast

from archiver.errors import SourceFileError

#: Bytes read (and hashed while still in the CPU cache) at a time when a part is read from its file.
READ_BLOCK = 1024 * 1024
#: Bytes a part body hands the HTTP connection per read: urllib3 asks for 16 KiB at a time, which
#: costs a copy and a send() system call per 16 KiB on our side and more wake-ups on the server's.
SEND_BLOCK = 1024 * 1024


class PartBody:
    """One part's bytes as the file-like body botocore sends: read in large blocks without a copy
    (memoryview slices of the part buffer), and rewindable (botocore seeks to 0 before a retry)."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._pos = 0

    def __len__(self) -> int:
        return len(self._data)

    def read(self, size: int | None = -1) -> bytes | memoryview:
        """Up to max(size, SEND_BLOCK) bytes (all that is left for a negative size); b"" at the end."""
        left = len(self._data) - self._pos
        if left <= 0:
            return b""
        count = left if size is None or size < 0 else min(left, max(size, SEND_BLOCK))
        block = self._data[self._pos : self._pos + count]
        self._pos += count
        return block

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._data)}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


class PartBuffers:
    """At most ``count`` reusable part buffers: one is read into while the others are sent; a
    buffer lent to a part's upload comes back once that upload is done (its body is never read
    again then), so an upload allocates them once instead of once per part."""

    def __init__(self, size: int, count: int) -> None:
        self._size = size
        self._count = count
        self._free: list[memoryview] = []
        self._lent: list[tuple[memoryview, Future[dict[str, Any]]]] = []
        self._made = 0

    def take(self) -> memoryview:
        for entry in [e for e in self._lent if e[1].done()]:
            self._lent.remove(entry)
            self._free.append(entry[0])
        if self._free:
            return self._free.pop()
        if self._made < self._count:
            self._made += 1
            return memoryview(bytearray(self._size))
        # Every buffer is in flight (the caller sends at most count - 1 parts at once, so this
        # is only a safeguard): wait for one.
        wait([future for _, future in self._lent], return_when=FIRST_COMPLETED)
        return self.take()

    def lend(self, view: memoryview, future: Future[dict[str, Any]]) -> None:
        self._lent.append((_whole(view), future))

    def give_back(self, view: memoryview) -> None:
        self._free.append(_whole(view))


def _whole(view: memoryview) -> memoryview:
    """The whole buffer ``view`` is a slice of."""
    return memoryview(view.obj)


def read_hashed(source: BinaryIO, path: Path, view: memoryview, hashers: tuple[Any, ...]) -> int:
    """Fill ``view`` from ``source`` (fewer bytes only at the end of the file), each block fed to
    every hasher while it is still in the CPU cache; the byte count. SourceFileError when unreadable."""
    readinto = cast(io.BufferedIOBase, source).readinto  # a file opened "rb" (typing.BinaryIO omits it)
    got = 0
    while got < len(view):
        block = view[got : got + READ_BLOCK]
        try:
            n = readinto(block)
        except OSError as exc:
            raise SourceFileError(f"cannot read local file {path}: {exc.strerror}") from exc
        if not n:
            break
        for hasher in hashers:
            hasher.update(block[:n])
        got += n
    return got


def check_size(path: Path, got_size: int, size: int) -> None:
    """The local file has the size the caller recorded, or SourceFileError."""
    if got_size != size:
        raise SourceFileError(f"local file {path} has {'more' if got_size > size else got_size} bytes, expected {size}")


def check_source(path: Path, got_sha: str, got_size: int, sha256: str, size: int) -> None:
    """The local file is the bytes the caller recorded, or SourceFileError (it can never be stored)."""
    check_size(path, got_size, size)
    if got_sha != sha256:
        raise SourceFileError(f"local file {path} has sha256 {got_sha[:16]}…, expected {sha256[:16]}…")
