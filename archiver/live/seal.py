"""A finished segment's seal as a file: its lines as the stored log's gzip (`gzipstream.gzip_blocks`,
deterministic), written beside its name as ``.partial`` for the store to sync and name, and its
lines read back from it, or made into a lines file again."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
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
