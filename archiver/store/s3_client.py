"""The boto3 S3 client the S3 store talks through: botocore's retries, checksums, timeouts, addressing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from botocore.config import Config

from archiver.retry import STORE, RetryPolicy

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    S3Client = Any

ChecksumMode = Literal["when_supported", "when_required"]

#: botocore's own default for connect and read timeouts (used when only one of them is given).
DEFAULT_BOTO_TIMEOUT = 60.0


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
