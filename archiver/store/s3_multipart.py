"""Resumable, create-once multipart uploads to S3: part size, resume from the journal, parallel
parts, completion and the sweep of orphaned uploads (the multipart half of `S3Store`)."""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Set
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO

from archiver.config.evidence import Evidence
from archiver.errors import SourceFileError, StoreError, StoreUnavailableError
from archiver.store.base import (
    MAX_PARTS,
    JournalEntry,
    MultipartJournal,
    ObjectInfo,
    PutOutcome,
    sha256_checksum,
    validate_prefix,
)
from archiver.store.s3_parts import PartBody, PartBuffers, check_source, read_hashed

log = logging.getLogger("archiver.store.s3")  # one logger for the S3 store, as before the split

_MIB = 1024 * 1024
#: Per-part checksum fields UploadPart / ListParts may answer and CompleteMultipartUpload wants back.
_PART_CHECKSUM_FIELDS = (
    "ChecksumCRC32",
    "ChecksumCRC32C",
    "ChecksumSHA1",
    "ChecksumSHA256",
    "ChecksumCRC64NVME",
)


def same_etag(a: str, b: str) -> bool:
    """Whether two ETags name the same bytes: servers answer them quoted or not, in either case
    (in the headers of one call and the XML of another, even), pure."""
    return a.strip().strip('"').lower() == b.strip().strip('"').lower()


class PreconditionFailedError(StoreError):
    """412: a create-once write met an existing object (internal: resolved by comparing sha256).
    Also raised with ``info`` when the HEAD before a fresh multipart upload found one."""

    def __init__(self, message: str, info: ObjectInfo | None = None) -> None:
        super().__init__(message)
        self.info = info


class ChecksumMismatchError(StoreUnavailableError):
    """400 BadDigest (or MinIO's XAmzContentChecksumMismatch): the body that arrived does not match
    the checksum sent with it (internal). Damage on the way is transient; a source file that is not
    what its caller recorded is told apart by `S3Store.put_file`."""


class NoSuchUploadError(StoreError):
    """The multipart upload id is unknown: completed (answer lost) or aborted (internal)."""


class CompletionRefusedError(StoreError):
    """400 InvalidRequest/InvalidPart/InvalidPartOrder to CompleteMultipartUpload (internal): the
    server will not assemble these parts; SeaweedFS answers so for an upload resumed after a crash."""


#: Error codes of a CompleteMultipartUpload that refuses the parts (translated to CompletionRefusedError).
COMPLETION_REFUSED_CODES = frozenset({"InvalidRequest", "InvalidPart", "InvalidPartOrder"})


class _StartAfresh(StoreError):
    """A resumed upload cannot be completed (refused, or gone without an object) and is forgotten:
    the caller starts one fresh multipart upload instead (internal)."""


class CompletedChecksums:
    """The composite SHA-256 checksum each recent CompleteMultipartUpload answered with, by (key,
    sha256, size): `S3Store.store_checksum` takes it from here instead of a HEAD of the object it
    just created (the manifest follows within moments). Bounded; shared by the upload workers."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checksums: OrderedDict[tuple[str, str, int], str] = OrderedDict()

    def remember(self, key: str, sha256: str, size: int, checksum: str) -> None:
        with self._lock:
            self._checksums[(key, sha256, size)] = checksum
            while len(self._checksums) > self.LIMIT:
                self._checksums.popitem(last=False)

    def get(self, key: str, sha256: str, size: int) -> str | None:
        with self._lock:
            return self._checksums.get((key, sha256, size))


class _Opening:
    """The multipart upload a `put_file` sends its parts to: a fresh one is opened in a pool
    thread (HEAD, then CreateMultipartUpload) while the caller reads and hashes the first part,
    and journaled from the caller's thread when its id is first asked for."""

    def __init__(self, future: Future[str | ObjectInfo], journal_start: Callable[[str], None] | None) -> None:
        self._future = future
        self._journal_start = journal_start

    @classmethod
    def of(cls, upload_id: str) -> _Opening:
        """An upload already open (resumed from the journal)."""
        future: Future[str | ObjectInfo] = Future()
        future.set_result(upload_id)
        return cls(future, None)

    def upload_id(self) -> str:
        """The upload id (waits for the opening); PreconditionFailedError with the HEAD's answer
        when the HEAD found an object at the key."""
        opened = self._future.result()
        if isinstance(opened, ObjectInfo):
            raise PreconditionFailedError(f"{opened.key} exists", opened)
        if self._journal_start is not None:
            start, self._journal_start = self._journal_start, None
            start(opened)
        return opened

    def created_id(self) -> str | None:
        """The id of the upload this opening created (waits), None when it created none: what a
        failed `put_file` has to abort."""
        try:
            opened = self._future.result()
        except StoreError:
            return None
        return opened if isinstance(opened, str) else None


class MultipartUploads:
    """The multipart half of `S3Store` (a mixin): everything below uses the store's plumbing."""

    _completed: CompletedChecksums
    _concurrency: int
    _crc32: bool
    _part_size: int
    conditional_writes: bool
    evidence: Evidence

    # Provided by S3Store (declared here so this half type-checks on its own).
    def call(self, operation: str, key: str | None, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError

    def _resolve_existing(self, key: str, sha256: str, size: int, info: ObjectInfo | None = None) -> PutOutcome:
        raise NotImplementedError

    def _part_size_for(self, size: int) -> int:
        needed = math.ceil(size / MAX_PARTS)
        return max(self._part_size, math.ceil(needed / _MIB) * _MIB)

    def _put_multipart(
        self,
        key: str,
        source: BinaryIO,
        path: Path,
        sha256: str,
        size: int,
        content_type: str,
        journal: MultipartJournal | None,
    ) -> PutOutcome:
        part_size = self._part_size_for(size)
        count = max(1, math.ceil(size / part_size))
        lengths = [min(part_size, size - (n - 1) * part_size) for n in range(1, count + 1)]

        upload_id, done = self._resume(key, sha256, part_size, lengths, journal)
        resumed = upload_id is not None
        with ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix="s3-part") as pool:
            if upload_id is None:
                # Fresh upload: a HEAD first avoids sending 100 MB only to learn the key is taken.
                # It and the creation run in a pool thread while this one reads and hashes the
                # first part: two round trips otherwise delay every upload's first byte.
                def journal_start(new_id: str) -> None:
                    if journal is not None:
                        journal.start(key, new_id, sha256=sha256, part_size=part_size)

                opening = _Opening(pool.submit(self._open_upload, key, sha256, content_type), journal_start)
            else:
                opening = _Opening.of(upload_id)
            try:
                parts = self._send_parts(pool, key, opening, source, path, lengths, done, sha256, size, journal)
                upload_id = opening.upload_id()
            except StoreError as exc:
                if isinstance(exc, PreconditionFailedError) and exc.info is not None:
                    return self._resolve_existing(key, sha256, size, exc.info)  # the HEAD found one
                created = opening.created_id()
                if isinstance(exc, SourceFileError):
                    # The spool file is not what the caller recorded: this upload can never complete.
                    if created is not None:
                        self._abort_quietly(key, created)
                        if journal is not None:
                            journal.finish(key)
                elif journal is None and created is not None:  # nobody could resume it
                    self._abort_quietly(key, created)
                raise
        try:
            return self._complete(key, upload_id, parts, sha256, size, journal, resumed=resumed)
        except _StartAfresh:
            # Only a resumed upload gets here, and the journal has forgotten it: this call is a
            # fresh upload (HEAD first, If-None-Match on completion), so create-once holds.
            source.seek(0)
            return self._put_multipart(key, source, path, sha256, size, content_type, journal)

    def _open_upload(self, key: str, sha256: str, content_type: str) -> str | ObjectInfo:
        """HEAD, then CreateMultipartUpload (in a pool thread): the new upload id, or what the HEAD
        found at the key."""
        info = self.head(key)
        if info is not None:
            return info
        params: dict[str, Any] = {
            "Key": key,
            "ContentType": content_type,
            "Metadata": {"sha256": sha256},
            **self.evidence.put_params(time.time()),
        }
        if self._crc32:
            params["ChecksumAlgorithm"] = "SHA256"
        return str(self.call("CreateMultipartUpload", key, **params)["UploadId"])

    def _resume(
        self,
        key: str,
        sha256: str,
        part_size: int,
        lengths: list[int],
        journal: MultipartJournal | None,
    ) -> tuple[str | None, dict[int, dict[str, Any]]]:
        """The journaled upload to continue and its parts verified on the server, or (None, {})."""
        entry: JournalEntry | None = journal.get(key) if journal is not None else None
        if entry is None or journal is None:
            return None, {}
        if entry.sha256 != sha256 or entry.part_size != part_size:
            # Started for other bytes or another part size: its parts are useless to us.
            self._abort_quietly(key, entry.upload_id)
            journal.finish(key)
            return None, {}
        try:
            server = self._list_parts(key, entry.upload_id)
        except NoSuchUploadError:
            # Completed (its answer lost in a crash) or aborted: start over; the HEAD before a
            # fresh upload finds a completed object.
            journal.finish(key)
            return None, {}
        done: dict[int, dict[str, Any]] = {}
        for number, etag in entry.parts.items():
            part = server.get(number)
            # Trust a part only if the server has it with the ETag we recorded and the size we
            # expect; anything else is simply sent again (UploadPart overwrites a part number).
            if (
                part is not None
                and same_etag(str(part["ETag"]), etag)
                and 1 <= number <= len(lengths)
                and int(part["Size"]) == lengths[number - 1]
            ):
                done[number] = part
        log.info("resuming multipart upload of %s: %d of %d parts already stored", key, len(done), len(lengths))
        return entry.upload_id, done

    def _list_parts(self, key: str, upload_id: str) -> dict[int, dict[str, Any]]:
        parts: dict[int, dict[str, Any]] = {}
        marker = 0
        while True:
            response = self.call("ListParts", key, Key=key, UploadId=upload_id, PartNumberMarker=marker)
            for part in response.get("Parts", []):
                parts[int(part["PartNumber"])] = part
            if not response.get("IsTruncated"):
                return parts
            marker = int(response["NextPartNumberMarker"])

    def _send_parts(
        self,
        pool: ThreadPoolExecutor,
        key: str,
        opening: _Opening,
        source: BinaryIO,
        path: Path,
        lengths: list[int],
        done: dict[int, dict[str, Any]],
        sha256: str,
        size: int,
        journal: MultipartJournal | None,
    ) -> list[dict[str, Any]]:
        """Read the file part by part, hash all of it, upload the missing parts; the completion list.

        Reading and hashing the next part (its own checksum included, so a pool thread only sends)
        overlaps the upload of the previous ones: at most ``part_concurrency`` parts are in flight,
        each sent from one of ``part_concurrency + 1`` part buffers reused from part to part, so
        memory stays at about that many parts whatever the file size. The next part goes as soon
        as any part in flight is done, not only the oldest (a slot would otherwise idle while an
        older part is still on its way). The journal is told about each part from this thread,
        in part order.
        """
        digest = hashlib.sha256()
        total = 0
        completed: dict[int, dict[str, Any]] = {}
        in_flight: deque[tuple[int, Future[dict[str, Any]]]] = deque()
        buffers = PartBuffers(lengths[0], self._concurrency + 1)

        def collect_oldest() -> None:
            number, future = in_flight.popleft()
            completed[number] = future.result()
            if journal is not None:
                journal.part_done(key, number, str(completed[number]["ETag"]))

        def wait_for_a_slot() -> None:
            while True:
                while in_flight and in_flight[0][1].done():
                    collect_oldest()
                running = [future for _, future in in_flight if not future.done()]
                for _, future in in_flight:
                    if future.done() and future.exception() is not None:
                        future.result()  # a failed part fails the upload now, not once it is the oldest
                if len(running) < self._concurrency:
                    return
                wait(running, return_when=FIRST_COMPLETED)

        try:
            for number, length in enumerate(lengths, start=1):
                view = buffers.take()[:length]
                if number in done:
                    got = read_hashed(source, path, view, (digest,))
                    total += got
                    if got != length:
                        break  # short file: reported by check_source below
                    server_part = done[number]
                    completed[number] = {"PartNumber": number, "ETag": server_part["ETag"]}
                    completed[number].update({f: server_part[f] for f in _PART_CHECKSUM_FIELDS if f in server_part})
                    buffers.give_back(view)
                    continue
                part_hash = self._part_hasher()
                got = read_hashed(source, path, view, (part_hash,))
                total += got
                if got != length:
                    digest.update(view[:got])
                    break  # short file: reported by check_source below
                checksum = self._part_checksum(part_hash)
                wait_for_a_slot()
                future = pool.submit(self._upload_part, key, opening.upload_id(), number, view, checksum)
                buffers.lend(view, future)
                in_flight.append((number, future))
                # The whole file's digest is fed while the part is sent (it only reads the buffer):
                # it is not on the way from a slot falling free to the next part going out.
                digest.update(view)
            while in_flight:
                collect_oldest()
        finally:
            for _, future in in_flight:
                future.cancel()
            wait([future for _, future in in_flight])  # nothing still sending when the caller aborts
        if total == size and source.read(1):
            total += 1  # longer than declared
        check_source(path, digest.hexdigest(), total, sha256, size)
        return [completed[n] for n in sorted(completed)]

    def _part_hasher(self) -> Any:
        """A fresh hasher of one part's bytes: SHA-256, or MD5 where checksum headers are refused."""
        return hashlib.sha256() if self._crc32 else hashlib.md5(usedforsecurity=False)

    def _part_checksum(self, part_hash: Any) -> dict[str, str]:
        """The checksum parameters of one part (``part_hash`` has seen its bytes): the SHA-256 the
        server verifies and keeps, or Content-MD5 where checksum headers are refused ("when_required")."""
        if self._crc32:
            return {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": sha256_checksum(part_hash.digest())}
        return {"ContentMD5": base64.b64encode(part_hash.digest()).decode()}

    def _upload_part(
        self, key: str, upload_id: str, number: int, data: memoryview, checksum: dict[str, str]
    ) -> dict[str, Any]:
        """UploadPart (in a pool thread); the part's entry for CompleteMultipartUpload."""
        params: dict[str, Any] = {
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": number,
            "Body": PartBody(data),
            "ContentLength": len(data),
            **checksum,
        }
        response = self.call("UploadPart", key, **params)
        entry = {"PartNumber": number, "ETag": response["ETag"]}
        entry.update({f: response[f] for f in _PART_CHECKSUM_FIELDS if f in response})
        return entry

    def _complete(
        self,
        key: str,
        upload_id: str,
        parts: list[dict[str, Any]],
        sha256: str,
        size: int,
        journal: MultipartJournal | None,
        *,
        resumed: bool = False,
    ) -> PutOutcome:
        """CompleteMultipartUpload with If-None-Match; _StartAfresh when a ``resumed`` upload
        cannot be completed (see _put_multipart)."""
        if not self.conditional_writes:
            info = self.head(key)
            if info is not None:
                self._abort_quietly(key, upload_id)
                if journal is not None:
                    journal.finish(key)
                return self._resolve_existing(key, sha256, size, info)
        try:
            response = self.call(
                "CompleteMultipartUpload",
                key,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
        except PreconditionFailedError:
            # The key was taken (or our own earlier completion's answer was lost). The upload
            # stays listed on some servers (moto): abort it, then compare.
            self._abort_quietly(key, upload_id)
            if journal is not None:
                journal.finish(key)
            return self._resolve_existing(key, sha256, size)
        except NoSuchUploadError:
            # A retried completion whose first attempt succeeded: the object should be ours.
            if journal is not None:
                journal.finish(key)
            if resumed and self.head(key) is None:
                # No object either: the resumed upload was aborted under us. Start over now
                # rather than fail the item into a backoff.
                log.warning("resumed multipart upload of %s is gone; starting a fresh upload", key)
                raise _StartAfresh from None
            return self._resolve_existing(key, sha256, size)
        except CompletionRefusedError as exc:
            if not resumed:
                raise
            # SeaweedFS refuses to complete an upload resumed from ListParts (400 InvalidRequest),
            # and would again on every retry until the item's deadline: its parts are useless.
            log.warning("%s; aborting the resumed upload and starting a fresh one", exc)
            self._abort_quietly(key, upload_id)
            if journal is not None:
                journal.finish(key)
            raise _StartAfresh from None
        except StoreError:
            if journal is None:
                self._abort_quietly(key, upload_id)
            raise
        if journal is not None:
            journal.finish(key)
        if response.get("ChecksumSHA256"):
            self._completed.remember(key, sha256, size, str(response["ChecksumSHA256"]))
        return PutOutcome.CREATED

    def _abort_quietly(self, key: str, upload_id: str) -> bool:
        """Abort a multipart upload; False (logged) when that failed, an orphan for the next sweep."""
        try:
            self.call("AbortMultipartUpload", key, Key=key, UploadId=upload_id)
        except NoSuchUploadError:
            return False
        except StoreError as exc:
            log.warning("could not abort multipart upload of %s (left for the orphan sweep): %s", key, exc)
            return False
        return True

    def abort_orphaned_uploads(self, prefix: str, keep: Set[str], *, initiated_before: float | None = None) -> int:
        """Abort in-progress multipart uploads under ``prefix`` whose id is not in ``keep`` (journal ids).

        ``initiated_before`` (epoch seconds): only uploads started before it, so the sweep can run
        beside this process's own uploads (one created but not yet journaled would look orphaned).
        Another process writing to the same prefix is not supported. StoreUnsupportedError when the
        server does not list multipart uploads.
        """
        validate_prefix(prefix)
        aborted = 0
        params: dict[str, Any] = {"Prefix": prefix}
        while True:
            response = self.call("ListMultipartUploads", prefix, **params)
            for upload in response.get("Uploads", []):
                started = upload.get("Initiated")
                if initiated_before is not None and started is not None and started.timestamp() >= initiated_before:
                    continue
                if upload["UploadId"] not in keep and self._abort_quietly(upload["Key"], upload["UploadId"]):
                    aborted += 1
            if not response.get("IsTruncated"):
                return aborted
            params["KeyMarker"] = response.get("NextKeyMarker", "")
            params["UploadIdMarker"] = response.get("NextUploadIdMarker", "")
