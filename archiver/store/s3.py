"""The S3 object store: create-once PUTs, resumable multipart uploads, error translation (over `s3_client`'s client)."""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from archiver.config.evidence import NO_EVIDENCE, Evidence
from archiver.errors import (
    ObjectConflictError,
    ObjectNotFoundError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    excerpt,
)
from archiver.layout.manifest import is_sha256
from archiver.store import s3_probe
from archiver.store.base import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_CONCURRENCY,
    DEFAULT_PART_SIZE,
    MIN_PART_SIZE,
    READ_CHUNK,
    MultipartJournal,
    ObjectInfo,
    PutOutcome,
    RequestCounter,
    check_sha256,
    open_source,
    sha256_checksum,
    validate_key,
    validate_prefix,
)
from archiver.store.s3_errors import translate_client_error
from archiver.store.s3_multipart import (
    ChecksumMismatchError,
    CompletedChecksums,
    MultipartUploads,
    PreconditionFailedError,
)
from archiver.store.s3_parts import check_size, check_source

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    S3Client = Any

log = logging.getLogger(__name__)


def _digest(hasher: Any, data: bytes | BinaryIO) -> bytes:
    """The digest of `data`; a file is read in chunks to its end (no copy of it in memory), then
    put back where it was, so that it can still be sent."""
    if isinstance(data, bytes):
        hasher.update(data)
    else:
        start = data.tell()
        for chunk in iter(functools.partial(data.read, READ_CHUNK), b""):
            hasher.update(chunk)
        data.seek(start)
    return bytes(hasher.digest())


class S3Store(MultipartUploads):
    """A bucket prefix as an ObjectStore (multipart uploads: `archiver/store/s3_multipart.py`).

    Create-once: ``PutObject`` and ``CompleteMultipartUpload`` carry ``If-None-Match: *``; a 412
    (also the one botocore's retry provokes after a lost answer) is resolved by comparing the
    stored ``x-amz-meta-sha256`` and size with ours. What the server really does (``If-None-Match``
    honoured, metadata kept, checksums verified) is probed at start-up (`archiver/store/s3_probe.py`),
    and each missing guarantee has its fallback (`apply_findings`).
    """

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str = "",
        *,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        part_concurrency: int = DEFAULT_PART_CONCURRENCY,
        list_page_size: int = 1000,
        checksum_mode: str | None = None,
        evidence: Evidence = NO_EVIDENCE,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part size must be at least {MIN_PART_SIZE} bytes (S3's minimum)")
        if part_concurrency < 1:
            raise ValueError("part concurrency must be at least 1")
        self._concurrency = part_concurrency
        self._client = client
        self._bucket = bucket
        self.prefix = validate_prefix(prefix)
        self.url = f"s3://{bucket}/{prefix}"
        self._threshold = multipart_threshold
        self._part_size = part_size
        self._page_size = list_page_size
        if checksum_mode is None:
            checksum_mode = getattr(client.meta.config, "request_checksum_calculation", "when_supported")
        # With "when_supported" we send a SHA-256 checksum with every PUT and part (the server
        # verifies it on arrival and keeps it); S3 then wants the upload created with that
        # algorithm and each part's checksum repeated on completion (as s3transfer does). With
        # "when_required" (servers that reject checksum headers) we send Content-MD5 instead,
        # which every S3 implementation verifies.
        self._crc32 = checksum_mode == "when_supported"
        #: What the start-up probe found (`probe_conditional_writes`); until then what a store is
        #: assumed to do (or, after `distrust`, nothing it has not seen). The guarantees the store
        #: acts on are also plain attributes, as ObjectStore has them (set by `apply_findings`).
        self.apply_findings(s3_probe.UNPROBED)
        #: Encryption, storage class, tags and Object Lock retention of every archived object.
        self.evidence = evidence
        self.requests_made = RequestCounter()
        self._completed = CompletedChecksums()

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The injected S3 client (a test hook: tests forge objects behind the store's back with it)."""
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    def where(self, key: str | None) -> str:
        """The ``s3://`` URL of ``key`` (of the prefix for None), as messages name it."""
        return f"s3://{self._bucket}/{key}" if key is not None else f"s3://{self._bucket}/{self.prefix}"

    def call(self, operation: str, key: str | None, **params: Any) -> dict[str, Any]:
        """One S3 API call (botocore retries inside it), counted, with errors translated."""
        self.requests_made.add(operation)
        method = getattr(self._client, _SNAKE[operation])
        try:
            response: dict[str, Any] = method(Bucket=self._bucket, **params)
        except ClientError as exc:
            raise translate_client_error(exc.response, operation, self.where(key), key) from exc
        except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError) as exc:
            raise StorePermissionError(
                f"S3 {operation} {self.where(key)}: no usable AWS credentials ({type(exc).__name__})"
            ) from exc
        except ParamValidationError as exc:
            raise StoreError(f"S3 {operation} {self.where(key)}: invalid request ({excerpt(str(exc))})") from exc
        except BotoCoreError as exc:
            # Connection refused/reset, timeouts, broken streams, after botocore's own retries.
            raise StoreUnavailableError(
                f"S3 {operation} {self.where(key)} failed: {type(exc).__name__}: {excerpt(str(exc))}"
            ) from exc
        return response

    # --- reads --------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        # ChecksumMode asks for the stored x-amz-checksum-sha256 (not sent where checksum headers
        # are refused: "when_required" mode).
        extra = {"ChecksumMode": "ENABLED"} if self._crc32 else {}
        try:
            response = self.call("HeadObject", key, Key=key, **extra)
        except ObjectNotFoundError:
            return None
        sha256 = (response.get("Metadata") or {}).get("sha256")
        checksum = response.get("ChecksumSHA256")
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            sha256=sha256 if is_sha256(sha256) else None,
            content_type=response.get("ContentType"),
            checksum_sha256=str(checksum) if checksum else None,
        )

    def store_checksum(self, key: str, *, sha256: str, size: int) -> str | None:
        """The SHA-256 checksum the server verified on arrival: derived from ``sha256`` for an
        object sent with one PUT (no request), the composite the server keeps (one HEAD) for a
        multipart one; None where the store keeps none (as probed: `keeps_checksums`), and in
        "when_required" mode, where no checksum header is sent."""
        if size < self._threshold:
            return sha256_checksum(bytes.fromhex(check_sha256(sha256))) if self.keeps_checksums else None
        if not self.keeps_composite_checksums:
            return None
        # The answer to our own completion of this object, if recent; else what a HEAD shows.
        kept = self._completed.get(key, sha256, size)
        if kept is None:
            info = self.head(key)
            kept = info.checksum_sha256 if info is not None else None
        if kept is None:
            return None
        if "-" in kept:
            return kept
        # Some servers (moto) answer a composite without its "-N": add the part count the upload
        # used, so the manifest always tells a composite from a whole-object checksum.
        return f"{kept}-{math.ceil(size / self._part_size_for(size))}"

    def iter_bytes(self, key: str, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        validate_key(key)
        response = self.call("GetObject", key, Key=key)
        return self._stream(response["Body"], key, chunk_size)

    def iter_range(self, key: str, first: int, last: int, *, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        validate_key(key)
        response = self.call("GetObject", key, Key=key, Range=f"bytes={first}-{last}")
        return self._stream(response["Body"], key, chunk_size)

    def _stream(self, body: Any, key: str, chunk_size: int) -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(chunk_size)
        except (BotoCoreError, OSError) as exc:
            raise StoreUnavailableError(
                f"S3 GetObject {self.where(key)}: download broke off ({type(exc).__name__})"
            ) from exc
        finally:
            body.close()

    def list_keys(self, prefix: str, *, start_after: str = "") -> Iterator[str]:
        validate_prefix(prefix)
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Prefix": prefix, "MaxKeys": self._page_size}
            if start_after:
                params["StartAfter"] = start_after
            if token:
                params["ContinuationToken"] = token
            response = self.call("ListObjectsV2", prefix, **params)
            for obj in response.get("Contents", []):
                yield obj["Key"]
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return

    def _stored_sha256(self, key: str, info: ObjectInfo) -> str:
        """The stored object's sha256: from metadata, or by re-reading it when the server dropped that."""
        if info.sha256 is not None:
            return info.sha256
        digest = hashlib.sha256()
        for chunk in self.iter_bytes(key):
            digest.update(chunk)
        return digest.hexdigest()

    # --- create-once writes -------------------------------------------------------------------

    def _resolve_existing(self, key: str, sha256: str, size: int, info: ObjectInfo | None = None) -> PutOutcome:
        """An object exists at ``key``: ours (ALREADY_PRESENT) or another one (ObjectConflictError)."""
        if info is None:
            info = self.head(key)
        if info is None:
            # 412 says it exists, HEAD says it does not (a concurrent delete or a lagging
            # replica): nothing is decided, try again later.
            raise StoreUnavailableError(f"S3 {self.where(key)} refused a create-once write but cannot be read back")
        if info.size != size:
            raise ObjectConflictError(key, detail=f"stored size {info.size}, ours {size}")
        stored = self._stored_sha256(key, info)
        if stored != sha256:
            raise ObjectConflictError(key, detail=f"stored sha256 {stored[:16]}…, ours {sha256[:16]}…")
        return PutOutcome.ALREADY_PRESENT

    def _put_small(self, key: str, data: bytes | BinaryIO, sha256: str, size: int, content_type: str) -> PutOutcome:
        """One create-once PutObject of `data` (bytes, or a file positioned at its start, which
        botocore streams and rewinds for its retries, as boto3's `upload_file` hands it files)."""
        if not self.conditional_writes:
            info = self.head(key)
            if info is not None:
                return self._resolve_existing(key, sha256, size, info)
        try:
            self.call("PutObject", key, **self._put_params(key, data, sha256, content_type, create_once=True))
        except PreconditionFailedError:
            return self._resolve_existing(key, sha256, size)
        return PutOutcome.CREATED

    def replace_bytes(self, key: str, data: bytes, *, content_type: str) -> None:
        """One unconditional PutObject (a new version where the bucket keeps versions)."""
        validate_key(key)
        self.call("PutObject", key, **self._put_params(key, data, hashlib.sha256(data).hexdigest(), content_type))

    def _put_params(
        self, key: str, data: bytes | BinaryIO, sha256: str, content_type: str, *, create_once: bool = False
    ) -> dict[str, Any]:
        """A PutObject's parameters: the body, its sha256 as metadata, the evidence settings and
        the body's checksum; ``If-None-Match: *`` too for a ``create_once`` write."""
        params: dict[str, Any] = {"Key": key, "Body": data, "ContentType": content_type, "Metadata": {"sha256": sha256}}
        if create_once:
            # Sent even in HEAD-before-PUT mode: harmless where ignored, decisive where honoured.
            params["IfNoneMatch"] = "*"
        params.update(self.evidence.put_params(time.time()))
        if self._crc32:
            # The server re-hashes the body and refuses it unless it matches: integrity proved on
            # arrival, and the checksum kept for `archiver verify` without a download.
            params["ChecksumAlgorithm"] = "SHA256"
            params["ChecksumSHA256"] = sha256_checksum(bytes.fromhex(sha256))
        else:
            params["ContentMD5"] = base64.b64encode(_digest(hashlib.md5(usedforsecurity=False), data)).decode()
        return params

    def put_bytes(self, key: str, data: bytes, *, content_type: str) -> PutOutcome:
        validate_key(key)
        return self._put_small(key, data, hashlib.sha256(data).hexdigest(), len(data), content_type)

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
        validate_key(key)
        with open_source(path, sha256) as source:
            if size < self._threshold:
                # The file itself is the body: read once, by the socket, with no copy of it in memory
                # (a copy costs CPU per object, most of it touching fresh pages).
                check_size(path, os.fstat(source.fileno()).st_size, size)
                if not self.verifies_checksums:
                    check_source(path, _digest(hashlib.sha256(), source).hex(), size, sha256, size)
                    return self._put_small(key, source, sha256, size, content_type)
                # The server hashes what arrives against the signed checksum of `sha256` and refuses
                # a mismatch: hashing the file here first would repeat its proof at a cost per byte.
                try:
                    return self._put_small(key, source, sha256, size, content_type)
                except ChecksumMismatchError:
                    # Either the file is not what was recorded (SourceFileError: fetch it again) or
                    # the bytes were damaged on the way (transient: this error, retried later).
                    source.seek(0)
                    check_source(path, _digest(hashlib.sha256(), source).hex(), size, sha256, size)
                    raise
            return self._put_multipart(key, source, path, sha256, size, content_type, journal)

    # --- start-up probe (archiver/store/s3_probe.py) -----------------------------------------

    def probe_conditional_writes(self) -> bool:
        """Probe what the server really does (``s3_probe.probe_store``: create-once writes, user
        metadata, checksums, optional operations) and adapt to it; whether it honours
        ``If-None-Match`` (on PutObject and CompleteMultipartUpload). Each missing guarantee is
        logged as one warning. Permission problems raise StorePermissionError (``archiver check``
        reports them)."""
        self.apply_findings(s3_probe.probe_store(self, sends_checksums=self._crc32))
        return self.conditional_writes

    def apply_findings(self, findings: s3_probe.StoreFindings) -> None:
        """Take the fallback of each guarantee the probe found missing (see StoreFindings)."""
        self.findings = findings
        # A server that honours If-None-Match on one kind of write only gets HEAD-first on both.
        self.conditional_writes = findings.conditional_writes and findings.conditional_completes
        self.metadata_supported = findings.metadata_supported
        #: The server refuses a body that does not match the checksum sent with it: small objects
        #: then go out without being hashed again here first.
        self.verifies_checksums = findings.verifies_checksums
        self.keeps_checksums = self._crc32 and findings.keeps_checksums
        #: The server keeps the composite checksum of a multipart upload (what `store_checksum` records).
        self.keeps_composite_checksums = self._crc32 and findings.keeps_composite_checksums

    def distrust(self) -> None:
        """Rely on no guarantee until `probe_conditional_writes` has seen it (s3_probe.DISTRUSTED)."""
        self.apply_findings(s3_probe.DISTRUSTED)

    def guarantees_held(self) -> list[tuple[str, bool]]:
        """(guarantee, held) as probed (`s3_probe.guarantees_held`)."""
        return s3_probe.guarantees_held(self.findings, sends_checksums=self._crc32)

    def missing_guarantees(self) -> list[tuple[str, str]]:
        """(guarantee, one line) for each guarantee the probe found missing (`s3_probe.missing_guarantees`)."""
        return s3_probe.missing_guarantees(self.findings, sends_checksums=self._crc32)

    # --- evidence -----------------------------------------------------------------------------

    def set_legal_hold(self, key: str, on: bool) -> None:
        """Place (``on``) or clear a legal hold on the object at ``key`` (needs Object Lock on the bucket)."""
        validate_key(key)
        # A checksum is required here; SHA-256, not botocore's default CRC32, which some stores refuse.
        hold = {"Status": "ON" if on else "OFF"}
        self.call("PutObjectLegalHold", key, Key=key, LegalHold=hold, ChecksumAlgorithm="SHA256")

    def legal_hold(self, key: str) -> bool:
        """Whether the object at ``key`` is under a legal hold."""
        validate_key(key)
        try:
            response = self.call("GetObjectLegalHold", key, Key=key)
        except StoreError as exc:
            if "NoSuchObjectLockConfiguration" in str(exc):
                return False  # never held
            raise
        return bool(response.get("LegalHold", {}).get("Status") == "ON")

    def object_lock_enabled(self) -> bool:
        """Whether the bucket has Object Lock enabled (StoreUnsupportedError: the server has no Object Lock)."""
        try:
            response = self.call("GetObjectLockConfiguration", None)
        except StoreError as exc:
            if "ObjectLockConfigurationNotFound" in str(exc):
                return False
            raise
        return bool(response.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled")

    def probe_evidence(self) -> dict[str, str]:
        """What the server applies of the evidence settings to a probe object (``s3_probe.probe_evidence``)."""
        return s3_probe.probe_evidence(self, self.evidence, sends_checksums=self._crc32)

    def close(self) -> None:
        self._client.close()


#: boto3 client method per S3 operation name (the names `requests_made` counts by).
_SNAKE = {
    "AbortMultipartUpload": "abort_multipart_upload",
    "CompleteMultipartUpload": "complete_multipart_upload",
    "CreateMultipartUpload": "create_multipart_upload",
    "DeleteObject": "delete_object",
    "GetObject": "get_object",
    "GetObjectLegalHold": "get_object_legal_hold",
    "GetObjectLockConfiguration": "get_object_lock_configuration",
    "HeadObject": "head_object",
    "ListMultipartUploads": "list_multipart_uploads",
    "ListObjectsV2": "list_objects_v2",
    "ListParts": "list_parts",
    "PutObject": "put_object",
    "PutObjectLegalHold": "put_object_legal_hold",
    "UploadPart": "upload_part",
}
