"""`archiver log backfill`: append the archives made before the log existed, in archive-time order.

What the log then proves for them is existence since they were logged (the checkpoint that first
holds them), not since they were archived: their manifests' ``archived_at`` is the studio's word.
Archives already a leaf of any log in the store are skipped, so running it twice appends nothing.

Archives younger than ``min_age`` (an hour by default) are left to the daemons: a daemon running
with the log queues each archive's leaf in the transaction that marks it archived and checkpoints
it within ``--tlog-interval``, so an archive just made may be in a daemon's queue but in no
checkpoint yet; appending it here too would make it a leaf of two logs. Run the backfill again
later to pick up what was too recent (it is idempotent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from archiver.errors import LogError, ManifestError
from archiver.layout import keys
from archiver.layout.manifest import parse_manifest
from archiver.store.base import ObjectStore
from archiver.tlog.leaf import Leaf, format_time
from archiver.tlog.log import LogReader, TileLog, read_object, writers
from archiver.tlog.note import Signer
from archiver.tlog.prove import write_locators
from archiver.tlog.witness import Witness

#: Leaves per checkpoint.
BATCH = 10_000
#: Archives younger than this (seconds) are left to the daemons that made them (see above).
MIN_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class BackfillReport:
    appended: int
    already_logged: int
    unreadable: int
    size: int
    #: Archived less than ``min_age`` ago: left to the daemons' own logs.
    too_recent: int = 0


def logged_manifests(store: ObjectStore, signer: Signer) -> set[str]:
    """The manifest SHA-256 of every leaf of every log in the store (checkpointed ones)."""
    found: set[str] = set()
    for writer in writers(store):
        reader = LogReader(store, writer)
        head = reader.head(signer.verifier)
        if head is None:
            continue
        size = head.checkpoint.size
        for _, entry in reader.entries(0, size, size):
            try:
                found.add(Leaf.decode(entry).manifest_sha256)
            except LogError:
                continue
    return found


def backfill(
    store: ObjectStore,
    signer: Signer,
    writer: str,
    clock: Callable[[], float],
    *,
    witness: Witness | None = None,
    min_age: float = MIN_AGE,
) -> BackfillReport:
    """Append every archive in no log yet and archived at least ``min_age`` s before ``clock()``."""
    horizon = clock() - min_age
    logged = logged_manifests(store, signer)
    pending: list[tuple[float, str, Leaf]] = []
    skipped = unreadable = too_recent = 0
    for key in store.list_keys(keys.check_prefix(store.prefix) + "sessions/"):
        if not key.endswith("/manifest.json"):
            continue
        data = read_object(store, key)
        sha = hashlib.sha256(data).hexdigest()
        if sha in logged:
            skipped += 1
            continue
        try:
            manifest = parse_manifest(data)
        except ManifestError:
            unreadable += 1
            continue
        if keys.manifest_key(store.prefix, manifest.session_id, manifest.instance) != key:
            unreadable += 1  # a manifest at another archive's key: not ours to vouch for
            continue
        if manifest.archived_at > horizon:
            too_recent += 1  # possibly queued by the daemon that made it, not yet checkpointed
            continue
        leaf = Leaf.of(sha, manifest.session_id, manifest.instance, manifest.archived_at)
        pending.append((manifest.archived_at, key, leaf))
    pending.sort(key=lambda item: (item[0], item[1]))
    log = TileLog(store, writer, signer)
    log.open()
    for start in range(0, len(pending), BATCH):
        batch = [leaf for _, _, leaf in pending[start : start + BATCH]]
        encoded = [leaf.encode() for leaf in batch]
        first = log.append(encoded)
        if witness is not None and log.last is not None:
            witness.record(writer, log.last.checkpoint.size, log.last.note)
        write_locators(store, writer, [(first + i, e) for i, e in enumerate(encoded)], format_time(clock()))
    return BackfillReport(len(pending), skipped, unreadable, log.size, too_recent)
