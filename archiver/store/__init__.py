"""Object stores holding the archive (S3 or a local directory) behind one protocol, opened from a URL."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

from archiver.config import inputs
from archiver.config.evidence import NO_EVIDENCE, Evidence
from archiver.errors import ConfigError, InvalidKeyError
from archiver.store.base import (
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_CONCURRENCY,
    DEFAULT_PART_SIZE,
    MIN_PART_SIZE,
    JournalEntry,
    MemoryJournal,
    MultipartJournal,
    ObjectInfo,
    ObjectStore,
    PutOutcome,
    RequestCounter,
    validate_key,
)
from archiver.store.file import FileStore
from archiver.store.s3 import S3Store
from archiver.store.s3_client import ChecksumMode, make_s3_client

__all__ = [
    "CHECKSUM_MODES",
    "Evidence",
    "FileStore",
    "JournalEntry",
    "MemoryJournal",
    "MultipartJournal",
    "ObjectInfo",
    "ObjectStore",
    "PutOutcome",
    "RequestCounter",
    "S3Store",
    "make_s3_client",
    "open_store",
]

#: Values of botocore's ``request_checksum_calculation`` (``--s3-checksum``): "when_required" for
#: S3-compatible servers that reject the CRC32 headers botocore >= 1.36 sends by default.
CHECKSUM_MODES = ("when_supported", "when_required")

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_EXPECTED = "expected s3://bucket/prefix or file:///absolute/dir"


def _redacted(url: str) -> str:
    """The URL without any user:password part, for error messages."""
    return re.sub(r"//[^/@]*@", "//***@", url)


def open_store(
    url: str,
    *,
    s3_endpoint_url: str | None = None,
    s3_client: Any = None,
    checksum_mode: str = "when_supported",
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    part_size: int = DEFAULT_PART_SIZE,
    part_concurrency: int = DEFAULT_PART_CONCURRENCY,
    evidence: Evidence = NO_EVIDENCE,
) -> ObjectStore:
    """The store a ``--store`` URL names: ``s3://bucket[/prefix]`` or ``file:///absolute/dir``.

    ``s3_client`` (a boto3 S3 client) replaces the one built from ``s3_endpoint_url`` and
    ``checksum_mode``. Anything malformed raises ConfigError saying what was expected. Opening
    touches nothing remote; ``probe_conditional_writes()`` is the connectivity/writability check.
    """
    shown = _redacted(url)
    if checksum_mode not in CHECKSUM_MODES:
        raise ConfigError(f"S3 checksum mode must be one of {', '.join(CHECKSUM_MODES)}, got {checksum_mode!r}")
    if part_size < MIN_PART_SIZE:
        raise ConfigError(f"multipart part size must be at least {MIN_PART_SIZE} bytes, got {part_size}")
    if part_concurrency < 1:
        raise ConfigError(f"multipart part concurrency must be at least 1, got {part_concurrency}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"store URL {shown!r} is malformed ({exc}); {_EXPECTED}") from None
    if parts.query or parts.fragment:
        raise ConfigError(f"store URL {shown!r} must not have a query or fragment; {_EXPECTED}")

    if parts.scheme == "s3":
        if "@" in parts.netloc:
            raise ConfigError(
                f"store URL {shown!r} must not carry credentials: use the AWS environment, config files or an IAM role"
            )
        bucket = parts.netloc
        if not _BUCKET_RE.match(bucket):
            raise ConfigError(f"store URL {shown!r}: {bucket!r} is not a valid bucket name; {_EXPECTED}")
        prefix = unquote(parts.path).lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        try:
            validate_key(prefix[:-1]) if prefix else None
        except InvalidKeyError as exc:
            raise ConfigError(f"store URL {shown!r}: unusable key prefix ({exc})") from None
        if s3_endpoint_url is not None and not re.match(r"^https?://[^/\s]+", s3_endpoint_url):
            raise ConfigError(f"S3 endpoint URL {_redacted(s3_endpoint_url)!r} must start with http:// or https://")
        mode: ChecksumMode = "when_supported" if checksum_mode == "when_supported" else "when_required"
        client = s3_client or make_s3_client(endpoint_url=s3_endpoint_url, checksum_mode=mode)
        return S3Store(
            client,
            bucket,
            prefix,
            multipart_threshold=multipart_threshold,
            part_size=part_size,
            part_concurrency=part_concurrency,
            checksum_mode=checksum_mode,
            evidence=evidence,
        )

    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"store URL {shown!r} names a remote host; {_EXPECTED}")
        try:
            path = inputs.local_path(unquote(parts.path), "store directory")
        except ValueError as exc:
            raise ConfigError(f"file:// store URL: {exc}") from None
        if not path.is_absolute():
            raise ConfigError(f"store URL {shown!r} needs an absolute directory; {_EXPECTED}")
        if not path.is_dir():
            raise ConfigError(f"store directory {path} does not exist or is not a directory (create it first)")
        if evidence.active:
            raise ConfigError(
                "encryption, storage class, object tags and Object Lock are S3 settings; "
                f"{shown!r} is a directory (remove them or archive to s3://)"
            )
        return FileStore(path)

    raise ConfigError(f"unsupported store URL {shown!r}; {_EXPECTED}")
