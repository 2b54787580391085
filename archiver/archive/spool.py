"""The spool: durable files named by item id, where a fetched body waits for its upload.

A body goes to `spool/<item-id>.partial` while its sha256 is computed on the way, is fsynced,
renamed to `spool/<item-id>` and the directory fsynced; only then may the fetch commit `spooled`.
Logs are gzip-compressed on the way in (`gzip_blocks`: stored as received, just smaller);
artifacts are kept byte for byte. The fetch writes here, the upload stage and its committer
remove what is stored, and start-up recovery sweeps what no row refers to.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from isal import isal_zlib

from archiver.archive.crashpoints import crashpoint
from archiver.durable import fsync_dir
from archiver.errors import TooLargeError

#: ISA-L level 1: a small fraction of the CPU zlib's level 6 takes, for a stored log somewhat larger
#: (when thousands of sessions end at once, the CPU is the limit). The stored bytes therefore differ
#: from an older archiver's; replicas compare logs by their uncompressed content (`Uploader.upload`),
#: so that is no conflict.
GZIP_LEVEL = 1
#: The pieces logs are compressed in (see `gzip_blocks`).
DEFLATE_BLOCK = 64 * 1024
#: How many leading raw bytes are kept to sniff formats (gzip magic, a JSON opening brace).
_HEAD = 64


def gzip_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """One gzip member of `chunks` (mtime 0, no name), fed to ISA-L in blocks of `DEFLATE_BLOCK` bytes.

    ISA-L's output depends on how its input is cut (zlib's does not), and chunks arrive as the
    network cuts them: re-cut into fixed blocks, the same log always gives the same bytes (with the
    same ISA-L), so two fetches of it store one object, not a conflict to resolve.
    """
    compressor = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 31)  # 31: gzip
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        whole = len(pending) - len(pending) % DEFLATE_BLOCK
        if not whole:
            continue
        with memoryview(pending) as view:
            for start in range(0, whole, DEFLATE_BLOCK):
                data = compressor.compress(view[start : start + DEFLATE_BLOCK])
                if data:
                    yield data
        del pending[:whole]
    yield compressor.compress(pending) + compressor.flush()


@dataclass(frozen=True, slots=True)
class SpoolFile:
    """A body durable in the spool: its path, stored size and sha256, the bytes received, its first raw bytes."""

    path: Path
    size: int
    sha256: str
    received: int
    head: bytes


class Spool:
    """The spool directory: durable files named by item id."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def final_path(self, item_id: int | str) -> Path:
        return self.directory / str(item_id)

    def partial_path(self, item_id: int | str) -> Path:
        return self.directory / f"{item_id}.partial"

    def write(self, item_id: int | str, chunks: Iterator[bytes], *, compress: bool, limit: int | None) -> SpoolFile:
        """Stream `chunks` into the spool durably; TooLargeError past `limit` received bytes."""
        partial = self.partial_path(item_id)
        digest = hashlib.sha256()
        size = received = 0
        head = b""

        def raw() -> Iterator[bytes]:
            nonlocal received, head
            for chunk in chunks:
                received += len(chunk)
                if limit is not None and received > limit:
                    raise TooLargeError(f"body passed {limit} bytes while streaming")
                if len(head) < _HEAD:
                    head += chunk[: _HEAD - len(head)]
                yield chunk

        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                for data in gzip_blocks(raw()) if compress else raw():
                    digest.update(data)
                    out.write(data)
                    size += len(data)
                crashpoint("after_spool_write")
                out.flush()
                os.fsync(out.fileno())
            final = self.final_path(item_id)
            os.rename(partial, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            raise
        fsync_dir(self.directory)
        crashpoint("after_spool_rename")
        return SpoolFile(final, size, digest.hexdigest(), received, head)

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def sweep(self, keep: set[str]) -> int:
        """Delete `.partial` files and spool files no spooled item refers to (start-up only).

        `keep` holds file names (not paths): the state dir may be reached by another path after
        a restart.
        """
        removed = 0
        for entry in self.directory.iterdir():
            if entry.is_file() and entry.name not in keep:
                entry.unlink()
                removed += 1
        if removed:
            fsync_dir(self.directory)
        return removed
