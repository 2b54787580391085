"""The spool: durable files named by item id, where a fetched body waits for its upload.

A body goes to `spool/<item-id>.partial` while its sha256 is computed on the way, is fsynced and
renamed to `spool/<item-id>`; the directory is fsynced once for a batch of them (`sync`), and only
then may the fetch commit their `spooled`.
Logs are gzip-compressed on the way in (`gzipstream.gzip_blocks`: stored as received, just
smaller); artifacts are kept byte for byte. A live capture's seal (`live.store`: already the
stored log's gzip, synced, or synced by the capture store when its delay is up if a name is left)
is adopted by a hard link instead of a copy. The fetch writes
here, the upload stage and its committer remove what is stored, and start-up recovery sweeps what
no row refers to.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.durable import fdatasync_file, fsync_dir
from archiver.errors import TooLargeError
from archiver.store.gzipstream import gzip_blocks

#: How many leading raw bytes are kept to sniff formats (gzip magic, a JSON opening brace).
_HEAD = 64


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
        self._lock = threading.Lock()
        #: Moves with every file named in the directory; `sync` makes all up to a generation durable.
        self._generation = 0
        self._synced = 0

    def _named(self) -> None:
        with self._lock:
            self._generation += 1

    def sync(self) -> None:
        """Make the names of every spool file written or adopted so far durable: one directory
        fsync for a batch of them, before the commit that records them (issue 35: a directory
        fsync writes its block, and the next name dirties it again)."""
        with self._lock:
            target = self._generation
            if self._synced >= target:
                return
        fsync_dir(self.directory)
        with self._lock:
            self._synced = max(self._synced, target)

    def final_path(self, item_id: int | str) -> Path:
        return self.directory / str(item_id)

    def partial_path(self, item_id: int | str) -> Path:
        return self.directory / f"{item_id}.partial"

    def write(self, item_id: int | str, chunks: Iterator[bytes], *, compress: bool, limit: int | None) -> SpoolFile:
        """Stream `chunks` into the spool, its data durable (its name once `sync` ran); TooLargeError
        past `limit` received bytes."""
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
        self._named()
        crashpoint("after_spool_rename")
        return SpoolFile(final, size, digest.hexdigest(), received, head)

    def adopt(self, item_id: int | str, source: Path, *, size: int, sha256: str, received: int) -> SpoolFile:
        """``source`` (a seal of ``size`` bytes whose SHA-256 is ``sha256``) as the spool file
        of ``item_id``: hard-linked, so nothing is copied or synced (its name once `sync` ran); copied
        where the spool is on another filesystem. FileNotFoundError when ``source`` is gone."""
        final = self.final_path(item_id)
        partial = self.partial_path(item_id)
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        try:
            os.link(source, partial)
        except FileNotFoundError:
            raise
        except OSError:  # another filesystem (EXDEV), or one without hard links
            with source.open("rb") as f:
                copied = self.write(item_id, iter(lambda: f.read(1024 * 1024), b""), compress=False, limit=None)
            return SpoolFile(copied.path, copied.size, copied.sha256, received, b"")
        os.rename(partial, final)
        self._named()
        crashpoint("after_spool_rename")
        return SpoolFile(final, size, sha256, received, b"")

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def sweep(self, keep: set[str], *, sync_kept: bool = False) -> int:
        """Delete `.partial` files and spool files no spooled item refers to (start-up only); with
        ``sync_kept``, sync the others: seals adopted while waiting for their delayed sync
        (`live.seal.Unsynced`) that a `kill -9` left so.

        `keep` holds file names (not paths): the state dir may be reached by another path after
        a restart.
        """
        removed = 0
        for entry in self.directory.iterdir():
            if entry.is_file() and entry.name not in keep:
                entry.unlink()
                removed += 1
            elif sync_kept and entry.is_file():
                fdatasync_file(entry)
        if removed:
            fsync_dir(self.directory)
        return removed
