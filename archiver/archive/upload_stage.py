"""The upload stage: spooled items go to the store, then each complete session's manifest and index entry.

Only the fetch is bound to the upstream's removal deadline: a store outage pauses this stage (with
backoff) and costs latency, never data, since the spool file and its `spooled` row stay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from archiver.archive.outcomes import OutcomeCommitter
from archiver.archive.spool import Spool
from archiver.archive.stage import FETCH, UPLOAD, Stage, StageParts, backoff
from archiver.archive.state import ArchivedMark, ItemRow, SessionRow
from archiver.archive.upload import Conflict, SpoolBroken, Stored, Uploader
from archiver.durable import fsync_dir
from archiver.errors import (
    InvalidKeyError,
    ObjectConflictError,
    StoreError,
    StorePermissionError,
    StoreUnsupportedError,
)
from archiver.layout import keys
from archiver.store.base import ObjectStore
from archiver.tlog.leaf import Leaf
from archiver.vocabulary import ItemStatus, Outcome

log = logging.getLogger("archiver.pipeline")  # one logger for the whole pipeline, as before the split


class UploadStage(Stage):
    """Upload workers: store spooled items (create-once, verified), write manifests last, and pause
    the whole stage while the store fails."""

    def __init__(
        self, store: ObjectStore, uploader: Uploader, spool: Spool, conflicts_dir: Path, parts: StageParts
    ) -> None:
        super().__init__(parts)
        self.store = store
        self.uploader = uploader
        self.spool = spool
        self._conflicts_dir = conflicts_dir
        #: Queue each archive we commit for the transparency log (set when a log key is configured).
        self.log_leaves = False
        self.committer = OutcomeCommitter(
            self.state,
            spool,
            self.metrics,
            self.wake,
            self.clock,
            idle_wait=self.tuning.idle_wait,
            gather=self.tuning.outcome_gather,
        )
        # Stage pause after store failures (monotonic).
        self._pause_lock = threading.Lock()
        self._paused_until = 0.0
        self._store_failures = 0
        self._orphan_sweep_needed = False
        self._next_sweep = 0.0  # monotonic
        self._sweep_lock = threading.Lock()
        # Uploads of this process start after this (wall clock, a minute of skew to spare): the sweep
        # leaves them alone, so it never has to run before the first upload.
        self._started_at = time.time() - 60.0
        # The last look that found no manifest due, shared by the stage's workers: (the state DB's
        # finalize generation then, monotonic time to look again anyway).
        self._no_manifest_due: tuple[int, float] | None = None
        # Items a worker thread claimed and has not attempted yet (`run()` only; see `_next_item`).
        self._held = threading.local()

    def sweep_orphans(self) -> None:
        """Abort multipart uploads under our prefix the journal does not know (a crash before its commit).

        Housekeeping, never a gate: a failed sweep is tried again later while uploads go on, and a
        server that does not implement it (or does not let us list) skips it for good with a warning.
        """
        try:
            aborted = self.store.abort_orphaned_uploads(
                self.store.prefix, self.state.journal.upload_ids(), initiated_before=self._started_at
            )
        except (StoreUnsupportedError, StorePermissionError) as exc:
            log.warning("skipping the sweep of orphaned multipart uploads (optional; use a bucket lifecycle "
                        "rule to abort incomplete uploads instead): %s", exc)  # fmt: skip
            self._orphan_sweep_needed = False
            return
        except StoreError as exc:
            log.warning("could not sweep orphaned multipart uploads yet (retrying later): %s", exc)
            self._orphan_sweep_needed = True
            self._next_sweep = self._mono() + self.tuning.orphan_sweep_retry
            return
        self._orphan_sweep_needed = False
        if aborted:
            log.info("aborted %d orphaned multipart uploads under %s", aborted, self.store.url)

    def _paused_for(self) -> float:
        with self._pause_lock:
            return self._paused_until - self._mono()

    def _store_failed(self, exc: StoreError) -> None:
        with self._pause_lock:
            self._store_failures += 1
            if isinstance(exc, StorePermissionError):
                pause = self.tuning.permission_backoff
            else:
                pause = backoff(
                    self.tuning.upload_backoff_initial, self.tuning.upload_backoff_max, self._store_failures
                )
            self._paused_until = max(self._paused_until, self._mono() + pause)
            failures = self._store_failures
        if isinstance(exc, StorePermissionError):
            # Loud: an operator must fix credentials or the bucket; nothing is lost meanwhile.
            log.error("STORE REFUSES US (uploads paused %.0f s, spooled data kept): %s", pause, exc)
        else:
            log.warning("store unavailable (failure %d, uploads paused %.1f s): %s", failures, pause, exc)
        self.metrics.error("store")
        self.metrics.set_store_up(False)

    def _store_ok(self) -> None:
        with self._pause_lock:
            if self._store_failures:
                log.info("store is back after %d failures", self._store_failures)
            self._store_failures = 0
            self._paused_until = 0.0
        self.metrics.set_store_up(True)

    def run(self) -> None:
        """One upload worker: manifests of complete sessions first, then spooled items, until the pipeline stops."""
        held: deque[ItemRow] = deque()
        self._held.items = held
        try:
            while not self.wake.stop.is_set():
                generation = self.wake.snapshot(UPLOAD)
                paused = self._paused_for()
                if paused > 0:
                    self.wake.wait(generation, paused, UPLOAD)
                    continue
                idle = self.work_once()
                if idle is not None:
                    self.wake.wait(generation, idle, UPLOAD)
        finally:
            self._hand_back()
            del self._held.items

    def _next_item(self) -> ItemRow | None:
        """The next spooled item to upload, claimed. A running worker (`run()`) claims a few at once
        and keeps the rest in hand: each claim is a read of the DB under the lock every other
        worker's claim takes, a few times less often."""
        held: deque[ItemRow] | None = getattr(self._held, "items", None)
        if held is None:  # driven one step at a time (tests): nothing is kept in hand
            return self.state.claim_upload(self._mono())
        if not held:
            held.extend(self.state.claim_uploads(self._mono(), self.tuning.upload_claim_batch))
        return held.popleft() if held else None

    def _hand_back(self) -> None:
        """Items in hand that were not attempted are free for any worker again (the store failed,
        or the worker stops)."""
        held: deque[ItemRow] | None = getattr(self._held, "items", None)
        if held:
            items = list(held)
            held.clear()
            try:
                self.state.release_uploads(items)
            except Exception:  # the worker's edge: they stay claimed until the next start
                log.exception("could not hand back %d claimed uploads (the next start does)", len(items))
                self.metrics.error("upload")

    def work_once(self) -> float | None:
        """One unit of work (a due sweep, then one manifest or one spooled item); None when something
        was done, else how long to wait. Every exception is handled here, the worker's edge."""
        item: ItemRow | None = None
        try:
            if self._orphan_sweep_needed and self._mono() >= self._next_sweep and self._sweep_lock.acquire(False):
                try:
                    self.sweep_orphans()
                finally:
                    self._sweep_lock.release()
            if self._finalize_one():
                return None
            item = self._next_item()
            if item is None:
                # The next look for a due manifest, as the last one fixed it (it took the finalize gates in).
                last_look = self._no_manifest_due
                look_again = last_look[1] if last_look is not None else self.state.next_finalize_wake(self._mono())
                # Gates still closed only: an open one belongs to an item another worker has claimed.
                closed = self.state.next_gate(ItemStatus.SPOOLED, after=self._mono())
                gates = [g for g in (closed, look_again) if g]
                return self.wake.until(min(gates) if gates else None)
            with self.committer.uploading():
                self._upload(item)
            self._store_ok()
        except InvalidKeyError as exc:
            # The key itself is refused (never for ids escaped by keys.py): this item can never
            # be stored, which says nothing about the store; the others go on.
            log.error("item %s of %r cannot be stored: %s", item.kind if item else "?",
                      item.session_id if item else "?", exc)  # fmt: skip
            self.metrics.error("upload")
            if item is not None:
                # The fetched bytes are evidence all the same: kept beside conflicts, not swept.
                kept = self._keep_conflicting(Path(item.spool_path)) if item.spool_path else None
                self.finish(item, Outcome.FAILED, error=str(exc), spool_path=str(kept) if kept else None)
        except StoreError as exc:
            if item is not None:
                self.state.retry_item(
                    item.id, status=ItemStatus.SPOOLED, not_before=0.0, error=str(exc), instance=item.instance
                )
            self._hand_back()  # the stage pauses: the items in hand wait in the DB, for any worker
            self._store_failed(exc)
        except Exception as exc:  # loop edge
            log.exception("upload worker failed")
            self.metrics.error("upload")
            self._hand_back()
            if item is not None:
                with contextlib.suppress(Exception):
                    self.state.retry_item(
                        item.id,
                        status=ItemStatus.SPOOLED,
                        not_before=self._mono() + self.tuning.upload_backoff_max,
                        error=f"internal error: {type(exc).__name__}: {exc}",
                        instance=item.instance,
                    )
            self.wake.stop.wait(1.0)
        return None

    def _upload(self, item: ItemRow) -> None:
        result = self.uploader.upload(item)
        assert item.spool_path is not None  # checked by the uploader
        spool_path = Path(item.spool_path)
        if isinstance(result, Stored):
            self.metrics.add_bytes("upload", item.kind, item.size or 0)
            if result.theirs is not None:
                # Rare (a log another archiver compressed otherwise): recorded at once, with the size
                # and sha256 of the object at the key, and only then the spool copy goes.
                self.finish(item, Outcome.ARCHIVED, stored=result.theirs)
                self.spool.remove(spool_path)
            else:
                # Recorded by the group commit (one fsync for the outcomes of every worker), which
                # deletes the spool copy only once `done` is committed; this worker goes on meanwhile.
                self.committer.hand_over(item, spool_path)
        elif isinstance(result, Conflict):
            kept = self._keep_conflicting(spool_path)
            log.error(
                "item %s of %r: a different object is already at %s; our bytes are kept at %s",
                item.kind, item.session_id, item.key, kept,
            )  # fmt: skip
            self.finish(item, Outcome.CONFLICT, error=result.error, spool_path=str(kept))
        elif isinstance(result, SpoolBroken):
            log.error(
                "spool file of %s of %r is unusable, fetching again: %s",
                item.kind,
                item.session_id,
                result.error,
            )
            self.metrics.error("spool")
            self.state.retry_item(
                item.id, status=ItemStatus.PENDING_FETCH, not_before=0.0, error=result.error, instance=item.instance
            )
            self.wake.notify(FETCH)
        self._refresh_gauges()

    def _keep_conflicting(self, path: Path) -> Path:
        """Fetched bytes that cannot go to their key are evidence too: keep them out of the spool."""
        self._conflicts_dir.mkdir(parents=True, exist_ok=True)
        target = self._conflicts_dir / path.name
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, target)
        # Durable before the row says so: recovery deletes spool files of finished items.
        fsync_dir(self._conflicts_dir)
        fsync_dir(path.parent)
        return target

    def _finalize_one(self) -> bool:
        """Write the manifests and index entries of a batch of complete sessions, then mark them
        archived in one commit; False when none is due.

        A session whose finalization fails for any other reason than the store being down is
        backed off on its own (the others go on), and given up as `failed` once its fetch deadline
        has passed: its reason is kept for `archiver status` and counted. A crash before the commit
        leaves the batch `finalizing` with its manifests written: the next start writes them again,
        byte for byte (`archived_at` is fixed), which the create-once store takes as already there.
        """
        if not self._manifest_may_be_due():
            return False
        rows = self.state.claim_finalizes(self._mono(), self.tuning.finalize_lease, self.tuning.finalize_batch)
        if not rows:
            return False
        written: list[tuple[SessionRow, ArchivedMark, int]] = []
        try:
            for n, row in enumerate(rows):
                try:
                    written.append(self._finalize(row))
                except StoreError:
                    self.state.finalize_retry(row.key, 0.0, "store unavailable")
                    self.state.release_finalize([r.key for r in rows[n + 1 :]])
                    raise
                except Exception as exc:  # the session's edge: one bad session must not stop the others
                    self._finalize_failed(row, exc)
        finally:
            self._mark_archived(written)
        return True

    def _finalize_failed(self, row: SessionRow, exc: Exception) -> None:
        log.exception("finalizing session %r failed", row.id)
        self.metrics.error("finalize")
        reason = f"{type(exc).__name__}: {exc}"
        if row.fetch_deadline is not None and self.clock() >= row.fetch_deadline:
            if self.state.fail_session(row.key, reason, self.clock()):
                self.metrics.session_failed()
                log.error("session %r failed: no manifest could be written before its deadline: %s", row.id,
                          reason)  # fmt: skip
        else:
            attempts = row.finalize_attempts + 1
            delay = backoff(self.tuning.finalize_backoff_initial, self.tuning.finalize_backoff_max, attempts)
            self.state.finalize_retry(row.key, self._mono() + delay, reason)

    def _mark_archived(self, written: list[tuple[SessionRow, ArchivedMark, int]]) -> None:
        """One commit marks every session of the batch whose manifest is written `archived`."""
        if not written:
            return
        self.state.mark_archived_many([mark for _, mark, _ in written])
        for session, mark, items in written:
            now = mark.now if mark.now is not None else self.clock()
            delay = now - (session.first_seen_ended if session.first_seen_ended is not None else now)
            self.metrics.archive_completed(delay_seconds=max(0.0, delay), now=now)
            log.info("session %r archived (%d items): %s", session.id, items, mark.manifest_key)
        self._store_ok()
        self.wake.notify(UPLOAD)

    def _manifest_may_be_due(self) -> bool:
        """False when no finalizing session can be due: the last look found none, no write of this
        process has made one due since (the state DB's finalize generation stands still), and no
        retry gate has passed. Else one look on the reader connection decides.

        Why: workers ask before every item and the answer is almost always no; the look was a
        noticeable share of a worker's time per small object. A look is taken at least every
        `idle_wait` all the same, so a change the generation does not see (another process writing
        the DB) costs latency, never a manifest.
        """
        generation = self.state.finalize_generation()
        now = self._mono()
        last = self._no_manifest_due
        if last is not None and last[0] == generation and now < last[1]:
            return False
        gate = self.state.next_finalize_wake(now)
        if gate is not None and gate <= now:
            return True
        look_again = now + self.tuning.idle_wait
        self._no_manifest_due = (generation, look_again if gate is None else min(gate, look_again))
        return False

    def _finalize(self, session: SessionRow) -> tuple[SessionRow, ArchivedMark, int]:
        items = self.state.items_of(session.key)
        log_entry: bytes | None = None
        try:
            written = self.uploader.write_manifest(session, items)
            manifest_key = written.key
            if self.log_leaves and written.ours:
                # Queued with the archived mark (one transaction): the log stage appends it, and a
                # crash in between leaves it queued. Another replica's manifest is that replica's leaf.
                leaf = Leaf.of(written.sha256, session.id, session.instance or None, written.manifest.archived_at)
                log_entry = leaf.encode()
        except ObjectConflictError as exc:
            # Another manifest holds this instance's key (written by another archiver of the same
            # session with other bytes). The create-once rule forbids replacing it.
            log.error("session %r: %s; not overwriting the existing manifest", session.id, exc)
            self.metrics.error("manifest")
            manifest_key = keys.manifest_key(self.store.prefix, session.id, instance=session.instance or None)
        return session, ArchivedMark(session.key, manifest_key, self.clock(), log_entry), len(items)
