"""The upload stage's I/O: spool file → create-once object (verified), and a session's manifest + index entry.

Store errors are not handled here: `StoreUnavailableError` / `StorePermissionError` propagate to
the pipeline, which pauses the stage and retries; spool files are deleted by the pipeline only
after the row that no longer needs them is committed.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.archive.replicas import same_archive
from archiver.archive.state import ItemRow, SessionRow
from archiver.errors import (
    ArchiveIntegrityError,
    ManifestError,
    ObjectConflictError,
    ObjectNotFoundError,
    SourceFileError,
    StoreUnavailableError,
)
from archiver.layout import keys
from archiver.layout.manifest import (
    Manifest,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
    parse_manifest,
)
from archiver.layout.players import player_entries
from archiver.store.base import READ_CHUNK, MultipartJournal, ObjectStore, PutOutcome
from archiver.store.gzipstream import Hashing, gunzip
from archiver.vocabulary import Outcome

log = logging.getLogger("archiver.upload")  # the name it had before the rooms: log filters keep working

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Stored:
    """The object is at its key with our size and sha256 (freshly created or already there), or,
    for a log, with our uncompressed bytes compressed by another archiver (`theirs`)."""

    outcome: PutOutcome
    #: The size and sha256 of the object at the key when it is another archiver's gzip of the very
    #: log we fetched: recorded instead of ours, since that object is the archive's evidence.
    theirs: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class Conflict:
    """A different object already occupies the key: the item's outcome is `conflict`."""

    error: str


@dataclass(frozen=True, slots=True)
class SpoolBroken:
    """The spool file is missing or no longer matches its recorded sha256/size: fetch it again."""

    error: str


UploadResult = Stored | Conflict | SpoolBroken


@dataclass(frozen=True, slots=True)
class LogDigests:
    """A stored gzip log's size and sha256, and the sha256 of what it decompresses to."""

    size: int
    sha256: str
    content_sha256: str


def log_digests(chunks: Iterable[bytes], key: str) -> LogDigests:
    """Digests of a gzip stream read once; ArchiveIntegrityError when it is not valid gzip."""
    packed = Hashing(chunks)
    content = hashlib.sha256()
    for out in gunzip(packed, key):
        content.update(out)
    if not packed.size:
        # No gzip member at all is not the gzip of an empty log (which is 20 bytes).
        raise ArchiveIntegrityError(f"{key} is empty, not gzip")
    return LogDigests(packed.size, packed.digest.hexdigest(), content.hexdigest())


def build_session_manifest(
    session: SessionRow,
    items: Sequence[ItemRow],
    checksums: Mapping[int, str | None] | None = None,
    evidence: Mapping[str, str] | None = None,
) -> Manifest:
    """The manifest of a session whose items all have an outcome (pure: same rows, same bytes).

    The row's instance (its creation time, see ``keys.instance_name``) is recorded in the
    manifest; a row migrated mid-way (instance '') writes a legacy-layout manifest.

    Everything comes from the state DB, including `archived_at` (fixed when the last item
    finished), so a manifest re-written after a crash is byte-identical to the first one; so do
    ``checksums`` (item id → the store's checksum of its object, see ``ObjectStore.store_checksum``)
    and ``evidence`` (the store's evidence settings, ``Evidence.manifest_doc``).
    """
    if session.archived_at is None:
        raise ValueError(f"session {session.id!r} is not finalizing (no archived_at)")
    entries = []
    for item in items:
        if item.outcome is None:
            raise ValueError(f"item {item.id} of session {session.id!r} has no outcome")
        stored = item.outcome in (Outcome.ARCHIVED, Outcome.CONFLICT)
        entries.append(
            ManifestItem(
                kind=item.kind,
                source=item.source,
                outcome=item.outcome,
                key=item.key if stored else None,
                size=item.size if stored else None,
                sha256=item.sha256 if stored else None,
                content_type=item.content_type if stored else None,
                path=item.path if item.kind == "artifact" else None,
                error=None if item.outcome == Outcome.ARCHIVED else item.last_error,
                checksum_sha256=(checksums or {}).get(item.id) if item.outcome == Outcome.ARCHIVED else None,
                capture=item.capture if stored else None,
            )
        )
    return build_manifest(
        session_id=session.id,
        image=session.image,
        tag=session.tag,
        location=session.location,
        host=session.host,
        created=session.created,
        labels=session.labels,
        players=session.players,
        player_count=session.player_count,
        last_status=session.status,
        last_seen_active=session.last_seen_active,
        first_seen_ended=session.first_seen_ended,
        fetch_deadline=session.fetch_deadline,
        archived_at=session.archived_at,
        items=entries,
        instance=session.instance or None,
        evidence=evidence,
    )


@dataclass(frozen=True, slots=True)
class WrittenManifest:
    """A committed archive: its manifest's key, the SHA-256 of our manifest's bytes, and whether the
    stored manifest is ours (False: another replica's, recognised as the same archive)."""

    key: str
    sha256: str
    manifest: Manifest
    ours: bool


class Uploader:
    """Writes spooled items and manifests to the store (blocking; called from upload workers)."""

    def __init__(self, store: ObjectStore, journal: MultipartJournal) -> None:
        self.store = store
        self._journal = journal
        #: Called when a manifest found at our key records the same archive (another replica's).
        self.on_recognised: Callable[[], None] | None = None

    def upload(self, item: ItemRow) -> UploadResult:
        """Store the item's spool file at its key, verified (by the create-once write itself, or a HEAD)."""
        if item.key is None or item.spool_path is None or item.sha256 is None or item.size is None:
            return SpoolBroken(f"item {item.id} is spooled without key/path/sha256/size")
        try:
            outcome = self.store.put_file(
                item.key,
                Path(item.spool_path),
                sha256=item.sha256,
                size=item.size,
                content_type=item.content_type or "application/octet-stream",
                journal=self._journal,
            )
        except ObjectConflictError as exc:
            if item.kind != "logs":
                return Conflict(str(exc))
            try:
                theirs = self._same_log(item.key, Path(item.spool_path))
            except OSError as read_error:
                return SpoolBroken(f"{item.spool_path}: {read_error.strerror or read_error}")
            if theirs is None:
                return Conflict(str(exc))
            log.info("logs of %r: %s holds the same log, compressed by another archiver; recorded as archived",
                     item.session_id, item.key)  # fmt: skip
            crashpoint("after_upload_complete")
            return Stored(PutOutcome.ALREADY_PRESENT, theirs=theirs)
        except SourceFileError as exc:
            return SpoolBroken(str(exc))
        if not (outcome is PutOutcome.CREATED and self.store.conditional_writes):
            # A create-once write the server accepted already proves the object: it was created by
            # this very request (If-None-Match held) from bytes the server checked against the
            # checksum sent with them, so a HEAD would only repeat it (one round trip per object,
            # a sixth of a small object's upload time). Without enforced If-None-Match, or when
            # the object was already there, the HEAD is what tells ours from a concurrent writer's.
            self._verify(item.key, item.size, item.sha256)
        crashpoint("after_upload_complete")
        return Stored(outcome)

    def _same_log(self, key: str, spool_path: Path) -> tuple[int, str] | None:
        """(size, sha256) of the object at `key` when it decompresses to the same bytes as our spooled
        log, else None (the conflict stands).

        Archivers of other versions (a replica mid-upgrade) or other zlib builds compress the same
        log into other gzip bytes; the evidence is the log, not its compression. OSError: our
        spool file cannot be read.
        """
        try:
            theirs = log_digests(self.store.iter_bytes(key), key)
        except ObjectNotFoundError:
            # Gone between the refused write and this read (a lifecycle rule, an operator): decide later.
            raise StoreUnavailableError(f"{key}: refused a create-once write, then was not there") from None
        except ArchiveIntegrityError:
            return None
        with spool_path.open("rb") as spooled:
            try:
                ours = log_digests(iter(functools.partial(spooled.read, READ_CHUNK), b""), str(spool_path))
            except ArchiveIntegrityError:
                return None
        if theirs.content_sha256 != ours.content_sha256:
            return None
        # The manifest will record the checksum the store keeps for an object of that size and sha256
        # as we write them; one written otherwise (no checksum, or multipart where we send one PUT)
        # would then fail `archiver verify`: not adopted, the conflict stands.
        expected = self.store.store_checksum(key, sha256=theirs.sha256, size=theirs.size)
        if expected is not None:
            info = self.store.head(key)
            kept = info.checksum_sha256 if info is not None else None
            if kept is None or kept.split("-")[0] != expected.split("-")[0]:
                return None
        return theirs.size, theirs.sha256

    def _verify(self, key: str, size: int, sha256: str) -> None:
        """HEAD the object: our size and sha256 must be there before the spool file may go."""
        info = self.store.head(key)
        if info is None:
            # Written a moment ago, absent now: an eventually consistent listing or a lagging
            # replica. Not decided: retry (the next put finds it, or writes it).
            raise StoreUnavailableError(f"{key}: stored but not visible to HEAD yet")
        sha_ok = info.sha256 == sha256 or (info.sha256 is None and not self.store.metadata_supported)
        if info.size != size or not sha_ok:
            raise StoreUnavailableError(
                f"{key}: HEAD shows size {info.size} / sha256 {str(info.sha256)[:16]}, "
                f"expected {size} / {sha256[:16]}; retrying"
            )

    def write_manifest(self, session: SessionRow, items: Sequence[ItemRow]) -> WrittenManifest:
        """Manifest (create-once, after every object of the session), then the index entry, then
        one player index entry per player.

        Returns the manifest key and what it is (``ours`` False when another replica's manifest of
        the same archive was there: that replica logs it). A different manifest already at the key
        raises ObjectConflictError.
        """
        checksums = {
            item.id: self.store.store_checksum(item.key, sha256=item.sha256, size=item.size)
            for item in items
            if item.outcome == Outcome.ARCHIVED and item.key and item.sha256 and item.size is not None
        }
        manifest = build_session_manifest(session, items, checksums, self.store.evidence.manifest_doc())
        prefix = self.store.prefix
        instance = session.instance or None  # '' = a row migrated mid-way keeps the legacy layout
        manifest_key = keys.manifest_key(prefix, session.id, instance)
        body = manifest_to_bytes(manifest)
        ours = True
        try:
            self.store.put_bytes(manifest_key, body, content_type=JSON_CONTENT_TYPE)
        except ObjectConflictError:
            theirs = self._existing_manifest(manifest_key)
            if theirs is None or not same_archive(manifest, theirs):
                raise
            # Another replica (or the session's earlier owner) won the create-once race with the
            # same evidence: that is success. Its index entry is ours to ensure (same bytes as its
            # own, so a no-op unless it died between the two writes).
            manifest = theirs
            ours = False
            if self.on_recognised is not None:
                self.on_recognised()
            log.info("session %r: the same archive is in the store already (another replica): %s",
                     session.id, manifest_key)  # fmt: skip
        crashpoint("after_manifest")
        entry = index_entry_for(manifest, manifest_key)
        self.store.put_bytes(
            keys.index_key(prefix, manifest.ended_at, session.id, instance),
            index_entry_to_bytes(entry),
            content_type=JSON_CONTENT_TYPE,
        )
        self._write_player_entries(manifest, manifest_key)
        return WrittenManifest(manifest_key, hashlib.sha256(body).hexdigest(), manifest, ours)

    def _existing_manifest(self, key: str) -> Manifest | None:
        """The manifest at `key`, None when it cannot be read as one (then the conflict stands)."""
        try:
            return parse_manifest(b"".join(self.store.iter_bytes(key)))
        except ManifestError:
            return None

    def _write_player_entries(self, manifest: Manifest, manifest_key: str) -> None:
        """One entry per player under ``players/`` (after the index entry), so `ls --player` needs no scan."""
        for key, body in player_entries(self.store.prefix, manifest, manifest_key):
            try:
                self.store.put_bytes(key, body, content_type=JSON_CONTENT_TYPE)
            except ObjectConflictError as exc:
                # Other bytes under this archive's own entry (an older archiver's format): keep
                # them, the archive itself is complete; the others are still written.
                log.warning("player index entry not replaced: %s", exc)
