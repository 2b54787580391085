"""Archives someone else wrote first: what makes two manifests of one instance the same archive (pure),
and the store check a fetch makes first when several daemons may archive the same session.

Two replicas of a shard (and, after a change of the shard count, the session's old and new owner)
archive the same instance independently, with the store's create-once writes as the only
coordination: the first complete manifest wins. The manifests of two archivers differ in their
timestamps (when each saw the end, fixed its deadline, finished), so "the same archive" means the
same session instance and the same items, each with the same outcome, key, size and sha256: the
same evidence, byte for byte. Everything else in a manifest describes the archiver, not the evidence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from archiver.archive.state import ItemRow, StateDB
from archiver.errors import StoreError
from archiver.layout import keys
from archiver.layout.manifest import Manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store.base import ObjectStore
from archiver.vocabulary import ItemStatus

log = logging.getLogger("archiver.pipeline")

#: What of a manifest item is evidence: kind, artifact path, outcome, and the stored object.
ItemSignature = tuple[str, str | None, str, str | None, int | None, str | None]


def evidence_of(manifest: Manifest) -> tuple[str, str | None, tuple[ItemSignature, ...]]:
    """The session instance and its items' evidence, in a canonical order (timestamps, errors,
    players and the archiver's version left out)."""
    items = sorted(
        ((i.kind, i.path, i.outcome, i.key, i.size, i.sha256) for i in manifest.items),
        key=lambda sig: tuple("" if v is None else str(v) for v in sig),
    )
    return manifest.session_id, manifest.instance, tuple(items)


def same_archive(ours: Manifest, theirs: Manifest) -> bool:
    """Whether an existing manifest records the very evidence we were about to record."""
    return evidence_of(ours) == evidence_of(theirs)


@dataclass(frozen=True, slots=True)
class Stagger:
    """Replica r of a shard gives the replicas before it a head start of `delay` (r x the pipeline's
    `replica_stagger`) before it fetches a session's items, so a healthy pair fetches each session
    once: replica 0 archives, replica 1 then finds the manifest. `window` is retention - margin,
    which places the session's end (last seen alive) at `item.deadline - window`."""

    delay: float = 0.0
    window: float = 0.0


def head_start_left(item: ItemRow, now: float, stagger: Stagger) -> float:
    """Seconds this replica still waits before the first fetch of `item` (0: fetch now). Only the
    first attempt waits, and never when the deadline is less than four head starts away."""
    if stagger.delay <= 0 or item.attempts > 1 or item.deadline - now < 4 * stagger.delay:
        return 0.0
    return max(0.0, item.deadline - stagger.window + stagger.delay - now)


class ArchiveCheck:
    """Before fetching an item: is its session instance archived in the store already (its manifest
    exists)? Then the session is recorded archived here without fetching or writing anything. A
    replica after the first also waits out its head start (`Stagger`) before a first fetch.

    Best effort by design: the fetch is bound to the upstream's removal deadline and must never wait
    on the store, so a store error means "not known to be archived" and the fetch goes on.
    """

    def __init__(
        self,
        store: ObjectStore,
        state: StateDB,
        metrics: SelfMetrics,
        clock: Callable[[], float],
        remove_spool_file: Callable[[Path], None],
        *,
        stagger: Stagger = Stagger(),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._state = state
        self._metrics = metrics
        self._clock = clock
        self._remove = remove_spool_file
        self._stagger = stagger
        self._mono = monotonic

    def skip_fetch(self, item: ItemRow) -> bool:
        """True when the item is not to be fetched now: archived by another daemon (and now so
        recorded here), or put back until this replica's head start is over."""
        if self.archived_elsewhere(item):
            return True
        wait = head_start_left(item, self._clock(), self._stagger)
        if wait <= 0:
            return False
        self._state.retry_item(
            item.id,
            status=ItemStatus.PENDING_FETCH,
            not_before=self._mono() + wait,
            error=f"giving the shard's other replicas a {self._stagger.delay:.0f} s head start",
            instance=item.instance,
        )
        return True

    def archived_elsewhere(self, item: ItemRow) -> bool:
        """True when the item's session was archived by another daemon (and is now so recorded here)."""
        manifest_key = keys.manifest_key(self._store.prefix, item.session_id, item.instance or None)
        try:
            found = self._store.head(manifest_key)
        except StoreError as exc:
            log.debug("could not check for an existing archive of %r (fetching): %s", item.session_id, exc)
            return False
        if found is None:
            return False
        now = self._clock()
        recorded = self._state.archived_elsewhere(item.session_key, manifest_key, now)
        if recorded is None:
            return False
        spooled, first = recorded
        for path in spooled:
            self._remove(Path(path))
        if not first:  # another fetch worker here recorded it a moment ago, and counted it
            return True
        self._metrics.archive_recognised(now)
        log.info("session %r is archived already (another replica or shard): %s", item.session_id, manifest_key)
        return True
