"""What every object store offers (ObjectStore protocol), the multipart journal protocol, shared helpers."""

from __future__ import annotations

import base64
import enum
import hashlib
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from archiver.config.evidence import Evidence
from archiver.errors import InvalidKeyError, SourceFileError
from archiver.layout.manifest import is_sha256

#: Files below this size are sent with one create-once PUT; larger ones as a multipart upload.
DEFAULT_MULTIPART_THRESHOLD = 8 * 1024 * 1024
#: Multipart part size. S3's own minimum is 5 MiB. 6 MiB parts, 3 in flight, sent a 100 MiB file
#: ~13 % faster than 8 MiB parts, 2 in flight, in the same memory (SeaweedFS, issue 14, 2026-11-24).
DEFAULT_PART_SIZE = 6 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024
#: Parts of one file in flight at once (upload workers add parallelism across files). Memory per
#: multipart upload is about (concurrency + 1) parts: one buffer each, and one being read.
DEFAULT_PART_CONCURRENCY = 3
#: S3 allows at most this many parts; the part size grows for larger files.
MAX_PARTS = 10_000
#: Chunk size for streamed reads and local copies.
READ_CHUNK = 1024 * 1024
#: S3's limit on key length (UTF-8 bytes).
MAX_KEY_BYTES = 1024


class PutOutcome(enum.Enum):
    """How a create-once write ended; both are success."""

    CREATED = "created"
    #: The identical object (same sha256 and size) was already there: an earlier attempt of ours
    #: whose answer was lost, or a resumed pipeline. Idempotent success, nothing was overwritten.
    ALREADY_PRESENT = "already_present"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a HEAD tells about a stored object."""

    key: str
    size: int
    #: From the object's own metadata (S3 ``x-amz-meta-sha256``, a file's xattr); None when the
    #: store dropped or never had it.
    sha256: str | None
    content_type: str | None = None
    #: The store's own additional checksum (S3 ``x-amz-checksum-sha256``: base64 of the sha256 for a
    #: single PUT, ``base64(sha256(part digests))-N`` for a multipart upload); None when it keeps none.
    checksum_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A multipart upload in progress, as the journal remembers it."""

    upload_id: str
    #: sha256 of the whole file the upload was started for; a different file never resumes it.
    sha256: str
    part_size: int
    #: Completed parts: part number → ETag as answered by UploadPart.
    parts: Mapping[int, str] = field(default_factory=dict)


class MultipartJournal(Protocol):
    """Durable memory of multipart uploads so ``put_file`` can resume after a crash.

    The state DB implements it (one row per key plus one per part); every method must be durable
    (committed) when it returns. Calls for one key come from one thread at a time.
    """

    def get(self, key: str) -> JournalEntry | None:
        """The upload in progress for ``key``, if any."""
        ...

    def start(self, key: str, upload_id: str, *, sha256: str, part_size: int) -> None:
        """A multipart upload was created for ``key`` (replaces any earlier entry for it)."""
        ...

    def part_done(self, key: str, number: int, etag: str) -> None:
        """Part ``number`` of ``key``'s upload is stored with this ETag."""
        ...

    def finish(self, key: str) -> None:
        """Forget ``key``'s upload (completed or aborted)."""
        ...


class MemoryJournal:
    """A non-durable MultipartJournal (tests, one-shot commands): resumes within one process only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, JournalEntry] = {}

    def get(self, key: str) -> JournalEntry | None:
        with self._lock:
            entry = self._entries.get(key)
            return (
                None
                if entry is None
                else JournalEntry(entry.upload_id, entry.sha256, entry.part_size, dict(entry.parts))
            )

    def start(self, key: str, upload_id: str, *, sha256: str, part_size: int) -> None:
        with self._lock:
            self._entries[key] = JournalEntry(upload_id, sha256, part_size, {})

    def part_done(self, key: str, number: int, etag: str) -> None:
        with self._lock:
            entry = self._entries[key]
            self._entries[key] = JournalEntry(
                entry.upload_id, entry.sha256, entry.part_size, {**entry.parts, number: etag}
            )

    def finish(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def upload_ids(self) -> set[str]:
        """Upload ids in progress (what ``abort_orphaned_uploads`` must keep)."""
        with self._lock:
            return {e.upload_id for e in self._entries.values()}


class RequestCounter:
    """Thread-safe count of store requests per operation (S3 API names, also used by the file store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, operation: str) -> None:
        with self._lock:
            self._counts[operation] += 1

    def __getitem__(self, operation: str) -> int:
        with self._lock:
            return self._counts[operation]

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


class ObjectStore(Protocol):
    """A bucket prefix or a directory holding the archive; every write is create-once.

    Keys are full keys built with :mod:`archiver.layout.keys` from :attr:`prefix`. Methods are blocking
    (callers run them in worker threads) and raise :class:`~archiver.errors.StoreError`
    subclasses: ``StoreUnavailableError`` (transient: pause, retry), ``StorePermissionError``
    (alert), ``ObjectConflictError``, ``ObjectNotFoundError``, ``InvalidKeyError``,
    ``SourceFileError``.
    """

    #: The store's URL for messages (never credentials).
    url: str
    #: Key prefix of this archive: ``""`` or ending with ``/``.
    prefix: str
    #: False once the probe found that the server ignores ``If-None-Match``; writes then
    #: HEAD before PUT (the metrics layer exports it).
    conditional_writes: bool
    #: False once the probe found that the server drops user metadata (sha256 then comes from
    #: re-reading the object).
    metadata_supported: bool
    #: True when the store verifies a SHA-256 checksum on arrival and keeps it (``store_checksum``),
    #: so `archiver verify` can prove an object without reading it.
    keeps_checksums: bool
    #: Encryption, storage class, tags and retention applied to every write (recorded in manifests).
    evidence: Evidence
    requests_made: RequestCounter

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
        """Store a local file at ``key`` unless present; verifies the file against ``sha256``/``size``."""
        ...

    def put_bytes(self, key: str, data: bytes, *, content_type: str) -> PutOutcome:
        """Store small bytes (manifest, index entry) at ``key`` unless present."""
        ...

    def replace_bytes(self, key: str, data: bytes, *, content_type: str) -> None:
        """Store small bytes at ``key``, replacing what is there: the ONE exception to create-once,
        used only for a transparency log's checkpoint (``archiver/tlog``), whose history the log's
        consistency proofs protect instead. Atomic: a reader sees the old or the new bytes."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """What is stored at ``key``, or None."""
        ...

    def store_checksum(self, key: str, *, sha256: str, size: int) -> str | None:
        """The checksum the store itself verified on arrival and keeps for the object ``put_file``
        stored at ``key`` (what the manifest records for a verify without download), or None when
        this store keeps none (a directory, a server that rejects checksum headers)."""
        ...

    def set_legal_hold(self, key: str, on: bool) -> None:
        """Place or clear a legal hold on the object (StoreUnsupportedError where there are none)."""
        ...

    def iter_bytes(self, key: str, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        """The object's bytes, streamed; ``ObjectNotFoundError`` at once when absent."""
        ...

    def iter_range(self, key: str, first: int, last: int, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        """The object's bytes ``first..last`` (inclusive, within its size), streamed: a ranged GET or a
        seek, never a read of the whole object; ``ObjectNotFoundError`` at once when absent."""
        ...

    def list_keys(self, prefix: str, *, start_after: str = "") -> Iterator[str]:
        """Every key starting with ``prefix`` (and greater than ``start_after``, when given: S3's
        ``StartAfter``), in lexicographic order, paginated lazily."""
        ...

    def probe_conditional_writes(self) -> bool:
        """Whether create-once writes are enforced by the server; switches to HEAD-before-PUT if not."""
        ...

    def distrust(self) -> None:
        """Rely on no guarantee of the server (HEAD-before-PUT, no store checksum recorded) until
        `probe_conditional_writes` has seen it: what the daemon and `archiver archive` start with."""
        ...

    def abort_orphaned_uploads(self, prefix: str, keep: Set[str], *, initiated_before: float | None = None) -> int:
        """Abort incomplete uploads under ``prefix`` whose upload id is not in ``keep`` (and that were
        started before ``initiated_before``, epoch seconds, when given); how many."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def validate_key(key: str, *, max_segment_bytes: int | None = None) -> str:
    """The key itself if it cannot escape its prefix or directory; ``InvalidKeyError`` otherwise.

    Refused: empty, longer than 1024 UTF-8 bytes, leading or trailing ``/``, empty, ``.``, ``..``
    or dot-leading segments (hidden files, the file store's own ``.partial`` directory), control
    characters and backslashes, and (for file stores) segments longer than ``max_segment_bytes``.
    """
    if not key:
        raise InvalidKeyError("object key must not be empty")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKeyError(f"object key is not valid unicode: {key[:80]!r}") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"object key longer than {MAX_KEY_BYTES} bytes: {key[:80]!r}…")
    if any(ord(c) < 0x20 or c in "\x7f\\" for c in key):
        raise InvalidKeyError(f"object key contains control characters or a backslash: {key[:80]!r}")
    for segment in key.split("/"):
        if not segment or segment.startswith("."):
            raise InvalidKeyError(f"object key has an empty, '.', '..' or hidden segment: {key[:80]!r}")
        if max_segment_bytes is not None and len(segment.encode("utf-8")) > max_segment_bytes:
            raise InvalidKeyError(f"object key segment longer than {max_segment_bytes} bytes: {key[:80]!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: ``""`` or the head of a valid key (the same rules, may end with ``/``)."""
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def check_sha256(sha256: str) -> str:
    """The digest itself if it is 64 lowercase hex digits; ``ValueError`` otherwise (a caller bug)."""
    if not is_sha256(sha256):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256[:80]!r}")
    return sha256


def open_source(path: Path, sha256: str) -> BinaryIO:
    """The local file a ``put_file`` stores, opened for reading, once its declared ``sha256`` is
    well-formed (``ValueError``: a caller bug); ``SourceFileError`` when the file cannot be opened."""
    check_sha256(sha256)
    try:
        return path.open("rb")
    except OSError as exc:
        raise SourceFileError(f"cannot open local file {path}: {exc.strerror}") from exc


def sha256_checksum(digest: bytes) -> str:
    """S3's form of a sha256 digest (``x-amz-checksum-sha256``): base64 of the 32 bytes."""
    return base64.b64encode(digest).decode("ascii")


def composite_checksum(part_digests: list[bytes]) -> str:
    """S3's checksum of a multipart object: ``base64(sha256(concatenated part digests))-N``."""
    return f"{sha256_checksum(hashlib.sha256(b''.join(part_digests)).digest())}-{len(part_digests)}"


def hash_file(path: Path, *, chunk_size: int = READ_CHUNK) -> tuple[str, int]:
    """sha256 hex and size of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
