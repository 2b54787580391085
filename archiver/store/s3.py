"""The S3 object store: create-once PUTs, resumable multipart uploads, error translation (boto3 client)."""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, cast

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from archiver.errors import (
    ObjectConflictError,
    ObjectNotFoundError,
    SourceFileError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    StoreUnsupportedError,
    excerpt,
)
from archiver.evidence import NO_EVIDENCE, Evidence
from archiver.layout.manifest import is_sha256
from archiver.retry import STORE, RetryPolicy
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
    sha256_checksum,
    validate_key,
    validate_prefix,
)
from archiver.store.s3_multipart import (
    COMPLETION_REFUSED_CODES,
    ChecksumMismatchError,
    CompletedChecksums,
    CompletionRefusedError,
    MultipartUploads,
    NoSuchUploadError,
    PreconditionFailedError,
    check_size,
    check_source,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    S3Client = Any

log = logging.getLogger(__name__)

ChecksumMode = Literal["when_supported", "when_required"]

#: Error codes meaning "we are not allowed / misconfigured": retrying will not help, alert.
_PERMISSION_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "AuthorizationHeaderMalformed",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "InvalidToken",
        "NoSuchBucket",
        "PermanentRedirect",
        "RequestTimeTooSkewed",
        "SignatureDoesNotMatch",
    }
)
#: The body that arrived does not match the checksum sent with it (AWS and most servers: BadDigest;
#: MinIO for the x-amz-checksum-* headers: XAmzContentChecksumMismatch).
_CHECKSUM_MISMATCH_CODES = frozenset({"BadDigest", "XAmzContentChecksumMismatch"})
#: Error codes (besides 5xx) that a later retry may get past: pause and retry.
_TRANSIENT_CODES = frozenset(
    {
        "ConditionalRequestConflict",
        "InternalError",
        "OperationAborted",
        "RequestLimitExceeded",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
    }
)


#: botocore's own default for connect and read timeouts (used when only one of them is given).
DEFAULT_BOTO_TIMEOUT = 60.0


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


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    checksum_mode: ChecksumMode = "when_supported",
    policy: RetryPolicy = STORE,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> S3Client:
    """A boto3 S3 client with botocore's standard retries (the only retry layer, attempts from
    `policy`) and configurable checksums; the timeouts default to botocore's.

    Path-style addressing is used with a custom endpoint (MinIO, Ceph, moto expect it).
    Credentials and region come from the usual AWS environment/config chain.
    """
    import boto3  # local: keeps `import archiver.store` cheap for commands that never touch S3

    # Built as a plain dict: the stubs' TypedDict for it is a private name of botocore.
    s3: dict[str, Any] = {"addressing_style": "path"} if endpoint_url else {}
    if checksum_mode == "when_supported":
        # Every PUT and part carries x-amz-checksum-sha256 (signed, as every header is), which the
        # server checks the body against: botocore hashing the body once more for the signature
        # (it always does over http) proves nothing more and costs CPU the server needs too on a
        # small machine. Over https botocore already skips it for uploads.
        s3["payload_signing_enabled"] = False
    config = Config(
        retries={"mode": "standard", "max_attempts": policy.attempts},
        request_checksum_calculation=checksum_mode,
        response_checksum_validation="when_required",
        s3=cast(Any, s3) or None,
        max_pool_connections=32,
    )
    if connect_timeout is not None or read_timeout is not None:
        config = config.merge(
            Config(
                connect_timeout=connect_timeout or DEFAULT_BOTO_TIMEOUT,
                read_timeout=read_timeout or DEFAULT_BOTO_TIMEOUT,
            )
        )
    client: S3Client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
    return client


class S3Store(MultipartUploads):
    """A bucket prefix as an ObjectStore (multipart uploads: `archiver/store/s3_multipart.py`).

    Create-once: ``PutObject`` and ``CompleteMultipartUpload`` carry ``If-None-Match: *``; a 412
    (also the one botocore's retry provokes after a lost answer) is resolved by comparing the
    stored ``x-amz-meta-sha256`` and size with ours. Servers that ignore ``If-None-Match`` are
    detected by :meth:`probe_conditional_writes`, after which writes HEAD first (a small race
    window remains: such servers cannot do better).
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
        self.conditional_writes = True
        self.metadata_supported = True
        self.keeps_checksums = self._crc32
        #: The server refuses a body that does not match the checksum sent with it (proved by the
        #: start-up probe, `probe_conditional_writes`): small objects then go out without being
        #: hashed again here first. False until proved: moto, for one, accepts any checksum.
        self.verifies_checksums = False
        #: Encryption, storage class, tags and Object Lock retention of every archived object.
        self.evidence = evidence
        self.requests_made = RequestCounter()
        self._completed = CompletedChecksums()

    # --- plumbing -----------------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        return f"s3://{self._bucket}/{key}" if key is not None else f"s3://{self._bucket}/{self.prefix}"

    def _call(self, operation: str, key: str | None, **params: Any) -> dict[str, Any]:
        """One S3 API call (botocore retries inside it), counted, with errors translated."""
        self.requests_made.add(operation)
        method = getattr(self._client, _SNAKE[operation])
        try:
            response: dict[str, Any] = method(Bucket=self._bucket, **params)
        except ClientError as exc:
            raise self._translate(exc, operation, key) from exc
        except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError) as exc:
            raise StorePermissionError(
                f"S3 {operation} {self._where(key)}: no usable AWS credentials ({type(exc).__name__})"
            ) from exc
        except ParamValidationError as exc:
            raise StoreError(f"S3 {operation} {self._where(key)}: invalid request ({excerpt(str(exc))})") from exc
        except BotoCoreError as exc:
            # Connection refused/reset, timeouts, broken streams, after botocore's own retries.
            raise StoreUnavailableError(
                f"S3 {operation} {self._where(key)} failed: {type(exc).__name__}: {excerpt(str(exc))}"
            ) from exc
        return response

    def _translate(self, exc: ClientError, operation: str, key: str | None) -> StoreError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        # Only the code and the server's message: never request headers (signatures) or params.
        message = f"S3 {operation} {self._where(key)} failed: {code or '?'} (HTTP {status})"
        if error.get("Message"):
            message += f": {excerpt(str(error['Message']))}"
        if code == "PreconditionFailed" or status == 412:
            return PreconditionFailedError(message)
        if code == "NoSuchUpload":
            return NoSuchUploadError(message)
        if code in _CHECKSUM_MISMATCH_CODES:
            return ChecksumMismatchError(message)
        if operation == "CompleteMultipartUpload" and code in COMPLETION_REFUSED_CODES:
            return CompletionRefusedError(message)
        if code == "NoSuchKey" or (
            status == 404 and operation in ("HeadObject", "GetObject") and code != "NoSuchBucket"
        ):
            return ObjectNotFoundError(key or "")
        if code == "NotImplemented" or status == 501:
            return StoreUnsupportedError(message)
        if code in _PERMISSION_CODES or status in (401, 403):
            return StorePermissionError(message)
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return StoreUnavailableError(message)
        return StoreError(message)

    # --- reads --------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        # ChecksumMode asks for the stored x-amz-checksum-sha256 (not sent where checksum headers
        # are refused: "when_required" mode).
        extra = {"ChecksumMode": "ENABLED"} if self._crc32 else {}
        try:
            response = self._call("HeadObject", key, Key=key, **extra)
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
        multipart one; None in "when_required" mode, where no checksum header is sent."""
        if not self._crc32:
            return None
        if size < self._threshold:
            return sha256_checksum(bytes.fromhex(check_sha256(sha256)))
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
        response = self._call("GetObject", key, Key=key)
        return self._stream(response["Body"], key, chunk_size)

    def _stream(self, body: Any, key: str, chunk_size: int) -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(chunk_size)
        except (BotoCoreError, OSError) as exc:
            raise StoreUnavailableError(
                f"S3 GetObject {self._where(key)}: download broke off ({type(exc).__name__})"
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
            response = self._call("ListObjectsV2", prefix, **params)
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
            raise StoreUnavailableError(f"S3 {self._where(key)} refused a create-once write but cannot be read back")
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
        params: dict[str, Any] = {
            "Key": key,
            "Body": data,
            "ContentType": content_type,
            "Metadata": {"sha256": sha256},
            # Sent even in HEAD-before-PUT mode: harmless where ignored, decisive where honoured.
            "IfNoneMatch": "*",
            **self.evidence.put_params(time.time()),
        }
        if self._crc32:
            # The server re-hashes the body and refuses it unless it matches: integrity proved on
            # arrival, and the checksum kept for `archiver verify` without a download.
            params["ChecksumAlgorithm"] = "SHA256"
            params["ChecksumSHA256"] = sha256_checksum(bytes.fromhex(sha256))
        else:
            params["ContentMD5"] = base64.b64encode(_digest(hashlib.md5(usedforsecurity=False), data)).decode()
        try:
            self._call("PutObject", key, **params)
        except PreconditionFailedError:
            return self._resolve_existing(key, sha256, size)
        return PutOutcome.CREATED

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
        check_sha256(sha256)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise SourceFileError(f"cannot open local file {path}: {exc.strerror}") from exc
        with source:
            if size < self._threshold:
                # The file itself is the body: read once, by the socket, with no copy of it in memory
                # (a 5 MB read cost 3.3 ms of CPU more per object, most of it fresh pages).
                check_size(path, os.fstat(source.fileno()).st_size, size)
                if not self.verifies_checksums:
                    check_source(path, _digest(hashlib.sha256(), source).hex(), size, sha256, size)
                    return self._put_small(key, source, sha256, size, content_type)
                # The server hashes what arrives against the signed checksum of `sha256` and refuses
                # a mismatch: hashing the file here first would repeat its proof (0.7 ms per MiB).
                try:
                    return self._put_small(key, source, sha256, size, content_type)
                except ChecksumMismatchError:
                    # Either the file is not what was recorded (SourceFileError: fetch it again) or
                    # the bytes were damaged on the way (transient: this error, retried later).
                    source.seek(0)
                    check_source(path, _digest(hashlib.sha256(), source).hex(), size, sha256, size)
                    raise
            return self._put_multipart(key, source, path, sha256, size, content_type, journal)

    # --- start-up probe -----------------------------------------------------------------------

    def probe_conditional_writes(self) -> bool:
        """Two create-once writes of one probe key: does the server refuse the second?

        Writes ``{prefix}_probe/<random>`` and deletes it afterwards: probe keys are the one
        exception to create-once. If the second write succeeds, the server ignores
        ``If-None-Match``: ``conditional_writes`` becomes False and writes HEAD first from then
        on (logged as a warning). A HEAD without our ``sha256`` metadata sets
        ``metadata_supported`` to False (sha256 comparisons then re-read the object).
        Permission problems raise StorePermissionError (``archiver check`` reports them).
        """
        key = f"{self.prefix}_probe/{uuid.uuid4().hex}"
        first, second = b"archiver probe: first write\n", b"archiver probe: second write\n"
        sums = {hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()}
        enforced = False
        try:
            for n, body in enumerate((first, second)):
                try:
                    self._call(
                        "PutObject",
                        key,
                        Key=key,
                        Body=body,
                        ContentType="text/plain",
                        Metadata={"sha256": hashlib.sha256(body).hexdigest()},
                        IfNoneMatch="*",
                    )
                except PreconditionFailedError:
                    if n == 0:
                        raise StoreUnavailableError(f"probe key {self._where(key)} already exists") from None
                    enforced = True
                else:
                    enforced = False
            info = self.head(key)
            metadata = info is not None and info.sha256 in sums
            verifies = self._probe_checksum_check(key)
        finally:
            try:
                self._call("DeleteObject", key, Key=key)
            except StoreError as exc:
                log.warning("could not delete store probe object %s: %s", key, exc)
        self._delete_probe_leftovers()
        self.conditional_writes = enforced
        self.metadata_supported = metadata
        self.verifies_checksums = verifies
        if not enforced:
            log.warning(
                "%s ignores If-None-Match: falling back to HEAD-before-PUT (a concurrent writer could "
                "still overwrite an object between the HEAD and the PUT)",
                self.url,
            )
        if not metadata:
            log.warning("%s drops user metadata: sha256 comparisons will re-read objects", self.url)
        return enforced

    def _probe_checksum_check(self, key: str) -> bool:
        """Does the server refuse a body that does not match the checksum sent with it?

        Writes the probe key (deleted by the caller) with a checksum of other bytes. Refused with
        BadDigest: the server proves every upload's integrity on arrival, so `put_file` need not
        hash a file before sending it. Accepted, or refused otherwise: we keep hashing first.
        Only with SHA-256 checksum headers ("when_supported"): they carry the sha256 the caller
        recorded, so the server's check compares the file with it. Content-MD5 ("when_required")
        is computed from the file itself and proves only that the bytes arrived as read.
        """
        if not self._crc32:
            return False
        body = b"archiver probe: checksum check\n"
        params: dict[str, Any] = {
            "Key": key,
            "Body": body,
            "ContentType": "text/plain",
            "ChecksumAlgorithm": "SHA256",
            "ChecksumSHA256": sha256_checksum(hashlib.sha256(b"not the body").digest()),
        }
        try:
            self._call("PutObject", key, **params)
        except ChecksumMismatchError:
            return True
        except (StoreUnavailableError, StorePermissionError):
            raise
        except StoreError as exc:
            log.info("%s refused the checksum probe otherwise (%s): uploads are hashed before sending", self.url, exc)
            return False
        log.info("%s accepts a body that does not match its checksum: uploads are hashed before sending", self.url)
        return False

    # --- evidence -----------------------------------------------------------------------------

    def set_legal_hold(self, key: str, on: bool) -> None:
        """Place (``on``) or clear a legal hold on the object at ``key`` (needs Object Lock on the bucket)."""
        validate_key(key)
        self._call("PutObjectLegalHold", key, Key=key, LegalHold={"Status": "ON" if on else "OFF"})

    def legal_hold(self, key: str) -> bool:
        """Whether the object at ``key`` is under a legal hold."""
        validate_key(key)
        try:
            response = self._call("GetObjectLegalHold", key, Key=key)
        except StoreError as exc:
            if "NoSuchObjectLockConfiguration" in str(exc):
                return False  # never held
            raise
        return bool(response.get("LegalHold", {}).get("Status") == "ON")

    def object_lock_enabled(self) -> bool:
        """Whether the bucket has Object Lock enabled (StoreUnsupportedError: the server has no Object Lock)."""
        try:
            response = self._call("GetObjectLockConfiguration", None)
        except StoreError as exc:
            if "ObjectLockConfigurationNotFound" in str(exc):
                return False
            raise
        return bool(response.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled")

    def probe_evidence(self) -> dict[str, str]:
        """Write a probe object with the evidence settings (retention aside: a locked probe could not be
        deleted), read back what the server applied, delete it; the HEAD's answer as strings."""
        key = f"{self.prefix}_probe/{uuid.uuid4().hex}"
        body = b"archiver evidence probe\n"
        params = self.evidence.put_params(time.time(), retention=False)
        try:
            self._call("PutObject", key, Key=key, Body=body, ContentType="text/plain", **params)
            response = self._call("HeadObject", key, Key=key)
            return {
                "sse": str(response.get("ServerSideEncryption") or ""),
                "sse_kms_key_id": str(response.get("SSEKMSKeyId") or ""),
                # HEAD omits the class for STANDARD.
                "storage_class": str(response.get("StorageClass") or "STANDARD"),
                "tags": str(response.get("TagCount") or 0),
            }
        finally:
            try:
                self._call("DeleteObject", key, Key=key)
            except StoreError as exc:
                log.warning("could not delete evidence probe object %s: %s", key, exc)

    def _delete_probe_leftovers(self) -> None:
        """Delete the probe objects of earlier probes that could not (the store went away between
        the write and the delete, or the process was killed): they are not evidence. A replica
        sharing the prefix may delete a probe of its partner in flight: that probe then fails once
        and is retried, which costs a moment of its health check, never an archive."""
        try:
            for key in list(self.list_keys(f"{self.prefix}_probe/")):
                self._call("DeleteObject", key, Key=key)
        except StoreError as exc:
            log.warning("could not delete leftover store probe objects under %s_probe/: %s", self.prefix, exc)

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
