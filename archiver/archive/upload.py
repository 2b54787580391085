"""The upload stage's I/O: spool file → create-once object (verified), and a session's manifest + index entry.

Store errors are not handled here: `StoreUnavailableError` / `StorePermissionError` propagate to
the pipeline, which pauses the stage and retries; spool files are deleted by the pipeline only
after the row that no longer needs them is committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.archive.state import ItemRow, SessionRow
from archiver.errors import ObjectConflictError, SourceFileError, StoreUnavailableError
from archiver.layout import keys
from archiver.layout.manifest import (
    Manifest,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
)
from archiver.store.base import MultipartJournal, ObjectStore, PutOutcome
from archiver.vocabulary import Outcome

log = logging.getLogger("archiver.upload")  # the name it had before the rooms: log filters keep working

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Stored:
    """The object is at its key with our size and sha256 (freshly created or already there)."""

    outcome: PutOutcome


@dataclass(frozen=True, slots=True)
class Conflict:
    """A different object already occupies the key: the item's outcome is `conflict`."""

    error: str


@dataclass(frozen=True, slots=True)
class SpoolBroken:
    """The spool file is missing or no longer matches its recorded sha256/size: fetch it again."""

    error: str


UploadResult = Stored | Conflict | SpoolBroken


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


class Uploader:
    """Writes spooled items and manifests to the store (blocking; called from upload workers)."""

    def __init__(self, store: ObjectStore, journal: MultipartJournal) -> None:
        self.store = store
        self._journal = journal

    def upload(self, item: ItemRow) -> UploadResult:
        """Store the item's spool file at its key and verify it with a HEAD."""
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
            return Conflict(str(exc))
        except SourceFileError as exc:
            return SpoolBroken(str(exc))
        self._verify(item.key, item.size, item.sha256)
        crashpoint("after_upload_complete")
        return Stored(outcome)

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

    def write_manifest(self, session: SessionRow, items: Sequence[ItemRow]) -> str:
        """Manifest (create-once, after every object of the session), then the index entry.

        Returns the manifest key. A different manifest already at the key raises
        ObjectConflictError.
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
        self.store.put_bytes(manifest_key, manifest_to_bytes(manifest), content_type=JSON_CONTENT_TYPE)
        crashpoint("after_manifest")
        entry = index_entry_for(manifest, manifest_key)
        self.store.put_bytes(
            keys.index_key(prefix, manifest.ended_at, session.id, instance),
            index_entry_to_bytes(entry),
            content_type=JSON_CONTENT_TYPE,
        )
        return manifest_key
