"""`archiver check`: the configuration doctor (token accepted, store usable, evidence settings honoured by
the bucket, state dir writable).

Each check is independent (one failing does not hide the others' verdicts), reads nothing but
the Settings it is given, and never prints the API token: only the upstream's status code and
message, the URLs and the store's own one-line errors reach the output.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from archiver.config.evidence import Evidence
from archiver.config.settings import TOKEN_ENV, Settings
from archiver.durable import fsync_dir
from archiver.errors import (
    ApiError,
    ApiTransportError,
    ArchiverError,
    ConfigError,
    ForbiddenError,
    StoreUnsupportedError,
    UnauthorizedError,
)
from archiver.retrieval.retrieve import human_size
from archiver.retry import STORE_INTERACTIVE, UPSTREAM_REQUEST_INTERACTIVE
from archiver.store import ObjectStore, S3Store, open_store
from archiver.textsafe import one_line
from archiver.upstream.api import SessionHostClient

OK = "OK"
FAIL = "FAIL"
SKIP = "SKIP"
#: A guarantee the store lacks and the archiver works around: said, but not a failed check.
WARN = "WARN"

#: The S3 calls of the create-once guarantees, as the "conditional writes" line names them.
_CREATE_ONCE_CALLS = (("create_once_put", "PutObject"), ("create_once_complete", "CompleteMultipartUpload"))
#: The check line of each S3 guarantee the probe can find missing (s3_probe.missing_guarantees);
#: create-once writes have their own FAIL line, "conditional writes".
_GUARANTEE_CHECKS = {
    "user_metadata": "user metadata",
    "sha256_checksums": "store checksums",
    "composite_checksums": "store checksums",
    "crc32_checksums": "crc32 checksums",
    "orphan_sweep": "orphan sweep",
    "object_lock": "object lock api",
    "legal_hold": "legal hold api",
}

#: The doctor gives up quickly: a user waiting at a prompt wants a verdict, not botocore's backoff.
_API_POLICY = UPSTREAM_REQUEST_INTERACTIVE
_S3_CONNECT_TIMEOUT = 5.0
_S3_READ_TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One line of the doctor's report."""

    status: str
    name: str
    detail: str

    def line(self, width: int = 20) -> str:
        # one_line: a detail may name a path given as undecodable bytes or with a line break.
        return f"{self.status:<5} {self.name:<{width}}  {one_line(self.detail)}"


StoreFactory = Callable[[Settings], ObjectStore]
ApiFactory = Callable[[Settings], SessionHostClient]


def _doctor_s3_client(settings: Settings) -> Any:
    """A boto3 client like the daemon's but with short timeouts and two attempts (no minutes-long hang)."""
    from archiver.store import make_s3_client

    return make_s3_client(
        endpoint_url=settings.s3_endpoint_url,
        checksum_mode="when_required" if settings.s3_checksum == "when_required" else "when_supported",
        policy=STORE_INTERACTIVE,
        connect_timeout=_S3_CONNECT_TIMEOUT,
        read_timeout=_S3_READ_TIMEOUT,
    )


def default_store_factory(settings: Settings) -> ObjectStore:
    url = settings.require_store()
    client = _doctor_s3_client(settings) if url.startswith("s3://") else None
    return open_store(
        url,
        s3_endpoint_url=settings.s3_endpoint_url,
        s3_client=client,
        checksum_mode=settings.s3_checksum,
        evidence=settings.evidence,
    )


def default_api_factory(settings: Settings) -> SessionHostClient:
    url, token = settings.require_api()
    return SessionHostClient.connect(url, token, policy=_API_POLICY)


def check_upstream(settings: Settings, api_factory: ApiFactory = default_api_factory) -> CheckResult:
    """Is the token accepted? One `GET /session` (401 → rejected, 403 → lacks the scope)."""
    name = "upstream token"
    if not settings.api_url:
        return CheckResult(FAIL, name, "no upstream configured: set --api-url or ARCHIVER_API_URL")
    if settings.api_token is None:
        return CheckResult(FAIL, name, f"no API token: set {TOKEN_ENV} or --api-token-file")
    try:
        with api_factory(settings) as client:
            sessions = client.list_sessions().sessions
    except UnauthorizedError:
        return CheckResult(
            FAIL,
            name,
            f"token rejected by {settings.api_url} (401): is it current, and for this environment "
            "(sandbox and production tokens differ)?",
        )
    except ForbiddenError:
        return CheckResult(FAIL, name, f"token accepted but not allowed to list sessions (403) at {settings.api_url}")
    except ApiTransportError as exc:
        return CheckResult(FAIL, name, f"cannot reach {settings.api_url}: {exc}")
    except ApiError as exc:
        return CheckResult(FAIL, name, f"{settings.api_url}: {exc}")
    return CheckResult(OK, name, f"accepted by {settings.api_url} ({len(sessions)} active session(s) visible)")


def check_store(settings: Settings, store_factory: StoreFactory = default_store_factory) -> list[CheckResult]:
    """Store reachable (one listing), writable (probe put, head, delete), conditional writes enforced,
    and (S3) one WARN line per other guarantee the probe found missing, or one OK line for all.

    The write check is the store's own ``probe_conditional_writes``: it writes a probe object
    twice under ``{prefix}_probe/``, reads it back and deletes it (probe keys are the one
    exception to create-once), so one round trip answers both "writable" and "If-None-Match
    honoured" without leaving anything behind.
    """
    names = ("store reachable", "store writable", "conditional writes")
    if not settings.store:
        return [CheckResult(SKIP, n, "no --store configured (`run` would only export metrics)") for n in names]
    try:
        store = store_factory(settings)
    except ConfigError as exc:
        return [CheckResult(FAIL, names[0], f"store configuration: {exc}")] + [
            CheckResult(SKIP, n, "store not usable") for n in names[1:]
        ]
    try:
        try:
            next(iter(store.list_keys(store.prefix + "index/")), None)
        except ArchiverError as exc:
            return [CheckResult(FAIL, names[0], str(exc))] + [
                CheckResult(SKIP, n, "store not reachable") for n in names[1:]
            ]
        results = [CheckResult(OK, names[0], f"{store.url} (listing works)")]
        try:
            enforced = store.probe_conditional_writes()
        except ArchiverError as exc:
            return [
                *results,
                CheckResult(FAIL, names[1], str(exc)),
                CheckResult(SKIP, names[2], "not writable"),
            ]
        s3 = isinstance(store, S3Store)
        metadata = (
            ""
            if s3 or store.metadata_supported
            else "; the server drops object metadata (sha256 checks re-read objects)"
        )
        results.append(CheckResult(OK, names[1], f"probe object written, read back and deleted{metadata}"))
        missing = store.missing_guarantees() if isinstance(store, S3Store) else []
        if enforced:
            results.append(CheckResult(OK, names[2], "If-None-Match is honoured: archived objects are create-once"))
        else:
            gone = {guarantee for guarantee, _ in missing}
            calls = [op for g, op in _CREATE_ONCE_CALLS if g in gone]
            which = f" (on {' and '.join(calls)})" if calls else ""
            results.append(
                CheckResult(
                    FAIL,
                    names[2],
                    f"the server ignores If-None-Match{which}: `run` falls back to HEAD-before-PUT, where a "
                    "concurrent writer could overwrite an archived object",
                )
            )
        results.extend(CheckResult(WARN, _GUARANTEE_CHECKS[g], line) for g, line in missing if g in _GUARANTEE_CHECKS)
        if s3 and not any(g in _GUARANTEE_CHECKS for g, _ in missing):
            results.append(
                CheckResult(
                    OK,
                    "store guarantees",
                    "user metadata and SHA-256 checksums kept (`verify` proves objects without download), "
                    "optional operations implemented",
                )
            )
        return results
    finally:
        store.close()


def _kms_key_problem(key_id: str, settings: Settings) -> str | None:
    """Why the KMS key cannot encrypt (None: enabled, for encryption): one DescribeKey."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    config = Config(
        connect_timeout=_S3_CONNECT_TIMEOUT,
        read_timeout=_S3_READ_TIMEOUT,
        retries={"mode": "standard", "max_attempts": STORE_INTERACTIVE.attempts},
    )
    try:
        client = boto3.session.Session().client("kms", endpoint_url=settings.kms_endpoint_url, config=config)
        metadata = client.describe_key(KeyId=key_id)["KeyMetadata"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        return f"KMS key {key_id!r} is not usable: {error.get('Code', '?')}: {error.get('Message', '')}".rstrip(": ")
    except BotoCoreError as exc:
        return f"cannot ask KMS about key {key_id!r}: {type(exc).__name__}: {exc}"
    if metadata.get("KeyState") != "Enabled":
        return f"KMS key {key_id!r} is {metadata.get('KeyState')}, not Enabled"
    if metadata.get("KeyUsage", "ENCRYPT_DECRYPT") != "ENCRYPT_DECRYPT":
        return f"KMS key {key_id!r} is for {metadata.get('KeyUsage')}, not ENCRYPT_DECRYPT"
    return None


def _object_lock_result(store: S3Store, evidence: Evidence) -> CheckResult:
    name = "object lock"
    try:
        enabled = store.object_lock_enabled()
    except StoreUnsupportedError:
        return CheckResult(FAIL, name, f"{store.url}: the server does not implement S3 Object Lock")
    except ArchiverError as exc:
        return CheckResult(FAIL, name, f"cannot read the bucket's Object Lock configuration: {exc}")
    if not enabled:
        return CheckResult(
            FAIL,
            name,
            f"{store.url}: the bucket has no Object Lock, so {evidence.lock_mode} retention cannot be applied "
            "(Object Lock is enabled when a bucket is created, or on a versioned bucket by PutObjectLockConfiguration)",
        )
    return CheckResult(
        OK, name, f"enabled: every archived object is kept {evidence.lock_mode} for {evidence.lock_days} day(s)"
    )


def _write_settings_result(store: S3Store, evidence: Evidence) -> CheckResult:
    name = "evidence settings"
    wanted = ", ".join(f"{k}={v}" for k, v in evidence.manifest_doc().items() if not k.startswith("object_lock"))
    try:
        applied = store.probe_evidence()
    except ArchiverError as exc:
        return CheckResult(
            FAIL,
            name,
            f"the store refused a probe object written with {wanted}: {exc} (S3-compatible servers such as "
            "SeaweedFS implement no server-side encryption)",
        )
    missing = []
    if evidence.sse is not None and applied["sse"] != evidence.sse:
        missing.append(f"encryption {evidence.sse} (the server answered {applied['sse'] or 'none'})")
    key_id = evidence.kms_key_id
    if key_id is not None and not key_id.startswith("alias/") and key_id not in applied["sse_kms_key_id"]:
        missing.append(f"KMS key {evidence.kms_key_id} (the server used {applied['sse_kms_key_id'] or 'none'})")
    if evidence.storage_class is not None and applied["storage_class"] != evidence.storage_class:
        missing.append(f"storage class {evidence.storage_class} (the server answered {applied['storage_class']})")
    if evidence.tags and applied["tags"] not in ("0", str(len(evidence.tags))):
        missing.append(f"{len(evidence.tags)} tag(s) (the server kept {applied['tags']})")
    if missing:
        return CheckResult(FAIL, name, "the server silently ignored " + "; ".join(missing))
    return CheckResult(OK, name, f"a probe object written with {wanted} was stored so, then deleted")


def check_evidence(settings: Settings, store_factory: StoreFactory = default_store_factory) -> list[CheckResult]:
    """The evidence settings against the bucket: Object Lock enabled when retention is asked for,
    encryption / storage class / tags applied to a probe object, the KMS key usable (DescribeKey)."""
    evidence = settings.evidence
    if not settings.store or not evidence.active:
        return []
    try:
        store = store_factory(settings)
    except ConfigError:
        return []  # check_store reports it
    try:
        if not isinstance(store, S3Store):
            return []
        results = []
        if evidence.lock_mode is not None:
            results.append(_object_lock_result(store, evidence))
        if evidence.sse or evidence.storage_class or evidence.tags:
            results.append(_write_settings_result(store, evidence))
        if evidence.kms_key_id is not None:
            problem = _kms_key_problem(evidence.kms_key_id, settings)
            results.append(
                CheckResult(FAIL, "kms key", problem)
                if problem
                else CheckResult(OK, "kms key", f"{evidence.kms_key_id} is enabled for encryption")
            )
        return results
    finally:
        store.close()


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_state_dir(settings: Settings) -> CheckResult:
    """Can a file be created, fsynced and removed in the state directory (or where `run` will create it)?"""
    name = "state dir"
    path = settings.state_dir.expanduser()
    existing = _nearest_existing(path.absolute())
    if not existing.is_dir():
        return CheckResult(FAIL, name, f"{existing} exists but is not a directory")
    probe = existing / f".archiver-check-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"archiver check\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        fsync_dir(existing)
    except OSError as exc:
        probe.unlink(missing_ok=True)
        return CheckResult(FAIL, name, f"cannot create, fsync and remove a file in {existing}: {exc.strerror}")
    free = human_size(shutil.disk_usage(existing).free)
    if existing == path.absolute():
        return CheckResult(OK, name, f"{path} is writable ({free} free)")
    return CheckResult(OK, name, f"{path} does not exist yet; {existing} is writable, `run` creates it ({free} free)")


def run_checks(
    settings: Settings,
    *,
    store_factory: StoreFactory = default_store_factory,
    api_factory: ApiFactory = default_api_factory,
) -> list[CheckResult]:
    """Every check, in the order they are printed."""
    results = [check_upstream(settings, api_factory)]
    results.extend(check_store(settings, store_factory))
    results.extend(check_evidence(settings, store_factory))
    results.append(check_state_dir(settings))
    return results


def render_checks(results: Sequence[CheckResult], out: TextIO) -> int:
    """One line per check and the verdict; the exit code (1 when any check failed, else 0)."""
    width = max(len(r.name) for r in results)
    for result in results:
        out.write(result.line(width) + "\n")
    failed = [r.name for r in results if r.status == FAIL]
    ok = sum(1 for r in results if r.status == OK)
    skipped = sum(1 for r in results if r.status == SKIP)
    warned = sum(1 for r in results if r.status == WARN)
    if failed:
        out.write(f"verdict: NOT READY ({len(failed)} failed: {', '.join(failed)})\n")
        return 1
    counts = [f"{ok} OK", *([f"{warned} warning(s)"] if warned else []), *([f"{skipped} skipped"] if skipped else [])]
    out.write(f"verdict: READY ({', '.join(counts)})\n")
    return 0


def check(
    settings: Settings,
    out: TextIO,
    *,
    store_factory: StoreFactory = default_store_factory,
    api_factory: ApiFactory = default_api_factory,
) -> int:
    """`archiver check`: run every check, print the report, return the exit code."""
    return render_checks(run_checks(settings, store_factory=store_factory, api_factory=api_factory), out)
