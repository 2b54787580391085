"""How a failed S3 call becomes the archiver's StoreError: the server's error code and HTTP status
sorted into permission, transient, not found, unsupported and the S3 store's internal errors (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from archiver.errors import (
    ObjectNotFoundError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    StoreUnsupportedError,
    excerpt,
)
from archiver.store.s3_multipart import (
    COMPLETION_REFUSED_CODES,
    ChecksumMismatchError,
    CompletionRefusedError,
    NoSuchUploadError,
    PreconditionFailedError,
)

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


def translate_client_error(response: Mapping[str, Any], operation: str, where: str, key: str | None) -> StoreError:
    """The StoreError for botocore's error ``response`` to ``operation`` on ``key`` (``where``: its
    ``s3://`` URL, as the message names it)."""
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    # Only the code and the server's message: never request headers (signatures) or params.
    message = f"S3 {operation} {where} failed: {code or '?'} (HTTP {status})"
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
    if code == "NoSuchKey" or (status == 404 and operation in ("HeadObject", "GetObject") and code != "NoSuchBucket"):
        return ObjectNotFoundError(key or "")
    if code == "NotImplemented" or status == 501:
        return StoreUnsupportedError(message)
    if code in _PERMISSION_CODES or status in (401, 403):
        return StorePermissionError(message)
    if code in _TRANSIENT_CODES or status >= 500 or status == 429:
        return StoreUnavailableError(message)
    return StoreError(message)
