"""The directory object store: durable, atomic create-once files (O_EXCL temp, fsync, hard link)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Set
from pathlib import Path
from typing import BinaryIO

from archiver.config.evidence import NO_EVIDENCE
from archiver.durable import fsync_dir
from archiver.errors import (
    ObjectConflictError,
    ObjectNotFoundError,
    SourceFileError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    StoreUnsupportedError,
)
from archiver.store.base import (
    READ_CHUNK,
    MultipartJournal,
    ObjectInfo,
    PutOutcome,
    RequestCounter,
    hash_file,
    open_source,
    validate_key,
    validate_prefix,
)

log = logging.getLogger(__name__)

#: Directory (inside the store root, so on the same filesystem) holding files being written.
PARTIAL_DIR = ".partial"
#: A key segment is a file name: 255 bytes is the usual limit; keep room for tools' suffixes.
MAX_SEGMENT_BYTES = 200
#: Extended attributes carrying what S3 keeps as object metadata (best effort: not every
#: filesystem has user xattrs; ``head`` then reports sha256 None).
XATTR_SHA256 = "user.archiver.sha256"
XATTR_CONTENT_TYPE = "user.archiver.content_type"

_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EIO,
        errno.EAGAIN,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ESTALE,
        errno.ENOMEM,
    }
)


class FileStore:
    """A local directory as an ObjectStore (the archive layout as plain files under ``root``).

    Writing a key: the bytes go to ``{root}/.partial/<random>.partial`` opened with
    ``O_CREAT|O_EXCL`` (never someone else's file), are verified against the declared sha256 and
    size, ``fsync``-ed, then ``os.link``-ed to the final name and the final directory is fsynced.
    ``link`` fails with EEXIST when the name exists, so create-once is atomic even between
    processes; ``rename`` would silently replace an existing file, and an O_EXCL check before a
    rename leaves a window in which two writers both pass the check. Readers never see a partial
    file under a key. Temp files live in one directory (same filesystem, so links work) so that
    leftovers of a crash are found without walking the archive: :meth:`abort_orphaned_uploads`
    removes them.
    """

    def __init__(self, root: Path, *, partial_max_age: float = 600.0) -> None:
        self.root = root
        self.url = root.as_uri()
        self.prefix = ""
        self.conditional_writes = True  # link() is create-once on every POSIX filesystem
        self.metadata_supported = True
        self.keeps_checksums = False  # see store_checksum
        self.evidence = NO_EVIDENCE  # encryption, tags, retention: the filesystem's business
        self.requests_made = RequestCounter()
        self._partial_dir = root / PARTIAL_DIR
        self._partial_max_age = partial_max_age

    # --- plumbing -----------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key, max_segment_bytes=MAX_SEGMENT_BYTES)

    def _os_error(self, exc: OSError, action: str, key: str) -> StoreError:
        reason = f"{errno.errorcode.get(exc.errno or 0, 'E?')} {exc.strerror or exc}"
        message = f"file store {self.url}: {action} {key!r} failed: {reason}"
        if exc.errno in _PERMISSION_ERRNOS:
            return StorePermissionError(message)
        if exc.errno in _TRANSIENT_ERRNOS:
            return StoreUnavailableError(message)
        return StoreError(message)

    def _ensure_dir(self, directory: Path) -> None:
        """Create missing directories below the root, fsyncing each new entry's parent."""
        if directory.is_dir():
            return
        if directory == self.root or self.root not in directory.parents:
            raise StoreUnavailableError(f"file store root {self.root} is missing (unmounted?)")
        self._ensure_dir(directory.parent)
        try:
            directory.mkdir()
        except FileExistsError:
            return  # a concurrent writer made it
        fsync_dir(directory.parent)

    def _create_partial(self, final: Path) -> tuple[Path, int]:
        """A new temp file for the object at ``final`` (its directory made first), opened O_EXCL."""
        self._ensure_dir(final.parent)
        self._ensure_dir(self._partial_dir)
        tmp = self._partial_dir / f"{uuid.uuid4().hex}.partial"
        return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    # --- reads --------------------------------------------------------------------------------

    def set_legal_hold(self, key: str, on: bool) -> None:
        """StoreUnsupportedError: a directory has no legal holds (use the filesystem's own immutability)."""
        raise StoreUnsupportedError(f"{self.url} is a directory: legal holds need an S3 bucket with Object Lock")

    def store_checksum(self, key: str, *, sha256: str, size: int) -> str | None:
        """None: a directory verifies nothing on arrival and its sha256 xattr is our own word, so
        proving integrity here means reading the bytes (`archiver verify` re-hashes them)."""
        return None

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        self.requests_made.add("HeadObject")
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._os_error(exc, "stat", key) from exc
        if not path.is_file():
            return None
        return ObjectInfo(
            key=key,
            size=st.st_size,
            sha256=_get_xattr(path, XATTR_SHA256),
            content_type=_get_xattr(path, XATTR_CONTENT_TYPE),
        )

    def iter_bytes(self, key: str, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        return self._stream(self._open_object(key), key, chunk_size)

    def iter_range(self, key: str, first: int, last: int, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        return self._stream(self._open_object(key), key, chunk_size, first=first, length=last - first + 1)

    def _open_object(self, key: str) -> BinaryIO:
        """The object's file, opened for a read (counted as one GetObject)."""
        path = self._path(key)
        self.requests_made.add("GetObject")
        try:
            return path.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise self._os_error(exc, "open", key) from exc

    def _stream(
        self, f: BinaryIO, key: str, chunk_size: int, *, first: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        try:
            if first:
                f.seek(first)
            # Never ask for more than the file holds: a read of `chunk_size` allocates that much
            # (1 MiB, mapped and unmapped) for a 6 KB index entry, which compaction does 30,000 times.
            size = os.fstat(f.fileno()).st_size - first
            left = size if length is None else min(length, size)
            while left > 0:
                chunk = f.read(min(chunk_size, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk
        except OSError as exc:
            raise self._os_error(exc, "read", key) from exc
        finally:
            f.close()

    def list_keys(self, prefix: str, *, start_after: str = "") -> Iterator[str]:
        """Keys under ``prefix`` (after ``start_after``) in the lexicographic order S3 uses; hidden
        entries and symlinks skipped."""
        validate_prefix(prefix)
        self.requests_made.add("ListObjectsV2")
        return self._walk(prefix[: prefix.rfind("/") + 1], prefix, start_after)

    def _walk(self, rel_dir: str, prefix: str, start_after: str = "") -> Iterator[str]:
        try:
            with os.scandir(self.root / rel_dir if rel_dir else self.root) as it:
                entries = []
                for entry in it:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        # "name/" sorts the directory's keys exactly where S3 would list them.
                        entries.append((entry.name + "/", True))
                    elif entry.is_file(follow_symlinks=False):
                        entries.append((entry.name, False))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._os_error(exc, "list", rel_dir or "/") from exc
        for name, is_dir in sorted(entries):
            rel = rel_dir + name
            if is_dir:
                # A directory sorting before start_after (and not leading to it) holds only earlier keys.
                skipped = rel < start_after and not start_after.startswith(rel)
                if (rel.startswith(prefix) or prefix.startswith(rel)) and not skipped:
                    yield from self._walk(rel, prefix, start_after)
            elif rel.startswith(prefix) and rel > start_after:
                yield rel

    # --- create-once writes -------------------------------------------------------------------

    def _resolve_existing(self, key: str, final: Path, sha256: str, size: int) -> PutOutcome:
        self.requests_made.add("HeadObject")
        try:
            stored_sha, stored_size = hash_file(final)
        except OSError as exc:
            raise self._os_error(exc, "read back", key) from exc
        if stored_size != size:
            raise ObjectConflictError(key, detail=f"stored size {stored_size}, ours {size}")
        if stored_sha != sha256:
            raise ObjectConflictError(key, detail=f"stored sha256 {stored_sha[:16]}…, ours {sha256[:16]}…")
        return PutOutcome.ALREADY_PRESENT

    def _write_new(
        self, key: str, chunks: Iterable[bytes], sha256: str, size: int, content_type: str, source: str
    ) -> PutOutcome:
        final = self._path(key)
        if final.exists():
            return self._resolve_existing(key, final, sha256, size)
        self.requests_made.add("PutObject")
        try:
            tmp, fd = self._create_partial(final)
        except OSError as exc:
            raise self._os_error(exc, "create", key) from exc
        try:
            digest = hashlib.sha256()
            total = 0
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in chunks:
                        digest.update(chunk)
                        total += len(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            except SourceFileError:
                raise
            except OSError as exc:
                raise self._os_error(exc, "write", key) from exc
            if total != size or digest.hexdigest() != sha256:
                raise SourceFileError(
                    f"{source} has {total} bytes with sha256 {digest.hexdigest()[:16]}…, "
                    f"expected {size} bytes with sha256 {sha256[:16]}…"
                )
            if _set_xattr(tmp, XATTR_SHA256, sha256):
                _set_xattr(tmp, XATTR_CONTENT_TYPE, content_type)
            try:
                os.link(tmp, final)
            except FileExistsError:
                return self._resolve_existing(key, final, sha256, size)
            except OSError as exc:
                if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise StorePermissionError(
                        f"file store {self.url}: the filesystem refuses hard links, which atomic "
                        f"create-once writes need ({exc.strerror})"
                    ) from exc
                raise self._os_error(exc, "link", key) from exc
            try:
                fsync_dir(final.parent)
            except OSError as exc:
                raise self._os_error(exc, "fsync directory of", key) from exc
            return PutOutcome.CREATED
        finally:
            # A leftover (unlink failed or we crashed) is removed by abort_orphaned_uploads.
            with contextlib.suppress(OSError):
                tmp.unlink()

    def replace_bytes(self, key: str, data: bytes, *, content_type: str) -> None:
        """Write a temp file, fsync, ``rename`` over the key (atomic replace), fsync the directory."""
        final = self._path(key)
        self.requests_made.add("PutObject")
        try:
            tmp, fd = self._create_partial(final)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            if _set_xattr(tmp, XATTR_SHA256, hashlib.sha256(data).hexdigest()):
                _set_xattr(tmp, XATTR_CONTENT_TYPE, content_type)
            os.replace(tmp, final)
            fsync_dir(final.parent)
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                tmp.unlink()
            raise self._os_error(exc, "replace", key) from exc

    def put_bytes(self, key: str, data: bytes, *, content_type: str) -> PutOutcome:
        return self._write_new(key, (data,), hashlib.sha256(data).hexdigest(), len(data), content_type, source="data")

    def put_file(
        self,
        key: str,
        path: Path,
        *,
        sha256: str,
        size: int,
        content_type: str,
        journal: MultipartJournal | None = None,
    ) -> PutOutcome:
        """Copy a local file in chunks (memory bounded); ``journal`` is unused (a copy restarts cheaply)."""
        self._path(key)
        with open_source(path, sha256) as source:

            def chunks() -> Iterator[bytes]:
                while True:
                    try:
                        chunk = source.read(READ_CHUNK)
                    except OSError as exc:
                        raise SourceFileError(f"cannot read local file {path}: {exc.strerror}") from exc
                    if not chunk:
                        return
                    yield chunk

            return self._write_new(key, chunks(), sha256, size, content_type, source=f"local file {path}")

    def _delete_probe(self, key: str) -> None:
        """Remove a probe object (the one exception to create-once)."""
        self._path(key).unlink(missing_ok=True)

    # --- maintenance --------------------------------------------------------------------------

    def probe_conditional_writes(self) -> bool:
        """Two create-once writes of ``_probe/<random>``: the second must be refused (it always is).

        Really writes, so it doubles as the writability check of ``archiver check``
        (StorePermissionError / StoreUnavailableError when the directory refuses). Also notes
        whether the filesystem keeps the sha256 xattr. The probe file is deleted afterwards:
        probe keys are the one exception to create-once.
        """
        key = f"_probe/{uuid.uuid4().hex}"
        first, second = b"archiver probe: first write\n", b"archiver probe: second write\n"
        try:
            self.put_bytes(key, first, content_type="text/plain")
            try:
                self.put_bytes(key, second, content_type="text/plain")
                enforced = False
            except ObjectConflictError:
                enforced = True
            info = self.head(key)
            self.metadata_supported = info is not None and info.sha256 is not None
        finally:
            try:
                self._delete_probe(key)
            except OSError as exc:
                log.warning("could not delete store probe file %s: %s", key, exc)
        # Probe files an earlier probe left behind (the process was killed before deleting).
        try:
            for leftover in list(self.list_keys("_probe/")):
                self._delete_probe(leftover)
        except (OSError, StoreError) as exc:
            log.warning("could not delete leftover store probe files: %s", exc)
        self.conditional_writes = enforced
        return enforced

    def distrust(self) -> None:
        """Writes check first until the probe has seen ``link()`` refuse a second write."""
        self.conditional_writes = False

    def abort_orphaned_uploads(self, prefix: str, keep: Set[str], *, initiated_before: float | None = None) -> int:
        """Remove ``.partial`` temp files older than ``partial_max_age`` (crash leftovers); how many.

        The file store has no multipart uploads, so ``prefix``, ``keep`` and ``initiated_before``
        do not apply (the age guard plays the part of the last): temp
        files live in one directory for the whole store. The age guard spares a write in flight
        in another process (e.g. ``archiver check`` next to the daemon).
        """
        validate_prefix(prefix)
        removed = 0
        cutoff = time.time() - self._partial_max_age
        try:
            entries = list(os.scandir(self._partial_dir))
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise self._os_error(exc, "list", PARTIAL_DIR) from exc
        for entry in entries:
            try:
                if entry.name.endswith(".partial") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._os_error(exc, "remove", f"{PARTIAL_DIR}/{entry.name}") from exc
        return removed

    def close(self) -> None:
        """Nothing to release."""


def _get_xattr(path: Path, name: str) -> str | None:
    try:
        return os.getxattr(path, name).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _set_xattr(path: Path, name: str, value: str) -> bool:
    try:
        os.setxattr(path, name, value.encode("utf-8"))
    except OSError:
        return False
    return True
