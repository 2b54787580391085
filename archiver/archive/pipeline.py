"""The archive pipeline: end detection, confirmation, the deadline-bound fetch stage and the upload stage.

Everything durable goes through the state DB (`archiver.archive.state`), so every thread here can die at
any instant: `recover()` at start-up puts in-flight work back and the next run carries on. The
hand-off between the stages is a fsynced spool file plus a committed `spooled` row: only the fetch
is bound to the upstream's removal deadline; an object store outage costs latency, never data.

Threads: confirmers (`GET /session/{id}` for candidates), a reconciler (`GET /session?all=true`
at start-up, after a gap in successful polls and every `reconcile_interval`: ended sessions the
polls never saw are archived too), `fetch_workers` fetchers (earliest deadline first) and
`upload_workers` uploaders (objects, then manifest + index entry per complete session).

A session ends only on positive evidence: a terminal status from the upstream, or the API's own
JSON 404 seen twice `not_found_confirm` apart (an HTML 404 from a proxy is a transient error).

Work is always picked from SQLite, never from lists in memory, so memory does not grow with the
backlog; bodies are streamed, so it does not grow with object size either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.archive.fetch import Fetcher, Finished, Retry, Spool, Spooled, artifact_source, logs_source
from archiver.archive.state import Backlog, ItemRow, NewItem, PendingItem, SessionRow, StateDB, session_key_of
from archiver.archive.upload import Conflict, SpoolBroken, Stored, Uploader
from archiver.durable import fsync_dir
from archiver.errors import (
    ApiError,
    InvalidKeyError,
    NotFoundError,
    ObjectConflictError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
)
from archiver.exporter.selfmetrics import SelfMetrics
from archiver.layout import keys
from archiver.retry import RetryPolicy
from archiver.settings import Settings
from archiver.store.base import ObjectStore
from archiver.upstream.api import SessionFilter, SessionHostClient
from archiver.upstream.models import UNKNOWN_STATUS, Session, SessionListParser

log = logging.getLogger("archiver.pipeline")  # the name it had before the rooms: log filters keep working

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Tuning:
    """Timings of the pipeline's own loops (defaults for production; tests shorten them)."""

    #: Threads describing candidates.
    confirm_workers: int = 2
    #: Candidates leased per claim.
    confirm_batch: int = 20
    #: A claimed candidate is not claimed again for this long (a confirmer that died mid-way).
    confirm_lease: float = 120.0
    #: Re-describe a candidate whose describe failed after this long.
    confirm_retry: float = 5.0
    #: Re-describe a candidate the upstream still calls alive (absent from the list) after this long.
    confirm_recheck: float = 15.0
    #: A candidate the describe calls `unknown` (status missing or new) is taken as ended after
    #: this long: the list dropped it, and waiting for a status that never comes would lose it.
    unknown_status_grace: float = 300.0
    #: The API's own 404 for a candidate ends it only when a describe this much later says so too.
    not_found_confirm: float = 30.0
    #: A session being finalized is not taken by another worker for this long.
    finalize_lease: float = 300.0
    #: Finalization re-attempts: exponential from initial to max.
    finalize_backoff_initial: float = 5.0
    finalize_backoff_max: float = 300.0
    #: Persist last_seen_active of all listed sessions at most this often (a stale value only
    #: makes deadlines earlier, i.e. safe; exact values are written when a session disappears).
    last_seen_persist_interval: float = 30.0
    #: Item-level fetch re-attempts: exponential from initial to max (bounded by the deadline).
    fetch_backoff_initial: float = 2.0
    fetch_backoff_max: float = 300.0
    #: Upload stage pause after StoreUnavailableError: exponential from initial to max, forever.
    upload_backoff_initial: float = 1.0
    upload_backoff_max: float = 60.0
    #: Pause after StorePermissionError (an operator must act; don't hammer the store).
    permission_backoff: float = 300.0
    #: Longest a worker sleeps before looking at the DB again even without a notification.
    idle_wait: float = 5.0
    #: Minimum interval between gauge refreshes triggered by workers.
    gauge_interval: float = 1.0


def _same_metadata(a: Session, b: Session) -> bool:
    """Whether the stored row of `a` is still right for `b`.

    Player count and status change all the time and are re-read from the describe at the end,
    so they alone never cost a write per poll.
    """
    if a is b:  # the poller's parser hands back the very same object for an unchanged entry
        return True
    return (
        a.image == b.image
        and a.tag == b.tag
        and a.location == b.location
        and a.host == b.host
        and a.created_ms == b.created_ms
        and a.labels == b.labels
    )


def _key_id(key: str) -> str:
    """The session id of an instance key (`{creation ms}:{id}`)."""
    return key.partition(":")[2]


def _backoff(initial: float, maximum: float, attempt: int) -> float:
    return float(min(maximum, initial * 2.0 ** max(0, attempt - 1)))


def deadline_for(row: SessionRow, *, retention: float, margin: float, now: float) -> float:
    """Fetch deadline of an ended session: last seen alive + retention - margin.

    Never later than the real removal. For a session never seen alive (backfilled, or found by
    reconciliation) the creation time bounds its end from below, so that bound is safe; when it
    has passed already, the upstream still holding the session (it was just listed or described
    as ended, at `now`) is all we know: allow a short window rather than giving up unseen.
    """
    if row.last_seen_active is not None:
        return row.last_seen_active + retention - margin
    bound = (row.created or 0.0) + retention - margin
    return max(bound, now + max(margin, 60.0))


class Pipeline:
    """Archives every session that ends: detect → confirm → fetch (deadline) → upload → manifest."""

    def __init__(
        self,
        settings: Settings,
        client: SessionHostClient,
        store: ObjectStore,
        state: StateDB,
        metrics: SelfMetrics,
        clock: Clock = time.time,
        *,
        policy: RetryPolicy | None = None,
        tuning: Tuning | None = None,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client = client
        self.store = store
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self.tuning = tuning or Tuning()
        self._mono = monotonic
        self._policy = policy or RetryPolicy()
        # Describes of candidates are short and repeated later anyway: a few quick tries only.
        self._confirm_policy = self._policy.bounded_by(max_elapsed=min(10.0, self._policy.max_elapsed))
        self.spool = Spool(settings.state_dir / "spool")
        self._conflicts_dir = settings.state_dir / "conflicts"
        self.fetcher = Fetcher(
            client,
            self.spool,
            prefix=store.prefix,
            max_artifact_size=settings.max_artifact_size,
            policy=self._policy,
        )
        self.uploader = Uploader(store, state.journal)
        # The store has no hook between parts; the journal is ours, so the crash point hangs there.
        state.journal.on_part_done = lambda: crashpoint("after_part_upload")

        self._cv = threading.Condition()
        self._generation = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Detection (touched by the poller thread only, in observe_poll), keyed by instance key.
        self._known: dict[str, Session | None] = {}
        self._last_seen: dict[str, float] = {}
        self._last_seen_persisted = float("-inf")
        self._poll_gap = False
        # Reconciliation: requested by start-up and by a successful poll after a gap.
        self._reconcile_requested = threading.Event()
        self._first_start = state.created
        self.reconciled_once = threading.Event()
        # Upload stage pause after store failures (monotonic).
        self._pause_lock = threading.Lock()
        self._paused_until = 0.0
        self._store_failures = 0
        self._orphan_sweep_needed = False
        self._sweep_lock = threading.Lock()
        self._gauges_at = float("-inf")

    # --- lifecycle --------------------------------------------------------------------------

    def recover(self) -> None:
        """Start-up: put in-flight work back, clean the spool, resume/abort multipart uploads.

        Call once before `start()`. Sessions the DB knows as active become candidates if the
        first successful poll does not list them.
        """
        fetches, uploads = self.state.reset_in_flight()
        keep = {Path(p).name for p in self.state.spool_paths_in_use()}
        removed = self.spool.sweep(keep)
        # Multipart uploads in the journal are resumed by put_file itself; everything else under
        # our prefix is an orphan of a crash between CreateMultipartUpload and the journal commit.
        self._sweep_orphans()
        self._known = dict.fromkeys(self.state.active_session_keys())
        self._last_seen.clear()
        self.metrics.set_retention(self.settings.retention)
        self.metrics.restore_last_archive_success(self.state.last_archived_at())
        # Whatever ended while we were not looking is found by the first reconciliation.
        self._reconcile_requested.set()
        backlog = self.gauges()
        log.info(
            "state recovered: %d fetches and %d uploads resumed, %d stale spool files removed, "
            "%d sessions known active, %d candidates, %d items to fetch, %d to upload",
            fetches, uploads, removed, len(self._known), backlog.candidates,
            backlog.pending_fetch, backlog.pending_upload,
        )  # fmt: skip

    def _sweep_orphans(self) -> None:
        try:
            aborted = self.store.abort_orphaned_uploads(self.store.prefix, self.state.journal.upload_ids())
        except StoreError as exc:
            # The store is down at start-up: the first upload worker sweeps before uploading.
            log.warning("could not sweep orphaned multipart uploads yet: %s", exc)
            self._orphan_sweep_needed = True
            return
        self._orphan_sweep_needed = False
        if aborted:
            log.info("aborted %d orphaned multipart uploads under %s", aborted, self.store.url)

    def start(self, *, reconcile: bool = True) -> None:
        """Start the reconcile, confirm, fetch and upload threads (`archiver archive` needs no reconciler)."""
        if self._threads:
            raise RuntimeError("the pipeline is already started")
        self._stop.clear()
        specs = (
            [("reconcile", self._reconcile_loop)] * reconcile
            + [("confirm", self._confirm_loop)] * self.tuning.confirm_workers
            + [("fetch", self._fetch_loop)] * self.settings.fetch_workers
            + [("upload", self._upload_loop)] * self.settings.upload_workers
        )
        for n, (name, target) in enumerate(specs):
            thread = threading.Thread(target=target, name=f"archiver-{name}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask every thread to stop and wait up to `timeout` s; True if all stopped.

        An item interrupted mid-fetch or mid-upload is simply resumed by the next `recover()`.
        """
        self._stop.set()
        self._reconcile_requested.set()
        self._notify()
        until = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = [t for t in self._threads if t.is_alive()]
        if alive:
            log.warning("pipeline threads still busy after %.0f s: %s", timeout, ", ".join(alive))
        return not alive

    def alive(self) -> bool:
        """For /healthz: started and every worker thread still running (loops survive errors, so a
        dead thread means the process must be restarted)."""
        return bool(self._threads) and not self._stop.is_set() and all(t.is_alive() for t in self._threads)

    # --- wake-ups ---------------------------------------------------------------------------

    def _notify(self) -> None:
        with self._cv:
            self._generation += 1
            self._cv.notify_all()

    def _snapshot(self) -> int:
        with self._cv:
            return self._generation

    def _wait(self, generation: int, timeout: float) -> None:
        """Sleep until something changed since `generation`, the stop signal, or `timeout`."""
        with self._cv:
            if self._generation == generation and not self._stop.is_set():
                self._cv.wait(max(0.0, min(timeout, self.tuning.idle_wait)))

    def _until(self, gate: float | None) -> float:
        return self.tuning.idle_wait if gate is None else gate - self._mono()

    # --- detection --------------------------------------------------------------------------

    def observe_poll(
        self, sessions: Sequence[Session] | None, now: float, *, present_ids: Set[str] = frozenset()
    ) -> None:
        """Record one list poll (None = failed: nothing ends on a failed poll).

        Only new or changed sessions are written; last_seen_active of the rest is persisted in one
        bulk statement at most every `last_seen_persist_interval` seconds. Known-active sessions
        missing from the list become candidates, confirmed by the confirm threads. A listed entry
        with a terminal status counts as missing (the describe confirms it). `present_ids`: ids of
        entries left out of this poll by the range checks (quarantined): still there, so none of
        their known instances is taken for ended.
        """
        if sessions is None:
            self._poll_gap = True
            return
        if self._poll_gap:
            # Sessions may have started and ended while the list was failing: reconcile.
            self._poll_gap = False
            self._reconcile_requested.set()
        known = self._known
        listed: dict[str, Session] = {}
        upserts: list[Session] = []
        for s in sessions:
            if s.terminal:
                continue
            key = session_key_of(s)
            listed[key] = s
            old = known.get(key)
            if old is None or not _same_metadata(old, s):
                upserts.append(s)
        # Quarantined entries carry no trustworthy creation time: match their known instances by id.
        kept = {key: known[key] for key in known if key not in listed and _key_id(key) in present_ids}
        gone = [(key, self._last_seen.get(key)) for key in known if key not in listed and key not in kept]
        touch = now - self._last_seen_persisted >= self.tuning.last_seen_persist_interval
        reopened = self.state.record_poll(upserts, gone, now, touch_active=touch)
        if touch:
            self._last_seen_persisted = now
        self._known = {**kept, **listed}
        last_seen = self._last_seen
        for key, _ in gone:
            last_seen.pop(key, None)
        for key in self._known:
            last_seen[key] = now
        if reopened.keys:
            for path in reopened.spool_paths:
                self.spool.remove(Path(path))
            self.metrics.session_reopened(len(reopened.keys))
            log.warning("%d sessions were listed again after they were taken for ended; re-opened: %s",
                        len(reopened.keys), ", ".join(repr(_key_id(k)) for k in reopened.keys[:5]))  # fmt: skip
        if gone:
            log.info("%d sessions left the list; confirming their end", len(gone))
            self._notify()
        self._refresh_gauges(force=False)

    def _deadline_for(self, row: SessionRow) -> float:
        s = self.settings
        return deadline_for(row, retention=s.retention, margin=s.deadline_margin, now=self.clock())

    def _items_for(self, row: SessionRow) -> list[NewItem]:
        items = [NewItem("logs", "", logs_source(row.id))]
        items += [
            NewItem("artifact", path, artifact_source(row.id, path))
            for path in self.settings.artifact_paths_for(row.image)
        ]
        return items

    def _end(self, key: str, described: Session | None, *, backfill: bool = False) -> bool:
        row = self.state.end_session(
            key,
            described=described,
            deadline_for=self._deadline_for,
            items_for=self._items_for,
            now=self.clock(),
            backfill=backfill,
        )
        if row is None:
            return False
        self.metrics.sessions_ended()
        log.info("session %r ended (%s); fetch deadline %.0f", row.id, row.status, row.fetch_deadline or 0)
        self._notify()
        return True

    def _confirm_loop(self) -> None:
        while not self._stop.is_set():
            generation = self._snapshot()
            try:
                rows = self.state.claim_candidates(self._mono(), self.tuning.confirm_lease, self.tuning.confirm_batch)
                for row in rows:
                    if self._stop.is_set():
                        break
                    self._confirm(row)
                if not rows:
                    self._wait(generation, self._until(self.state.next_candidate_wake()))
            except Exception:  # loop edge: a bug must not silently end confirmations
                log.exception("confirm loop failed; continuing")
                self.metrics.error("confirm")
                self._stop.wait(1.0)

    def _confirm(self, row: SessionRow) -> None:
        """Describe a candidate; end it only on positive evidence (see the module docstring)."""
        try:
            described = self.client.describe_session(row.id, policy=self._confirm_policy)
        except NotFoundError as exc:
            if not exc.code:
                # No error body of the API's own (an HTML or plain 404 from a proxy): transient.
                log.warning("describing candidate %r: a 404 without the API's error body; retrying", row.id)
                self.state.candidate_retry(row.key, self._mono() + self.tuning.confirm_retry, str(exc))
                return
            now = self.clock()
            first = self.state.candidate_not_found(row.key, now, self._mono() + self.tuning.not_found_confirm)
            if now - first >= self.tuning.not_found_confirm:
                # Removed (we were down, or the window is over): ended; its fetches will tell.
                self._end(row.key, None)
            return
        except ApiError as exc:
            log.warning("describing candidate %r failed (retrying): %s", row.id, exc)
            self.state.candidate_retry(row.key, self._mono() + self.tuning.confirm_retry, str(exc))
            return
        if session_key_of(described) != row.key:
            # The id now names another instance (reused after this one ended): this one is over.
            log.info("session %r was reused by a newer instance; its earlier instance has ended", row.id)
            self._end(row.key, None)
            return
        absent_for = self.clock() - (row.first_seen_ended or self.clock())
        if described.terminal or (
            described.status == UNKNOWN_STATUS and absent_for >= self.tuning.unknown_status_grace
        ):
            self._end(row.key, described)
        else:
            self.state.candidate_alive(row.key, self.clock(), self._mono() + self.tuning.confirm_recheck)

    def backfill(self, session_ids: Sequence[str]) -> list[str]:
        """Archive these sessions now if the upstream still holds them ended; returns the ids queued.

        Already ended/archived sessions, running ones (archived when they end) and unknown or
        removed ones are skipped with a log line saying why.
        """
        queued = []
        for sid in session_ids:
            try:
                described = self.client.describe_session(sid, policy=self._confirm_policy)
            except NotFoundError:
                log.warning("session %r is unknown or past its retention window: nothing to fetch", sid)
                continue
            if not described.terminal:
                log.warning("session %r is still %s: it is archived when it ends", sid, described.status)
                continue
            row = self.state.session(session_key_of(described))
            if row is not None and row.state not in ("active", "candidate"):
                log.info("session %r is already %s", sid, row.state)
                continue
            if self._end(session_key_of(described), described, backfill=True):
                queued.append(sid)
        return queued

    # --- reconciliation ---------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        interval = self.settings.reconcile_interval
        while not self._stop.is_set():
            self._reconcile_requested.wait(interval)
            if self._stop.is_set():
                return
            self._reconcile_requested.clear()
            try:
                self.reconcile()
            except ApiError as exc:
                # The next poll after the outage asks again; meanwhile the interval does.
                log.warning("reconciliation could not list the sessions: %s", exc)
            except Exception:  # loop edge
                log.exception("reconciliation failed")
                self.metrics.error("reconcile")
            self.reconciled_once.set()

    def reconcile(self) -> int:
        """List every session the upstream still holds (`all=true`) and end those it calls ended that
        have no archive yet, however the polls missed them (daemon stopped, list outage, quarantine).

        The deadline of a session never seen alive comes from its creation time and the fact that
        the upstream lists it now (`deadline_for`). Also prunes old terminal rows. Returns the
        number of sessions queued.
        """
        listing = self.client.list_sessions(SessionFilter(all=True), policy=self._policy, parser=SessionListParser())
        now = self.clock()
        ended = {session_key_of(s): s for s in listing.sessions if s.terminal}
        states = self.state.states_of(ended)
        known_open = [s for key, s in ended.items() if states.get(key) in ("active", "candidate")]
        unseen = [s for key, s in ended.items() if key not in states]
        queued = 0
        if unseen and self._first_start and self.settings.on_first_start == "skip":
            skipped = self.state.skip_sessions(unseen, now)
            log.info("first start: %d ended sessions the upstream still holds are not archived (on-first-start=skip)",
                     skipped)  # fmt: skip
            unseen = []
        elif unseen and self._first_start:
            log.info("first start: archiving the %d ended sessions the upstream still holds", len(unseen))
        if known_open or unseen:
            rows = self.state.end_sessions(
                [*known_open, *unseen], deadline_for=self._deadline_for, items_for=self._items_for, now=now
            )
            queued = len(rows)
            if queued:
                self.metrics.sessions_ended(queued)
                found = sum(1 for r in rows if r.last_seen_active is None)
                if found:
                    self.metrics.reconciled(found)
                    log.info("reconciliation found %d ended sessions the polls had missed", found)
                self._notify()
        self._first_start = False
        pruned = self.state.prune(now - self.settings.prune_after)
        if pruned:
            log.info("pruned %d archived sessions older than %.0f s from the state DB", pruned,
                     self.settings.prune_after)  # fmt: skip
        return queued

    # --- fetch stage ------------------------------------------------------------------------

    def _fetch_loop(self) -> None:
        while not self._stop.is_set():
            generation = self._snapshot()
            item: ItemRow | None = None
            try:
                item = self.state.claim_fetch(self._mono())
                if item is None:
                    self._wait(generation, self._until(self.state.next_gate("pending_fetch")))
                    continue
                self._fetch(item)
            except Exception as exc:  # loop edge: count it, put the item back, keep the worker alive
                log.exception("fetch worker failed")
                self.metrics.error("fetch")
                if item is not None:
                    self._release_fetch(item, f"internal error: {type(exc).__name__}: {exc}")
                self._stop.wait(1.0)

    def _release_fetch(self, item: ItemRow, error: str) -> None:
        with contextlib.suppress(Exception):
            delay = _backoff(self.tuning.fetch_backoff_initial, self.tuning.fetch_backoff_max, item.attempts)
            self.state.retry_item(item.id, status="pending_fetch", not_before=self._mono() + delay, error=error)

    def _fetch(self, item: ItemRow) -> None:
        remaining = item.deadline - self.clock()
        if remaining <= 0 and item.attempts > 1:
            self._finish(item, "expired", error=f"fetch deadline passed; last error: {item.last_error}")
            return
        result = self.fetcher.fetch(item, remaining=remaining)
        now = self.clock()
        if isinstance(result, Spooled):
            self.state.mark_spooled(
                item.id,
                spool_path=str(result.path),
                size=result.size,
                sha256=result.sha256,
                content_type=result.content_type,
                source=result.source,
                key=result.key,
                fetched_at=now,
            )
            self.metrics.add_bytes("fetch", item.kind, result.received)
            self.metrics.fetch_completed(item.deadline - now)
            self._notify()
        elif isinstance(result, Finished):
            log.info("item %s of %r: %s (%s)", item.kind, item.session_id, result.outcome, result.error)
            self._finish(item, result.outcome, error=result.error, source=result.source)
        else:
            self._retry_fetch(item, result, now)
        self._refresh_gauges(force=False)

    def _retry_fetch(self, item: ItemRow, result: Retry, now: float) -> None:
        left = item.deadline - now
        if left <= 0:
            self._finish(item, "expired", error=result.error, source=result.source)
            return
        if result.local:
            self.metrics.error("spool")
            log.error("spool write failed for %s of %r (retrying): %s", item.kind, item.session_id, result.error)
        else:
            log.warning("fetching %s of %r failed (retrying): %s", item.kind, item.session_id, result.error)
        # Wait less as the deadline nears, so the last tries still happen inside the window.
        delay = min(
            _backoff(self.tuning.fetch_backoff_initial, self.tuning.fetch_backoff_max, item.attempts),
            max(0.5, left / 2),
        )
        self.state.retry_item(item.id, status="pending_fetch", not_before=self._mono() + delay, error=result.error)

    def _finish(
        self,
        item: ItemRow,
        outcome: str,
        *,
        error: str | None = None,
        source: str | None = None,
        key: str | None = None,
        spool_path: str | None = None,
    ) -> None:
        self.state.finish_item(
            item.id, outcome, now=self.clock(), error=error, source=source, key=key, spool_path=spool_path
        )
        self.metrics.item_done(item.kind, outcome)
        self._notify()

    # --- upload stage -----------------------------------------------------------------------

    def _paused_for(self) -> float:
        with self._pause_lock:
            return self._paused_until - self._mono()

    def _store_failed(self, exc: StoreError) -> None:
        with self._pause_lock:
            self._store_failures += 1
            if isinstance(exc, StorePermissionError):
                pause = self.tuning.permission_backoff
            else:
                pause = _backoff(
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

    def _upload_loop(self) -> None:
        while not self._stop.is_set():
            generation = self._snapshot()
            item: ItemRow | None = None
            try:
                paused = self._paused_for()
                if paused > 0:
                    self._wait(generation, paused)
                    continue
                if self._orphan_sweep_needed:
                    with self._sweep_lock:
                        if self._orphan_sweep_needed:
                            self._sweep_orphans()
                            if self._orphan_sweep_needed:
                                raise StoreUnavailableError("orphaned multipart uploads not swept yet")
                if self._finalize_one():
                    continue
                item = self.state.claim_upload(self._mono())
                if item is None:
                    gates = [g for g in (self.state.next_gate("spooled"), self.state.next_finalize_wake()) if g]
                    self._wait(generation, self._until(min(gates) if gates else None))
                    continue
                self._upload(item)
                self._store_ok()
            except InvalidKeyError as exc:
                # The key itself is refused (never for ids escaped by keys.py): this item can never
                # be stored, which says nothing about the store; the others go on.
                log.error("item %s of %r cannot be stored: %s", item.kind if item else "?",
                          item.session_id if item else "?", exc)  # fmt: skip
                self.metrics.error("upload")
                if item is not None:
                    self._finish(item, "failed", error=str(exc), spool_path=item.spool_path)
            except StoreError as exc:
                if item is not None:
                    self.state.retry_item(item.id, status="spooled", not_before=0.0, error=str(exc))
                self._store_failed(exc)
            except Exception as exc:  # loop edge
                log.exception("upload worker failed")
                self.metrics.error("upload")
                if item is not None:
                    with contextlib.suppress(Exception):
                        self.state.retry_item(
                            item.id,
                            status="spooled",
                            not_before=self._mono() + self.tuning.upload_backoff_max,
                            error=f"internal error: {type(exc).__name__}: {exc}",
                        )
                self._stop.wait(1.0)

    def _upload(self, item: ItemRow) -> None:
        result = self.uploader.upload(item)
        assert item.spool_path is not None  # checked by the uploader
        spool_path = Path(item.spool_path)
        if isinstance(result, Stored):
            self._finish(item, "archived")
            # Only now, with `done` committed, is the spool copy no longer needed.
            self.spool.remove(spool_path)
            self.metrics.add_bytes("upload", item.kind, item.size or 0)
        elif isinstance(result, Conflict):
            kept = self._keep_conflicting(spool_path)
            log.error(
                "item %s of %r: a different object is already at %s; our bytes are kept at %s",
                item.kind, item.session_id, item.key, kept,
            )  # fmt: skip
            self._finish(item, "conflict", error=result.error, spool_path=str(kept))
        elif isinstance(result, SpoolBroken):
            log.error(
                "spool file of %s of %r is unusable, fetching again: %s",
                item.kind,
                item.session_id,
                result.error,
            )
            self.metrics.error("spool")
            self.state.retry_item(item.id, status="pending_fetch", not_before=0.0, error=result.error)
            self._notify()
        self._refresh_gauges(force=False)

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
        """Write the manifest and index entry of one complete session; False when none is due.

        A session whose finalization fails for any other reason than the store being down is
        backed off on its own (the others go on), and given up as `failed` once its fetch deadline
        has passed: its reason is kept for `archiver status` and counted.
        """
        row = self.state.claim_finalize(self._mono(), self.tuning.finalize_lease)
        if row is None:
            return False
        try:
            self._finalize(row)
        except StoreError:
            self.state.finalize_retry(row.key, 0.0, "store unavailable")
            raise
        except Exception as exc:  # the session's edge: one bad session must not stop the others
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
                delay = _backoff(self.tuning.finalize_backoff_initial, self.tuning.finalize_backoff_max, attempts)
                self.state.finalize_retry(row.key, self._mono() + delay, reason)
        return True

    def _finalize(self, session: SessionRow) -> None:
        items = self.state.items_of(session.key)
        try:
            manifest_key = self.uploader.write_manifest(session, items)
        except ObjectConflictError as exc:
            # Another manifest holds this instance's key (written by another archiver of the same
            # session with other bytes). The create-once rule forbids replacing it.
            log.error("session %r: %s; not overwriting the existing manifest", session.id, exc)
            self.metrics.error("manifest")
            manifest_key = keys.manifest_key(self.store.prefix, session.id, instance=session.instance or None)
        now = self.clock()
        self.state.mark_archived(session.key, manifest_key, now)
        delay = now - (session.first_seen_ended if session.first_seen_ended is not None else now)
        self.metrics.archive_completed(delay_seconds=max(0.0, delay), now=now)
        log.info("session %r archived (%d items): %s", session.id, len(items), manifest_key)
        self._store_ok()
        self._notify()

    # --- reporting --------------------------------------------------------------------------

    def gauges(self) -> Backlog:
        """Refresh archiver_pending_items, archiver_next_fetch_deadline..., archiver_spool_bytes."""
        backlog = self.state.backlog()
        self.metrics.set_pending("fetch", backlog.pending_fetch)
        self.metrics.set_pending("upload", backlog.pending_upload)
        self.metrics.set_next_fetch_deadline(backlog.next_fetch_deadline)
        self.metrics.set_spool_bytes(backlog.spool_bytes)
        self._gauges_at = time.monotonic()
        return backlog

    def _refresh_gauges(self, *, force: bool) -> None:
        if force or time.monotonic() - self._gauges_at >= self.tuning.gauge_interval:
            self.gauges()

    def status(self) -> list[PendingItem]:
        """Unfinished items, earliest deadline first, with the time left (for `archiver status`)."""
        return self.state.pending_items(self.clock())

    def request_reconcile(self) -> None:
        """Reconcile as soon as possible (tests, and operators through the daemon)."""
        self._reconcile_requested.set()

    def run_until_idle(self, timeout: float) -> bool:
        """Wait until no candidate, item or manifest is pending (True) or `timeout` s passed (False)."""
        until = time.monotonic() + timeout
        while True:
            generation = self._snapshot()
            if self.state.backlog().idle:
                self.gauges()
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            self._wait(generation, left)
