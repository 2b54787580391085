"""What proves one archived object: the store's checksum (one HEAD) or a re-hash of its bytes, and
the problems `archiver verify` reports when neither does."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from archiver.errors import ObjectNotFoundError
from archiver.layout.manifest import ManifestItem
from archiver.retrieval.query import Progress
from archiver.store.base import ObjectStore, sha256_checksum
from archiver.textsafe import printable


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one archived session."""

    session_id: str
    kind: str
    key: str
    detail: str
    #: The instance archive it concerns; ``None`` for the legacy archive or the id as a whole.
    instance: str | None = None

    def line(self) -> str:
        which = f" ({printable(self.instance)})" if self.instance is not None else ""
        return f"{printable(self.session_id)}{which}: {self.kind}: {printable(self.key)}: {printable(self.detail)}"


@dataclass(slots=True)
class Tally:
    """What one archive's verification found (summed into the report)."""

    objects: int = 0
    bytes: int = 0
    proved: int = 0
    unproven: int = 0
    problems: list[Problem] = field(default_factory=list)


def rehash_object(
    store: ObjectStore, sid: str, key: str, item: ManifestItem, instance: str | None, progress: Progress | None
) -> tuple[int, Problem | None] | None:
    """(bytes read, problem or None) after re-hashing the object; None when it is gone."""
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in store.iter_bytes(key):
            digest.update(chunk)
            size += len(chunk)
            if progress is not None:
                progress(len(chunk))
    except ObjectNotFoundError:
        return None
    if size != item.size:
        return size, Problem(sid, "size_mismatch", key, f"stored {size} bytes, manifest {item.size}", instance)
    if digest.hexdigest() != item.sha256:
        detail = f"stored {digest.hexdigest()}, manifest {item.sha256}"
        return size, Problem(sid, "sha256_mismatch", key, detail, instance)
    return size, None


def checksum_verdict(recorded: str | None, stored: str | None, sha256: str) -> str | None:
    """Why the store's checksum does not prove the manifest's object (None: proved), pure.

    ``recorded``: the manifest's ``checksum_sha256``; ``stored``: what the store answers now;
    ``sha256``: the manifest's hex digest. A whole-object checksum must be the manifest's sha256
    (both as recorded and as stored); a composite (``-N``) must be the one recorded at archive time.
    Raises nothing; ``recorded`` None is the caller's "not provable" case.
    """
    if stored is None:
        return f"the object has no SHA-256 checksum, its manifest has one: replaced since (manifest {recorded})"
    whole = sha256_checksum(bytes.fromhex(sha256))
    if recorded is None or "-" not in recorded:
        if recorded is not None and recorded != whole:
            return f"manifest checksum {recorded} is not its sha256 {sha256}"
        if stored != whole:
            return f"stored checksum {stored}, manifest sha256 {sha256} (= {whole})"
        return None
    base, _, parts = recorded.partition("-")
    stored_base, dash, stored_parts = stored.partition("-")
    if stored_base != base or (dash and stored_parts != parts):
        return f"stored checksum {stored}, manifest {recorded}"
    return None


class ManifestProof:
    """Whether the store keeps a SHA-256 checksum for an archive's manifest (one HEAD, asked at most
    once, only when an object lacks the checksum its manifest recorded): a store that keeps one
    for the manifest but none for the object had that object replaced; a store that keeps none
    for either stopped keeping checksums (or never did) and cannot prove the object either way."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self._store = store
        self._key = key
        self._kept: bool | None = None

    def kept(self) -> bool:
        if self._kept is None:
            info = self._store.head(self._key)
            self._kept = info is not None and info.checksum_sha256 is not None
        return self._kept


def prove(
    store: ObjectStore,
    sid: str,
    key: str,
    item: ManifestItem,
    instance: str | None,
    tally: Tally,
    manifest_proof: ManifestProof,
) -> None:
    """Check one object by the store's checksum (one HEAD, no download): proved, not provable by
    the store (counted, ``--deep`` re-hashes it), or a problem."""
    info = store.head(key)
    if info is None:
        tally.problems.append(Problem(sid, "missing_object", key, f"{item.kind} object is gone", instance))
        return
    tally.objects += 1
    if info.size != item.size:
        tally.problems.append(
            Problem(sid, "size_mismatch", key, f"stored {info.size} bytes, manifest {item.size}", instance)
        )
        return
    assert item.sha256 is not None  # an archived item has one (ManifestItem checks)
    if item.checksum_sha256 is None and (
        info.checksum_sha256 is None or checksum_verdict(None, info.checksum_sha256, item.sha256) is not None
    ):
        tally.unproven += 1  # archived without a store checksum: --deep re-reads it
        return
    if info.checksum_sha256 is None and not manifest_proof.kept():
        tally.unproven += 1  # the store keeps no checksums (any more): not provable by it, not a mismatch
        return
    why = checksum_verdict(item.checksum_sha256, info.checksum_sha256, item.sha256)
    if why is not None:
        tally.problems.append(Problem(sid, "checksum_mismatch", key, why, instance))
    else:
        tally.proved += 1
