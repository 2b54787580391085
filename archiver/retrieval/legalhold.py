"""`archiver hold` / `archiver release`: a legal hold placed on (or cleared from) every object of one
archive of a session, so nobody can delete it whatever its retention says."""

from __future__ import annotations

from dataclasses import dataclass

from archiver.errors import ArchiveIntegrityError
from archiver.layout import keys
from archiver.retrieval.query import LoadedArchive, item_key, load_archive
from archiver.store.base import ObjectStore
from archiver.textsafe import printable
from archiver.vocabulary import Outcome


@dataclass(frozen=True, slots=True)
class HoldResult:
    """Which archive, and the keys whose legal hold was set (or cleared)."""

    session_id: str
    archive: str
    on: bool
    keys: tuple[str, ...]

    def line(self) -> str:
        verb = "placed on" if self.on else "released from"
        return (
            f"legal hold {verb} {len(self.keys)} object(s) of {printable(self.session_id)} ({printable(self.archive)})"
        )


def archive_keys(store: ObjectStore, loaded: LoadedArchive) -> list[str]:
    """Every object of the archive: its archived items (keys re-derived, never taken from the manifest
    as is), the manifest and the index entry."""
    manifest = loaded.manifest
    sid, instance = manifest.session_id, loaded.ref.instance
    found = []
    for item in manifest.items:
        if item.outcome == Outcome.ARCHIVED:
            key, _ = item_key(store, sid, item, instance)
            found.append(key)
    found.append(loaded.ref.manifest_key)
    found.append(keys.index_key(store.prefix, manifest.ended_at, sid, instance))
    return found


def set_legal_hold(store: ObjectStore, session_id: str, *, on: bool, instance: str | None = None) -> HoldResult:
    """Place (``on``) or clear the legal hold on every object of the newest archive of ``session_id``
    (or of ``instance``). Raises SessionNotArchivedError, ArchiveIntegrityError, StoreError (a bucket
    without Object Lock refuses); objects held before a failure stay held (running it again is safe)."""
    loaded = load_archive(store, session_id, instance)
    if loaded.manifest.session_id != session_id:  # load_archive checks this; a hold must never stray
        raise ArchiveIntegrityError(f"manifest of {printable(session_id)} names another session")
    targets = archive_keys(store, loaded)
    for key in targets:
        store.set_legal_hold(key, on)
    return HoldResult(session_id, loaded.ref.name, on, tuple(targets))
