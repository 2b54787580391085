"""The start-up probes of an S3-compatible store: what the server really does with create-once
writes (PUT and multipart completion), user metadata, SHA-256 checksums (kept, answered, verified),
botocore's default CRC32 checksums and the optional operations, and which evidence settings it
applies, found by writing, reading back and deleting probe objects under ``{prefix}_probe/`` (the one
exception to create-once); and what each missing guarantee means, as one line (`missing_guarantees`).

The probes return plain frozen findings; `S3Store.apply_findings` is where the store adapts to them.
A new probe is one field of StoreFindings (its fallback documented there), one function here called
from `probe_store`, and the store's change of behaviour in `apply_findings`.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from archiver.config.evidence import Evidence
from archiver.errors import StoreError, StorePermissionError, StoreUnavailableError, StoreUnsupportedError
from archiver.store.base import ObjectInfo, composite_checksum, sha256_checksum
from archiver.store.s3_multipart import ChecksumMismatchError, PreconditionFailedError

log = logging.getLogger("archiver.store.s3")  # one logger for the S3 store, as before the split


@dataclass(frozen=True, slots=True)
class StoreFindings:
    """What the start-up probe found out about a store. Each False names the fallback the store takes."""

    #: The server refuses a second create-once write (``If-None-Match: *`` on PutObject). False:
    #: writes HEAD first (a small race window remains: such servers cannot do better).
    conditional_writes: bool
    #: The server keeps user metadata (our ``x-amz-meta-sha256``). False: sha256 comparisons re-read
    #: the stored object.
    metadata_supported: bool
    #: The server refuses a body that does not match the SHA-256 checksum sent with it. False: files
    #: are hashed before they are sent (moto, for one, accepts any checksum).
    verifies_checksums: bool
    #: The server refuses to complete a multipart upload onto an existing key (``If-None-Match: *``
    #: on CompleteMultipartUpload). False: as for ``conditional_writes``, every write HEADs first.
    conditional_completes: bool = True
    #: The server keeps the SHA-256 checksum sent with a PutObject and answers it to a HEAD with
    #: ``ChecksumMode``. False (or no checksums sent: ``--s3-checksum when_required``): manifests
    #: record no store checksum, and `archiver verify` counts objects as not provable by the store.
    keeps_checksums: bool = True
    #: The same for the composite checksum of a multipart upload (``base64(sha256(parts))-N``).
    keeps_composite_checksums: bool = True
    #: The server accepts botocore's default CRC32 request checksum (boto3 >= 1.36). False: only the
    #: archiver's own SHA-256 checksums are sent (every call of ours that carries a body has one).
    accepts_crc32: bool = True
    #: Optional operations the server answers ``501 NotImplemented`` (of `OPTIONAL_OPERATIONS`).
    missing_operations: tuple[str, ...] = ()


#: What a store is assumed to do before it was probed (and what a test store that is never probed does).
UNPROBED = StoreFindings(conditional_writes=True, metadata_supported=True, verifies_checksums=False)
#: What the archiver relies on until the probe has answered (`S3Store.distrust`): nothing it has not
#: seen: writes HEAD first, stored sha256 values are re-read, manifests record no store checksum.
DISTRUSTED = StoreFindings(
    conditional_writes=False,
    metadata_supported=False,
    verifies_checksums=False,
    conditional_completes=False,
    keeps_checksums=False,
    keeps_composite_checksums=False,
)

#: The optional operations the archiver uses, probed read-only: the guarantee each one stands for,
#: and what is lost without it.
OPTIONAL_OPERATIONS = {
    "ListMultipartUploads": (
        "orphan_sweep",
        "uploads orphaned by a crash are not swept (add a lifecycle rule that aborts incomplete multipart uploads)",
    ),
    "GetObjectLockConfiguration": ("object_lock", "Object Lock retention cannot be checked or relied on"),
    "GetObjectLegalHold": ("legal_hold", "legal holds cannot be placed or read (`archiver hold` fails)"),
}


def missing_guarantees(findings: StoreFindings, *, sends_checksums: bool) -> list[tuple[str, str]]:
    """(guarantee, one line on what the store lacks and what the archiver does instead) for each
    guarantee ``findings`` shows missing, in a fixed order; ``sends_checksums``: SHA-256 checksum
    headers are sent (``--s3-checksum when_supported``). Pure."""
    lines: list[tuple[str, str]] = []
    head_first = "every write HEADs first (a concurrent writer could still overwrite an object in between)"
    if not findings.conditional_writes:
        lines.append(("create_once_put", f"ignores If-None-Match on PutObject: {head_first}"))
    if not findings.conditional_completes:
        lines.append(("create_once_complete", f"ignores If-None-Match on CompleteMultipartUpload: {head_first}"))
    if not findings.metadata_supported:
        lines.append(("user_metadata", "drops user metadata (x-amz-meta-sha256): sha256 comparisons re-read objects"))
    not_provable = "`archiver verify` counts them as not provable by the store (`verify --deep` re-hashes them)"
    if not sends_checksums:
        lines.append(
            ("sha256_checksums", f"no checksum headers are sent (--s3-checksum when_required): {not_provable}")
        )
    elif not findings.keeps_checksums:
        lines.append(("sha256_checksums", f"keeps no SHA-256 checksums: manifests record none, and {not_provable}"))
    elif not findings.keeps_composite_checksums:
        lines.append(
            (
                "composite_checksums",
                f"keeps no checksum of multipart uploads: for objects uploaded in parts, {not_provable}",
            )
        )
    if not findings.accepts_crc32:
        lines.append(
            (
                "crc32_checksums",
                "refuses CRC32 request checksums (botocore's default): the archiver sends SHA-256 checksums "
                "itself; other S3 tools need request_checksum_calculation=when_required here",
            )
        )
    for operation in findings.missing_operations:
        guarantee, lost = OPTIONAL_OPERATIONS[operation]
        lines.append((guarantee, f"does not implement {operation}: {lost}"))
    return lines


def guarantees_held(findings: StoreFindings, *, sends_checksums: bool) -> list[tuple[str, bool]]:
    """(guarantee, held) for every guarantee `missing_guarantees` can name, in its order (the
    ``guarantee`` label of `archiver_store_guarantee`). Pure."""
    return [
        ("create_once_put", findings.conditional_writes),
        ("create_once_complete", findings.conditional_completes),
        ("user_metadata", findings.metadata_supported),
        ("sha256_checksums", sends_checksums and findings.keeps_checksums),
        ("composite_checksums", sends_checksums and findings.keeps_composite_checksums),
        ("crc32_checksums", findings.accepts_crc32),
        *((guarantee, op not in findings.missing_operations) for op, (guarantee, _) in OPTIONAL_OPERATIONS.items()),
    ]


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
    """What the server really does, found with probe objects that are deleted afterwards (with any
    an earlier probe left behind): two create-once writes of one key (does it refuse the second?),
    a HEAD (did it keep our metadata and our SHA-256 checksum?), the optional operations (read-only),
    a write with a wrong checksum (does it refuse it?) and one with botocore's default CRC32 checksum,
    then two multipart uploads onto one key (create-once completion, composite checksum kept?).
    The checksum probes need ``sends_checksums`` (SHA-256 headers, ``--s3-checksum when_supported``).

    Each missing guarantee is logged as one warning (`missing_guarantees`); permission problems
    raise StorePermissionError (``archiver check`` reports them).
    """
    key, parts_key = probe_key(store), probe_key(store)
    bodies = (b"archiver probe: first write\n", b"archiver probe: second write\n")
    try:
        enforced = _create_twice(store, key, bodies, sends_checksums)
        info = store.head(key)
        sums = {hashlib.sha256(body).hexdigest() for body in bodies}
        checksums = {sha256_checksum(hashlib.sha256(body).digest()) for body in bodies}
        missing = _missing_operations(store, key)
        verifies = _probe_checksum_check(store, key) if sends_checksums else False
        crc32 = _accepts_crc32(store, key) if sends_checksums else True
        completes, composite = _probe_multipart(store, parts_key, sends_checksums)
    finally:
        _delete(store, key, "store probe object")
        _delete(store, parts_key, "store probe object")
    delete_probe_leftovers(store)
    findings = StoreFindings(
        conditional_writes=enforced,
        metadata_supported=info is not None and info.sha256 in sums,
        verifies_checksums=verifies,
        conditional_completes=completes,
        keeps_checksums=sends_checksums and info is not None and info.checksum_sha256 in checksums,
        keeps_composite_checksums=composite,
        accepts_crc32=crc32,
        missing_operations=missing,
    )
    for _guarantee, line in missing_guarantees(findings, sends_checksums=sends_checksums):
        log.warning("%s %s", store.url, line)
    return findings


def _checksum_params(body: bytes, sends_checksums: bool) -> dict[str, Any]:
    """The SHA-256 checksum of ``body`` as our uploads send it (nothing in "when_required" mode, where
    botocore sends none for a PutObject): botocore's own default (CRC32) is then never added."""
    if not sends_checksums:
        return {}
    return {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": sha256_checksum(hashlib.sha256(body).digest())}


def _create_twice(store: ProbedStore, key: str, bodies: tuple[bytes, bytes], sends_checksums: bool) -> bool:
    """Two create-once PutObjects of ``key``: whether the server refused the second."""
    enforced = False
    for n, body in enumerate(bodies):
        try:
            store.call(
                "PutObject", key, Key=key, Body=body, ContentType="text/plain", IfNoneMatch="*",
                Metadata={"sha256": hashlib.sha256(body).hexdigest()}, **_checksum_params(body, sends_checksums),
            )  # fmt: skip
        except PreconditionFailedError:
            if n == 0:
                raise StoreUnavailableError(f"probe key {store.where(key)} already exists") from None
            enforced = True
        except (StoreUnavailableError, StorePermissionError, StoreUnsupportedError):
            raise
        except StoreError as exc:
            if n == 0 and sends_checksums:
                raise StoreError(
                    f"{exc} (a store that refuses checksum headers needs --s3-checksum when_required)"
                ) from exc
            raise
    return enforced


def _missing_operations(store: ProbedStore, key: str) -> tuple[str, ...]:
    """The optional operations the server answers 501 NotImplemented (read-only calls; any other
    answer, e.g. "no Object Lock configuration" or "not allowed", means it implements them)."""
    calls: dict[str, Callable[[], object]] = {
        "ListMultipartUploads": lambda: store.call(
            "ListMultipartUploads", store.prefix, Prefix=f"{store.prefix}_probe/", MaxUploads=1
        ),
        "GetObjectLockConfiguration": lambda: store.call("GetObjectLockConfiguration", None),
        "GetObjectLegalHold": lambda: store.call("GetObjectLegalHold", key, Key=key),
    }
    missing = []
    for operation, call in calls.items():
        try:
            call()
        except StoreUnsupportedError:
            missing.append(operation)
        except StoreUnavailableError:
            raise
        except StoreError:
            pass  # answered: implemented
    return tuple(missing)


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


def _accepts_crc32(store: ProbedStore, key: str) -> bool:
    """Does the server take a PutObject carrying botocore's default CRC32 checksum (no checksum of
    ours, so botocore adds its own)? Writes the probe key (deleted by the caller)."""
    try:
        store.call("PutObject", key, Key=key, Body=b"archiver probe: default checksum\n", ContentType="text/plain")
    except (StoreUnavailableError, StorePermissionError):
        raise
    except StoreError as exc:
        log.info("%s refused botocore's default CRC32 checksum: %s", store.url, exc)
        return False
    return True


def _probe_multipart(store: ProbedStore, key: str, sends_checksums: bool) -> tuple[bool, bool]:
    """(create-once completion, composite checksum kept): a one-part upload completed onto ``key``
    with ``If-None-Match: *``, then a second one onto the same key that must be refused (aborted,
    as some servers keep a refused upload listed)."""
    body = b"archiver probe: one part\n"
    expected = composite_checksum([hashlib.sha256(body).digest()])

    def complete() -> dict[str, Any]:
        create: dict[str, Any] = {"ChecksumAlgorithm": "SHA256"} if sends_checksums else {}
        upload = str(store.call("CreateMultipartUpload", key, Key=key, ContentType="text/plain", **create)["UploadId"])
        try:
            part = store.call(
                "UploadPart", key, Key=key, UploadId=upload, PartNumber=1, Body=body,
                **_checksum_params(body, sends_checksums),
            )  # fmt: skip
            entry = {"PartNumber": 1, "ETag": part["ETag"]}
            if part.get("ChecksumSHA256"):
                entry["ChecksumSHA256"] = part["ChecksumSHA256"]
            return store.call(
                "CompleteMultipartUpload", key, Key=key, UploadId=upload, MultipartUpload={"Parts": [entry]},
                IfNoneMatch="*",
            )  # fmt: skip
        except BaseException:
            _abort(store, key, upload)
            raise

    kept = complete().get("ChecksumSHA256")
    if not kept:
        info = store.head(key)
        kept = info.checksum_sha256 if info is not None else None
    # moto answers a composite without its "-N": the digest part decides.
    composite = sends_checksums and bool(kept) and str(kept).split("-")[0] == expected.split("-")[0]
    try:
        complete()
    except PreconditionFailedError:
        return True, composite
    return False, composite


def _abort(store: ProbedStore, key: str, upload: str) -> None:
    try:
        store.call("AbortMultipartUpload", key, Key=key, UploadId=upload)
    except StoreError as exc:
        log.warning("could not abort the probe's multipart upload of %s: %s", key, exc)


def probe_evidence(store: ProbedStore, evidence: Evidence, *, sends_checksums: bool) -> dict[str, str]:
    """Write a probe object with the evidence settings (retention aside: a locked probe could not be
    deleted), read back what the server applied, delete it; the HEAD's answer as strings. The object
    carries our SHA-256 checksum (``sends_checksums``), as archived objects do."""
    key = probe_key(store)
    params = evidence.put_params(time.time(), retention=False)
    try:
        body = b"archiver evidence probe\n"
        params.update(_checksum_params(body, sends_checksums))
        store.call("PutObject", key, Key=key, Body=body, ContentType="text/plain", **params)
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
