"""Evidence settings applied to every archived S3 object (encryption, storage class, tags, Object
Lock retention): their validation, the request parameters they become and what the manifest records."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import quote

#: ``--s3-sse`` values → S3's ``ServerSideEncryption``.
SSE_MODES: Final = {"none": None, "aes256": "AES256", "aws:kms": "aws:kms"}
#: ``--s3-object-lock-mode`` values → S3's ``ObjectLockMode``.
LOCK_MODES: Final = {"none": None, "governance": "GOVERNANCE", "compliance": "COMPLIANCE"}
#: S3 storage classes (others are refused here rather than by the server at the first upload).
STORAGE_CLASSES: Final = (
    "STANDARD",
    "REDUCED_REDUNDANCY",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER",
    "DEEP_ARCHIVE",
    "GLACIER_IR",
    "OUTPOSTS",
    "SNOW",
    "EXPRESS_ONEZONE",
)
#: S3 allows at most 10 tags per object, keys up to 128 and values up to 256 characters.
MAX_TAGS: Final = 10
_TAG_RE = re.compile(r"^[\w .:/=+\-@]*$")


@dataclass(frozen=True, slots=True)
class Evidence:
    """What every archived object is written with; the default applies nothing (the bucket's own defaults)."""

    #: ``AES256`` (SSE-S3) or ``aws:kms`` (SSE-KMS), None: the bucket's default.
    sse: str | None = None
    #: The KMS key (id, ARN or alias) for ``aws:kms``; None: the account's AWS-managed key.
    kms_key_id: str | None = None
    storage_class: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: ``GOVERNANCE`` or ``COMPLIANCE``: retention of ``lock_days`` days on every object.
    lock_mode: str | None = None
    lock_days: int = 0

    def __post_init__(self) -> None:
        if self.sse not in (None, "AES256", "aws:kms"):
            raise ValueError(f"server-side encryption must be AES256 or aws:kms, got {self.sse!r}")
        if self.kms_key_id is not None and self.sse != "aws:kms":
            raise ValueError("a KMS key id needs --s3-sse aws:kms")
        if self.storage_class is not None and self.storage_class not in STORAGE_CLASSES:
            raise ValueError(f"unknown storage class {self.storage_class!r} (one of {', '.join(STORAGE_CLASSES)})")
        if len(self.tags) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} object tags, got {len(self.tags)}")
        for key, value in self.tags.items():
            if not 1 <= len(key) <= 128 or len(value) > 256 or not _TAG_RE.match(key) or not _TAG_RE.match(value):
                raise ValueError(f"object tag {key[:40]!r}: keys 1-128, values up to 256 letters, digits, ' .:/=+-@_'")
        if self.lock_mode not in (None, "GOVERNANCE", "COMPLIANCE"):
            raise ValueError(f"Object Lock mode must be governance or compliance, got {self.lock_mode!r}")
        if (self.lock_mode is None) != (self.lock_days == 0):
            raise ValueError("Object Lock needs both a mode (governance, compliance) and a number of days > 0")
        if self.lock_days < 0:
            raise ValueError(f"Object Lock days must be positive, got {self.lock_days}")

    @property
    def active(self) -> bool:
        return bool(self.sse or self.storage_class or self.tags or self.lock_mode)

    @property
    def tagging(self) -> str:
        """The tags as S3's ``Tagging`` header wants them (URL-encoded ``k=v&k=v``, sorted)."""
        return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(self.tags.items()))

    def put_params(self, now: float, *, retention: bool = True) -> dict[str, Any]:
        """Parameters of PutObject / CreateMultipartUpload; ``now`` (epoch seconds) starts the retention."""
        params: dict[str, Any] = {}
        if self.sse is not None:
            params["ServerSideEncryption"] = self.sse
        if self.kms_key_id is not None:
            params["SSEKMSKeyId"] = self.kms_key_id
        if self.storage_class is not None:
            params["StorageClass"] = self.storage_class
        if self.tags:
            params["Tagging"] = self.tagging
        if retention and self.lock_mode is not None:
            params["ObjectLockMode"] = self.lock_mode
            params["ObjectLockRetainUntilDate"] = datetime.fromtimestamp(now, UTC) + timedelta(days=self.lock_days)
        return params

    def manifest_doc(self) -> dict[str, str]:
        """What the manifest records (``evidence``): only the settings that are set, as strings."""
        doc: dict[str, str] = {}
        if self.sse is not None:
            doc["sse"] = self.sse
        if self.kms_key_id is not None:
            doc["sse_kms_key_id"] = self.kms_key_id
        if self.storage_class is not None:
            doc["storage_class"] = self.storage_class
        if self.tags:
            doc["tags"] = self.tagging
        if self.lock_mode is not None:
            doc["object_lock_mode"] = self.lock_mode
            doc["object_lock_days"] = str(self.lock_days)
        return doc


NO_EVIDENCE: Final = Evidence()
