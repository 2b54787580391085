"""`archiver get`: a session's archive downloaded to disk, every byte hashed against its manifest, artifacts unpacked"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from archiver.errors import (
    ArchiveIntegrityError,
    LocalFileError,
)
from archiver.layout import keys
from archiver.layout.manifest import (
    Manifest,
    ManifestItem,
)
from archiver.retrieval.query import (
    ArchiveRef,
    LoadedArchive,
    Progress,
    Warn,
    item_key,
    load_archive,
    quiet,
    stderr_note,
)
from archiver.retrieval.reading import print_logs
from archiver.retrieval.render import human_size
from archiver.retrieval.safetar import ExtractResult, safe_extract
from archiver.store.base import ObjectStore, hash_file
from archiver.textsafe import printable
from archiver.vocabulary import Outcome


@dataclass(frozen=True, slots=True)
class DownloadedFile:
    """One object now on local disk, verified."""

    path: Path
    key: str
    size: int
    sha256: str
    #: Already there with the right sha256 from an earlier run: not downloaded again.
    reused: bool = False


@dataclass(slots=True)
class DownloadResult:
    """What `archiver get` produced."""

    directory: Path
    manifest: Manifest
    files: list[DownloadedFile] = field(default_factory=list)
    #: Items the archive holds no bytes for (source_gone, too_large, expired, conflict).
    not_archived: list[ManifestItem] = field(default_factory=list)
    #: Relative artifact name → what extraction did (``--extract``).
    extracted: dict[str, ExtractResult] = field(default_factory=dict)
    #: Artifacts whose extraction was skipped and why (already extracted, damaged archive).
    extract_skipped: dict[str, str] = field(default_factory=dict)
    logs_text: Path | None = None


def download_size(m: Manifest) -> int:
    """Bytes `get` downloads for this manifest (for a progress bar's length)."""
    return m.total_bytes


def session_dir_name(sid: str, instance: str | None = None) -> str:
    """The local directory name of an archive: the escaped id, ``.{instance}`` appended for an instance archive.

    No `/`, no leading dot, ≤ 171 chars; the escaped id never contains ``.``, so the legacy
    archive and every instance of one id get distinct directories.
    """
    escaped = keys.escape_session_id(sid)
    if instance is None:
        return escaped
    if not keys.is_instance_name(instance):
        raise ValueError(f"not an instance name: {instance[:60]!r}")
    return f"{escaped}.{instance}"


def _download(
    store: ObjectStore, key: str, target: Path, size: int, sha256: str, progress: Progress | None
) -> DownloadedFile:
    """Stream one object to ``target`` via ``target.partial``, verifying size and sha256 before the rename."""
    if target.is_file() and not target.is_symlink():
        have_sha, have_size = hash_file(target)
        if have_sha == sha256 and have_size == size:
            if progress is not None:
                progress(size)
            return DownloadedFile(target, key, size, sha256, reused=True)
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    written = 0
    # O_NOFOLLOW: never write through a symlink someone left at the .partial name.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in store.iter_bytes(key):
                digest.update(chunk)
                written += len(chunk)
                f.write(chunk)
                if progress is not None:
                    progress(len(chunk))
        got = digest.hexdigest()
        if got != sha256 or written != size:
            raise ArchiveIntegrityError(
                f"{printable(key)}: downloaded {written} bytes with sha256 {got}, but the manifest says "
                f"{size} bytes with sha256 {sha256}; not kept"
            )
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return DownloadedFile(target, key, size, sha256)


def _write_logs_text(store: ObjectStore, sid: str, ref: ArchiveRef, target: Path) -> Path:
    partial = target.with_name(target.name + ".partial")
    try:
        with partial.open("w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            print_logs(store, sid, f, escape=False, warn=quiet, instance=ref.name, note=quiet)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target


def download_session(
    store: ObjectStore,
    sid: str,
    out_dir: Path,
    *,
    extract: bool = False,
    progress: Progress | None = None,
    loaded: LoadedArchive | None = None,
    instance: str | None = None,
    note: Warn = stderr_note,
) -> DownloadResult:
    """`archiver get`: everything of one archive of a session into ``out_dir/{session_dir_name}/``, verified.

    The newest archive, or the one named ``instance`` (see :func:`load_archive`); an instance
    archive goes to ``<escaped sid>.<instance>/``, the legacy one to ``<escaped sid>/``, so two
    archives of one id never overwrite each other.

    Layout: ``manifest.json`` (the stored bytes), ``logs.txt.gz``/``logs.jsonl.gz`` and
    ``artifacts/{slug}-{hash8}.tar.gz`` exactly as stored. Each object is streamed to
    ``.partial``, hashed on the way, and renamed only when size and sha256 match the manifest
    (else ``ArchiveIntegrityError`` naming the key and both hashes; the partial file is removed).
    Files already present with the right hash are kept (a re-run resumes cheaply).

    ``extract``: also ``logs.txt`` (plain lines, as `archiver logs` prints them) and each artifact
    unpacked by :func:`archiver.retrieval.safetar.safe_extract` into ``artifacts/{slug}-{hash8}/`` (unsafe
    members skipped and listed in the result). An existing extraction directory is left alone
    (never delete what a user may have edited). ``progress`` is called with byte counts;
    ``loaded`` is what :func:`load_manifest` returned, when the caller already has it (to size
    a progress bar). Local write failures raise ``LocalFileError``.
    """
    if loaded is None:
        loaded = load_archive(store, sid, instance, note=note)
    try:
        return _download_session(store, sid, out_dir, loaded, extract, progress)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else f" under {out_dir}"
        raise LocalFileError(f"cannot write{where}: {exc.strerror or exc}") from None


def _download_session(
    store: ObjectStore,
    sid: str,
    out_dir: Path,
    loaded: LoadedArchive,
    extract: bool,
    progress: Progress | None,
) -> DownloadResult:
    manifest, data, ref = loaded.manifest, loaded.data, loaded.ref
    directory = out_dir / session_dir_name(sid, ref.instance)
    directory.mkdir(parents=True, exist_ok=True)
    result = DownloadResult(directory, manifest)
    tmp = directory / f"manifest.json.{uuid.uuid4().hex}.partial"
    tmp.write_bytes(data)
    os.replace(tmp, directory / "manifest.json")

    for item in manifest.items:
        if item.outcome != Outcome.ARCHIVED:
            result.not_archived.append(item)
            continue
        key, relative = item_key(store, sid, item, ref.instance)
        assert item.size is not None and item.sha256 is not None  # guaranteed for archived items
        result.files.append(_download(store, key, directory / relative, item.size, item.sha256, progress))

    if not extract:
        return result
    if any(i.kind == "logs" and i.outcome == Outcome.ARCHIVED for i in manifest.items):
        result.logs_text = _write_logs_text(store, sid, ref, directory / "logs.txt")
    for downloaded in result.files:
        relative = downloaded.path.relative_to(directory).as_posix()
        if not relative.startswith("artifacts/"):
            continue
        target = downloaded.path.with_name(downloaded.path.name.removesuffix(".tar.gz"))
        if target.exists() or target.is_symlink():
            result.extract_skipped[relative] = f"{target.name}/ already exists (remove it to extract again)"
            continue
        try:
            result.extracted[relative] = safe_extract(downloaded.path, target)
        except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
            # The downloaded file matched its sha256: the upstream sent a damaged archive. Keep it.
            result.extract_skipped[relative] = f"not a readable .tar.gz ({type(exc).__name__}: {exc})"
    return result


def render_download(result: DownloadResult, out: TextIO) -> None:
    """A short summary of `get`: where things went, what was not archived, what extraction refused."""
    fetched = sum(1 for f in result.files if not f.reused)
    reused = len(result.files) - fetched
    total = sum(f.size for f in result.files)
    out.write(
        f"{printable(result.manifest.session_id)}: {len(result.files)} file(s), {human_size(total)}, "
        f"sha256 verified -> {printable(str(result.directory))}"
        + (f" ({reused} already present)" if reused else "")
        + "\n"
    )
    for f in result.files:
        out.write(f"  {f.path.relative_to(result.directory).as_posix():<60} {human_size(f.size):>10}\n")
    if result.logs_text is not None:
        out.write(f"  {result.logs_text.name:<60} (plain lines)\n")
    for item in result.not_archived:
        what = item.path if item.kind == "artifact" and item.path else "logs"
        reason = f": {item.error}" if item.error else ""
        out.write(f"  not archived: {printable(what)} ({item.outcome}{printable(reason)})\n")
    for relative, extracted in result.extracted.items():
        out.write(
            f"  extracted {relative} -> {extracted.destination.relative_to(result.directory).as_posix()}/ "
            f"({extracted.files} file(s), {human_size(extracted.bytes_written)})\n"
        )
        for refusal in extracted.refused:
            out.write(f"    refused {printable(refusal.member)}: {printable(refusal.reason)}\n")
    for relative, why in result.extract_skipped.items():
        out.write(f"  not extracted {relative}: {why}\n")


# --- verify -----------------------------------------------------------------------------------
