"""`archiver check`: the configuration doctor (token accepted, store usable, state dir writable).

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

from archiver.errors import (
    ApiError,
    ApiTransportError,
    ArchiverError,
    ConfigError,
    ForbiddenError,
    UnauthorizedError,
)
from archiver.retrieval.retrieve import human_size
from archiver.retry import STORE_INTERACTIVE, UPSTREAM_REQUEST_INTERACTIVE
from archiver.settings import TOKEN_ENV, Settings
from archiver.store import ObjectStore, open_store
from archiver.upstream.api import SessionHostClient

OK = "OK"
FAIL = "FAIL"
SKIP = "SKIP"

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
        return f"{self.status:<5} {self.name:<{width}}  {self.detail}"


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
    """Store reachable (one listing), writable (probe put, head, delete), conditional writes enforced.

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
        metadata = (
            "" if store.metadata_supported else "; the server drops object metadata (sha256 checks re-read objects)"
        )
        results.append(CheckResult(OK, names[1], f"probe object written, read back and deleted{metadata}"))
        if enforced:
            results.append(CheckResult(OK, names[2], "If-None-Match is honoured: archived objects are create-once"))
        else:
            results.append(
                CheckResult(
                    FAIL,
                    names[2],
                    "the server ignores If-None-Match: `run` would fall back to HEAD-before-PUT, where a "
                    "concurrent writer could overwrite an archived object",
                )
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
        dir_fd = os.open(existing, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
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
    if failed:
        out.write(f"verdict: NOT READY ({len(failed)} failed: {', '.join(failed)})\n")
        return 1
    out.write(f"verdict: READY ({ok} OK" + (f", {skipped} skipped" if skipped else "") + ")\n")
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
