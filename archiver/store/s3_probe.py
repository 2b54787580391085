"""The start-up probes of an S3-compatible store: what the server really does with create-once
writes, user metadata and checksums, and which evidence settings it applies, found by writing,
reading back and deleting probe objects under ``{prefix}_probe/`` (the one exception to create-once).

The probes return plain frozen findings; `S3Store.apply_findings` is where the store adapts to them.
A new probe is one field of StoreFindings (its fallback documented there), one function here called
from `probe_store`, and the store's change of behaviour in `apply_findings`.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from archiver.errors import StoreError, StorePermissionError, StoreUnavailableError
from archiver.evidence import Evidence
from archiver.store.base import ObjectInfo, sha256_checksum
from archiver.store.s3_multipart import ChecksumMismatchError, PreconditionFailedError

log = logging.getLogger("archiver.store.s3")  # one logger for the S3 store, as before the split


@dataclass(frozen=True, slots=True)
class StoreFindings:
    """What the start-up probe found out about a store. Each False names the fallback the store takes."""

    #: The server refuses a second create-once write (``If-None-Match: *``). False: writes HEAD
    #: first (a small race window remains: such servers cannot do better).
    conditional_writes: bool
    #: The server keeps user metadata (our ``x-amz-meta-sha256``). False: sha256 comparisons re-read
    #: the stored object.
    metadata_supported: bool
    #: The server refuses a body that does not match the SHA-256 checksum sent with it. False: files
    #: are hashed before they are sent (moto, for one, accepts any checksum).
    verifies_checksums: bool


#: What a store is assumed to do before it was probed (and what a test store that is never probed does).
UNPROBED = StoreFindings(conditional_writes=True, metadata_supported=True, verifies_checksums=False)


class ProbedStore(Protocol):
    """What the probes need of the store: one translated S3 call, a HEAD, a listing, its names."""

    prefix: str
    url: str

    def call(self, operation: str, key: str | None, **params: Any) -> dict[str, Any]: ...
    def where(self, key: str | None) -> str: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def list_keys(self, prefix: str, *, start_after: str = "") -> Iterator[str]: ...


def probe_key(store: ProbedStore) -> str:
    """A fresh probe object key under the store's prefix."""
    return f"{store.prefix}_probe/{uuid.uuid4().hex}"


def probe_store(store: ProbedStore, *, sends_checksums: bool) -> StoreFindings:
    """Two create-once writes of one probe key (does the server refuse the second?), a HEAD (did it
    keep our metadata?) and a write with a wrong checksum (does it refuse it? only when the store
    ``sends_checksums``), then the probe objects are deleted, with any an earlier probe left behind.

    Each missing guarantee is logged as a warning or note; permission problems raise
    StorePermissionError (``archiver check`` reports them).
    """
    key = probe_key(store)
    first, second = b"archiver probe: first write\n", b"archiver probe: second write\n"
    sums = {hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()}
    enforced = False
    try:
        for n, body in enumerate((first, second)):
            try:
                store.call(
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
                    raise StoreUnavailableError(f"probe key {store.where(key)} already exists") from None
                enforced = True
            else:
                enforced = False
        info = store.head(key)
        metadata = info is not None and info.sha256 in sums
        verifies = _probe_checksum_check(store, key) if sends_checksums else False
    finally:
        _delete(store, key, "store probe object")
    delete_probe_leftovers(store)
    if not enforced:
        log.warning(
            "%s ignores If-None-Match: falling back to HEAD-before-PUT (a concurrent writer could "
            "still overwrite an object between the HEAD and the PUT)",
            store.url,
        )
    if not metadata:
        log.warning("%s drops user metadata: sha256 comparisons will re-read objects", store.url)
    return StoreFindings(conditional_writes=enforced, metadata_supported=metadata, verifies_checksums=verifies)


def _probe_checksum_check(store: ProbedStore, key: str) -> bool:
    """Does the server refuse a body that does not match the checksum sent with it?

    Writes the probe key (deleted by the caller) with a checksum of other bytes. Refused with
    BadDigest: the server proves every upload's integrity on arrival, so `put_file` need not hash a
    file before sending it. Accepted, or refused otherwise: we keep hashing first. Only asked with
    SHA-256 checksum headers ("when_supported"): they carry the sha256 the caller recorded, so the
    server's check compares the file with it. Content-MD5 ("when_required") is computed from the
    file itself and proves only that the bytes arrived as read.
    """
    params: dict[str, Any] = {
        "Key": key,
        "Body": b"archiver probe: checksum check\n",
        "ContentType": "text/plain",
        "ChecksumAlgorithm": "SHA256",
        "ChecksumSHA256": sha256_checksum(hashlib.sha256(b"not the body").digest()),
    }
    try:
        store.call("PutObject", key, **params)
    except ChecksumMismatchError:
        return True
    except (StoreUnavailableError, StorePermissionError):
        raise
    except StoreError as exc:
        log.info("%s refused the checksum probe otherwise (%s): uploads are hashed before sending", store.url, exc)
        return False
    log.info("%s accepts a body that does not match its checksum: uploads are hashed before sending", store.url)
    return False


def probe_evidence(store: ProbedStore, evidence: Evidence) -> dict[str, str]:
    """Write a probe object with the evidence settings (retention aside: a locked probe could not be
    deleted), read back what the server applied, delete it; the HEAD's answer as strings."""
    key = probe_key(store)
    params = evidence.put_params(time.time(), retention=False)
    try:
        store.call("PutObject", key, Key=key, Body=b"archiver evidence probe\n", ContentType="text/plain", **params)
        response = store.call("HeadObject", key, Key=key)
        return {
            "sse": str(response.get("ServerSideEncryption") or ""),
            "sse_kms_key_id": str(response.get("SSEKMSKeyId") or ""),
            # HEAD omits the class for STANDARD.
            "storage_class": str(response.get("StorageClass") or "STANDARD"),
            "tags": str(response.get("TagCount") or 0),
        }
    finally:
        _delete(store, key, "evidence probe object")


def delete_probe_leftovers(store: ProbedStore) -> None:
    """Delete the probe objects of earlier probes that could not (the store went away between the
    write and the delete, or the process was killed): they are not evidence. A replica sharing the
    prefix may delete a probe of its partner in flight: that probe then fails once and is retried,
    which costs a moment of its health check, never an archive."""
    try:
        for key in list(store.list_keys(f"{store.prefix}_probe/")):
            store.call("DeleteObject", key, Key=key)
    except StoreError as exc:
        log.warning("could not delete leftover store probe objects under %s_probe/: %s", store.prefix, exc)


def _delete(store: ProbedStore, key: str, what: str) -> None:
    """Delete one probe object; a failure is logged (the next probe deletes the leftover)."""
    try:
        store.call("DeleteObject", key, Key=key)
    except StoreError as exc:
        log.warning("could not delete %s %s: %s", what, key, exc)
