"""Streams a deterministic .tar.gz of virtual files, generated and compressed block by block."""

from __future__ import annotations

import functools
import posixpath
import struct
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from isal import isal_zlib

from archiver.fake.content import FileSpec, iter_file, normalise_path

#: Fixed mtime of every entry (2023-06-01T00:00:00Z, the interface's date): bytes never depend on "now".
MTIME = 1_685_577_600

#: Flush compressed output to the caller in pieces of about this size.
OUT_CHUNK = 64 * 1024

# gzip member header: magic, deflate, no flags, mtime 0, no extra flags, OS "unknown".
_GZIP_HEADER = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x00\xff"


@dataclass(frozen=True, slots=True)
class TarEntry:
    """One archive member: a directory (``spec`` None) or a file with its content spec."""

    arcname: str
    spec: FileSpec | None


def _header(entry: TarEntry) -> bytes:
    info = tarfile.TarInfo(entry.arcname)
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if entry.spec is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = entry.spec.size
        info.mode = 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def iter_tar(entries: Iterable[TarEntry], read: Callable[[FileSpec], Iterator[bytes]]) -> Iterator[bytes]:
    """The uncompressed tar stream: headers, file blocks, padding, end-of-archive marker."""
    written = 0
    for entry in entries:
        head = _header(entry)
        written += len(head)
        yield head
        if entry.spec is None:
            continue
        size = 0
        for block in read(entry.spec):
            size += len(block)
            yield block
        if size != entry.spec.size:  # a content generator bug would corrupt every later member
            raise RuntimeError(f"{entry.arcname}: generated {size} bytes, header says {entry.spec.size}")
        pad = -size % tarfile.BLOCKSIZE
        written += size + pad
        if pad:
            yield b"\0" * pad
    end = 2 * tarfile.BLOCKSIZE
    written += end
    # tarfile pads archives to a whole record; do the same so the bytes match what tools expect.
    yield b"\0" * (end + (-written % tarfile.RECORDSIZE))


def gzip_stream(chunks: Iterable[bytes], *, level: int) -> Iterator[bytes]:
    """One deterministic gzip member around ``chunks`` (mtime 0, no name), yielded incrementally."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc = 0
    size = 0
    pending: list[bytes] = [_GZIP_HEADER]
    pending_len = len(_GZIP_HEADER)
    for chunk in chunks:
        crc = isal_zlib.crc32(chunk, crc)  # the same CRC as zlib's, several times faster
        size += len(chunk)
        out = compressor.compress(chunk)
        if out:
            pending.append(out)
            pending_len += len(out)
        if pending_len >= OUT_CHUNK:
            yield b"".join(pending)
            pending, pending_len = [], 0
    pending.append(compressor.flush())
    pending.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
    yield b"".join(pending)


def iter_tar_gz(
    entries: Iterable[TarEntry], read: Callable[[FileSpec], Iterator[bytes]], *, level: int
) -> Iterator[bytes]:
    """A .tar.gz of ``entries`` whose bytes depend only on the entries and ``read``."""
    return gzip_stream(iter_tar(entries, read), level=level)


def entries_for(files: Mapping[str, FileSpec], path: str) -> list[TarEntry] | None:
    """Archive members for a requested container path (a file, or a folder with everything
    under it), named like ``docker cp``: relative to the path's parent. None if nothing is there."""
    norm = normalise_path(path)
    if norm is None:
        return None
    if norm in files:
        return [TarEntry(posixpath.basename(norm), files[norm])]
    prefix = norm if norm.endswith("/") else norm + "/"
    inside = sorted(p for p in files if p.startswith(prefix))
    if not inside:
        return None
    base = posixpath.basename(norm.rstrip("/"))
    root = f"{base}/" if base else ""

    def arcname(p: str) -> str:
        return root + p[len(prefix) :]

    dirs: set[str] = {root} if root else set()
    for p in inside:
        parts = p[len(prefix) :].split("/")[:-1]
        dirs.update(root + "/".join(parts[: i + 1]) + "/" for i in range(len(parts)))
    members = [TarEntry(d, None) for d in dirs] + [TarEntry(arcname(p), files[p]) for p in inside]
    return sorted(members, key=lambda e: e.arcname)


def compress_level(entries: Iterable[TarEntry]) -> int:
    """gzip level 1 for text, 0 (stored) once binary content is in: deflating incompressible bytes
    is many times slower than storing them, and the result is the same size."""
    binary = any(e.spec is not None and e.spec.kind == "binary" and e.spec.size for e in entries)
    return 0 if binary else 1


def artifact_stream(session_id: str, files: Mapping[str, FileSpec], path: str) -> Iterator[bytes] | None:
    """The ``/artifacts`` body for ``path`` in a session's files, or None if nothing is there."""
    entries = entries_for(files, path)
    if entries is None:
        return None
    return iter_tar_gz(entries, functools.partial(iter_file, session_id), level=compress_level(entries))
