"""The archive pipeline: builds the stages, owns their threads, recovers at start-up, reports the backlog.

Its parts are rooms of their own: the pure detector (`detector.observe`) and deadline rule
(`deadline.deadline_for`), the ending stage (`ending`: polls applied to the state DB, candidates
confirmed, ended sessions given their items), the reconciler (`reconcile`), the fetch stage
(`fetch`, bound to the deadline) and the upload stage (`upload_stage`: objects, then manifest and
index entry). This class builds them on one state DB, spool and set of wake-ups, runs their threads,
and puts in-flight work back at start-up.

Everything durable goes through the state DB (`archiver.archive.state`), so every thread here can die at
any instant: `recover()` at start-up puts in-flight work back and the next run carries on. The
hand-off between the stages is a fsynced spool file plus a committed `spooled` row: only the fetch
is bound to the upstream's removal deadline; an object store outage costs latency, never data.

Threads: confirmers (`GET /session/{id}` for candidates), a reconciler (`GET /session?all=true`
at start-up, after a gap in successful polls and every `reconcile_interval`: ended sessions the
polls never saw are archived too), `fetch_workers` fetchers (earliest deadline first) and
`upload_workers` uploaders (objects, then manifest + index entry per complete session) and one
committer (their outcomes, several per transaction: `outcomes.py`).

Work is always picked from SQLite, never from lists in memory, so memory does not grow with the
backlog; bodies are streamed, so it does not grow with object size either.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence, Set
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.archive.ending import EndingStage
from archiver.archive.fetch import FetchStage
from archiver.archive.fetcher import Fetcher
from archiver.archive.live_logs import LiveLogs
from archiver.archive.log_stage import LogStage, writer_name
from archiver.archive.reconcile import Reconciler
from archiver.archive.replicas import ArchiveCheck, Stagger
from archiver.archive.spool import Spool
from archiver.archive.stage import CONFIRM, FETCH, Clock, StageParts, Tuning, Wakeups
from archiver.archive.state import Backlog, PendingItem, StateDB
from archiver.archive.store_health import check_store, probe_store
from archiver.archive.upload import Uploader
from archiver.archive.upload_stage import UploadStage
from archiver.config.settings import Settings
from archiver.live import store as live_store
from archiver.live import table as live_table
from archiver.live.engine import LiveCapture
from archiver.live.loop import open_file_limit, seals_room, streams_room
from archiver.live.policy import Tuning as LiveTuning
from archiver.live.store import CaptureStore
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retry import RetryPolicy
from archiver.store.base import ObjectStore
from archiver.tlog.keyfile import load_signer
from archiver.tlog.witness import Witness
from archiver.upstream.api import SessionHostClient
from archiver.upstream.models import Session

log = logging.getLogger("archiver.pipeline")  # the name it had before the rooms: log filters keep working


#: Uploads in flight per store kind when `--upload-workers auto`: an S3 request spends most of its
#: time waiting on the network and the server, so more of them overlap than there are cores
#: (rclone's default is 4 transfers); a directory store is bound by the local disk.
AUTO_UPLOAD_WORKERS = {"s3": 4, "file": 2}


def _live_logs(settings: Settings, live: LiveCapture | None) -> LiveLogs | None:
    """What the fetch stage reads of live captures: the running engine's, or those a daemon left in
    the state dir (live capture since turned off, or `archiver archive` beside a stopped daemon)."""
    if live is not None:
        return LiveLogs(live.store, live.following)
    if (settings.state_dir / live_store.DIR_NAME / live_table.DB_NAME).is_file():
        return LiveLogs(capture_store(settings, followed=False))
    return None


def capture_store(settings: Settings, *, followed: bool = True) -> CaptureStore:
    """The live captures of the state dir, with their scratch (`archiver.live.scratch`) if one is set.
    ``followed``: for a live engine, whose checkpoint job settles seals held for their upload (in
    the room its follows' open files leave: `archiver.live.loop.seals_room`); else every seal is
    synced at once."""
    follows, limit = (settings.follow_logs_max if settings.follow_logs else 0), open_file_limit()
    delay, room = (
        settings.follow_logs_seal_sync_delay if followed else 0.0,
        seals_room(streams_room(follows, limit), limit),
    )
    if delay > 0 and room == 0:
        log.warning(
            "--follow-logs-seal-sync-delay has no effect: the open-file limit (%d) leaves no room to hold seals "
            "beside %d follows; every seal is synced at once (raise the hard limit, or lower --follow-logs-max)",
            limit, follows,
        )  # fmt: skip
    return CaptureStore(
        settings.state_dir,
        scratch_dir=settings.follow_logs_scratch_dir,
        scratch_bytes=settings.follow_logs_scratch_size,
        seal_sync_delay=delay,
        seals_room=room,
    )


def auto_upload_workers(store_url: str) -> int:
    """Upload workers for `--upload-workers auto`, by the store's kind (its URL scheme)."""
    return AUTO_UPLOAD_WORKERS["s3" if store_url.startswith("s3://") else "file"]


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
        live: LiveCapture | None = None,
    ) -> None:
        self.settings = settings
        #: Live capture of running sessions' logs (`archiver.live`), started with the pipeline.
        self.live = live
        self.client = client
        self.store = store
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self.tuning = tuning or Tuning()
        self._mono = monotonic
        self._policy = policy or RetryPolicy()
        self.spool = Spool(settings.state_dir / "spool")
        self.fetcher = Fetcher(
            client,
            self.spool,
            prefix=store.prefix,
            max_artifact_size=settings.max_artifact_size,
            policy=self._policy,
            live=_live_logs(settings, live),
        )
        self.uploader = Uploader(store, state.journal)
        self.upload_workers = settings.upload_workers or auto_upload_workers(store.url)
        # The store has no hook between parts; the journal is ours, so the crash point hangs there.
        state.journal.on_part_done = lambda: crashpoint("after_part_upload")

        self._wake = Wakeups(self.tuning.idle_wait, monotonic)
        self._stop = self._wake.stop
        if live is not None:
            # A capture settled (its finish checkpointed, or the loop died): a logs item waiting
            # for it, unclaimed, is fetched now.
            wake = self._wake
            live.on_settled = lambda: wake.notify(FETCH)
        self._threads: list[threading.Thread] = []
        self._gauges_at = float("-inf")
        refresh = functools.partial(self._refresh_gauges, force=False)
        parts = StageParts(state, metrics, self.tuning, self._wake, clock, monotonic, refresh)
        self.shard = settings.shard
        # Reconciliation: requested by start-up and by a successful poll after a gap.
        self._reconciler = Reconciler(
            settings, client, state, metrics, clock, policy=self._policy, on_queued=lambda: self._wake.notify(CONFIRM)
        )
        self.reconciled_once = self._reconciler.done_once
        self._endings = EndingStage(
            settings, client, parts, policy=self._policy, spool=self.spool, on_poll_gap=self._reconciler.request,
            live=live,
        )  # fmt: skip
        # Others may archive the same sessions (replicas of this shard, owners before a reshard):
        # check the store before fetching, and take a manifest with the same evidence for ours.
        several = not self.shard.whole or settings.replicas_per_shard > 1
        stagger = Stagger(
            self.shard.replica * self.tuning.replica_stagger, settings.retention - settings.deadline_margin
        )
        check = (
            ArchiveCheck(store, state, metrics, clock, self.spool.remove, stagger=stagger, monotonic=monotonic)
            if several
            else None
        )
        self._fetches = FetchStage(self.fetcher, parts, skip_fetch=check.skip_fetch if check else None)
        self.uploader.on_recognised = metrics.archive_recognised
        self._uploads = UploadStage(store, self.uploader, self.spool, settings.state_dir / "conflicts", parts)
        #: The transparency log of this daemon's archives (`--tlog-key-file`), None without a key.
        self.log_stage: LogStage | None = None
        if settings.tlog_key_file is not None:
            signer = load_signer(settings.tlog_key_file)
            witness = None
            if settings.tlog_witness_store is not None:
                from archiver.store import open_store  # imports botocore: only when a witness is configured

                witness = Witness(open_store(settings.tlog_witness_store, s3_endpoint_url=settings.s3_endpoint_url))
            self.log_stage = LogStage(
                state, store, signer, writer_name(self.shard), metrics, clock, interval=settings.tlog_interval,
                witness=witness, tsa_url=settings.tlog_tsa_url,
            )  # fmt: skip
            self._uploads.log_leaves = True

    @classmethod
    def open(cls, settings: Settings, client: SessionHostClient, metrics: SelfMetrics) -> Pipeline:
        """The store and the state DB named by the settings, with the pipeline between them."""
        from archiver.store import open_store  # imports botocore: only when a store is configured

        store = open_store(
            settings.require_store(),
            s3_endpoint_url=settings.s3_endpoint_url,
            checksum_mode=settings.s3_checksum,
            evidence=settings.evidence,
        )
        state = StateDB.open(settings.state_dir)
        live = None
        # The same cap the entry point raised the open-file limit for (`Settings.follow_cap`).
        if settings.follow_cap > 0 and settings.api_url and settings.api_token:
            live = LiveCapture(
                settings.api_url, settings.api_token, capture_store(settings),
                max_streams=settings.follow_cap, keep_finished=settings.prune_after,
                tuning=LiveTuning(first_byte_timeout=settings.follow_logs_first_byte_timeout),
            )  # fmt: skip
        return cls(settings, client, store, state, metrics, live=live)

    # --- the stages (a test hook: the state-machine test steps them with `work_once`) ------------

    @property
    def fetches(self) -> FetchStage:
        return self._fetches

    @property
    def uploads(self) -> UploadStage:
        return self._uploads

    # --- the store ----------------------------------------------------------------------------

    @property
    def store_url(self) -> str:
        return self.store.url

    def distrust_store(self) -> None:
        """Rely on no guarantee of the store until `probe_store` has seen it: writes check first
        (HEAD before a create-once write), manifests record no store checksum (`ObjectStore.distrust`)."""
        self.store.distrust()

    def probe_store(self) -> bool:
        """Probe create-once support (see store_health.probe_store); False when the store did not answer."""
        return probe_store(self.store, self.metrics)

    def check_store(self) -> bool:
        """One cheap read of the store → `archiver_store_up`."""
        return check_store(self.store, self.metrics)

    # --- lifecycle --------------------------------------------------------------------------

    def recover(self) -> None:
        """Start-up: put in-flight work back, clean the spool, resume/abort multipart uploads.

        Call once before `start()`. Sessions the DB knows as active become candidates if the
        first successful poll does not list them.
        """
        fetches, uploads = self.state.reset_in_flight()
        moved = self.state.relocate_spool(self.spool.directory)
        if moved:
            log.info("the state dir moved: %d spool files found by name in %s", moved, self.spool.directory)
        keep = {Path(p).name for p in self.state.spool_paths_in_use()}
        removed = self.spool.sweep(keep, sync_kept=self.settings.follow_logs_seal_sync_delay > 0)
        # Multipart uploads in the journal are resumed by put_file itself; everything else under
        # our prefix is an orphan of a crash between CreateMultipartUpload and the journal commit.
        self._uploads.sweep_orphans()
        known = self._endings.recover()
        self.metrics.set_retention(self.settings.retention)
        self.metrics.restore_last_archive_success(self.state.last_archived_at())
        # Whatever ended while we were not looking is found by the first reconciliation.
        self._reconciler.request()
        backlog = self.gauges()
        log.info(
            "state recovered: %d fetches and %d uploads resumed, %d stale spool files removed, "
            "%d sessions known active, %d candidates, %d items to fetch, %d to upload",
            fetches, uploads, removed, known, backlog.candidates,
            backlog.pending_fetch, backlog.pending_upload,
        )  # fmt: skip

    def start(self, *, reconcile: bool = True, follow: bool = True) -> None:
        """Start the reconcile, confirm, fetch and upload threads, and live capture (`archiver
        archive` needs neither a reconciler nor live capture)."""
        if self._threads:
            raise RuntimeError("the pipeline is already started")
        self._stop.clear()
        if follow and self.live is not None:
            self.live.start()
        specs = (
            [("reconcile", functools.partial(self._reconciler.run, self._stop))] * reconcile
            + [("confirm", self._endings.run)] * self.tuning.confirm_workers
            + [("fetch", self._fetches.run)] * self.settings.fetch_workers
            + [("upload", self._uploads.run)] * self.upload_workers
            # Last, so stop() joins it after the upload workers whose outcomes it commits.
            + [("commit", functools.partial(self._uploads.committer.run, self._stop))]
        )
        if self.log_stage is not None:
            # After the committer: its last batch logs what the last manifests queued.
            specs.append(("tlog", functools.partial(self.log_stage.run, self._stop)))
        for n, (name, target) in enumerate(specs):
            thread = threading.Thread(target=target, name=f"archiver-{name}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask every thread to stop and wait up to `timeout` s; True if all stopped.

        An item interrupted mid-fetch or mid-upload is simply resumed by the next `recover()`.
        """
        self._stop.set()
        self._reconciler.request()
        self._wake.notify()
        self._uploads.committer.wake()
        until = time.monotonic() + timeout
        if self.live is not None:
            self.live.stop(timeout)
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = [t for t in self._threads if t.is_alive()]
        if alive:
            log.warning("pipeline threads still busy after %.0f s: %s", timeout, ", ".join(alive))
        self._close_witness(alive)
        return not alive

    def _close_witness(self, alive: Sequence[str]) -> None:
        """Release the witness store this pipeline opened, once the log thread (its only user) ended."""
        witness = self.log_stage.witness if self.log_stage is not None else None
        if witness is None or any("-tlog-" in name for name in alive):
            return  # a log thread still busy keeps it: closing under it would fail its last batch
        witness.store.close()

    def alive(self) -> bool:
        """For /healthz: started and every worker thread still running (loops survive errors, so a
        dead thread means the process must be restarted)."""
        return bool(self._threads) and not self._stop.is_set() and all(t.is_alive() for t in self._threads)

    # --- detection (archive/ending.py) -------------------------------------------------------

    def observe_poll(
        self, sessions: Sequence[Session] | None, now: float, *, present_ids: Set[str] = frozenset()
    ) -> None:
        """Record one list poll (None = failed: nothing ends on a failed poll); see `EndingStage.observe_poll`."""
        self._endings.observe_poll(sessions, now, present_ids=present_ids)

    def backfill(self, session_ids: Sequence[str]) -> list[str]:
        """Archive these sessions now if the upstream still holds them ended; returns the ids queued
        (see `EndingStage.backfill`)."""
        return self._endings.backfill(session_ids)

    # --- reconciliation (archive/reconcile.py) ---------------------------------------------

    def reconcile(self) -> int:
        """One reconciliation now (see `Reconciler.reconcile`); the number of sessions queued."""
        return self._reconciler.reconcile()

    # --- reporting --------------------------------------------------------------------------

    def gauges(self) -> Backlog:
        """Refresh archiver_pending_items, archiver_next_fetch_deadline..., archiver_spool_bytes."""
        backlog = self.state.backlog()
        self.metrics.set_pending("fetch", backlog.pending_fetch)
        self.metrics.set_pending("upload", backlog.pending_upload)
        self.metrics.set_next_fetch_deadline(backlog.next_fetch_deadline)
        self.metrics.set_spool_bytes(backlog.spool_bytes)
        if self.live is not None:
            self.metrics.live_capture(self.live.stats)
        self._gauges_at = time.monotonic()
        return backlog

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Around a poll cycle: live capture takes no stream's bytes meanwhile (`LiveCapture.paused`)."""
        return self.live.paused() if self.live is not None else contextlib.nullcontext()

    def _refresh_gauges(self, *, force: bool) -> None:
        if force or time.monotonic() - self._gauges_at >= self.tuning.gauge_interval:
            self.gauges()

    def status(self) -> list[PendingItem]:
        """Unfinished items, earliest deadline first, with the time left (for `archiver status`)."""
        return self.state.pending_items(self.clock())

    def request_reconcile(self) -> None:
        """Reconcile as soon as possible (tests, and operators through the daemon)."""
        self._reconciler.request()

    def run_until_idle(self, timeout: float) -> bool:
        """Wait until no candidate, item or manifest is pending (True) or `timeout` s passed (False)."""
        until = time.monotonic() + timeout
        while True:
            generation = self._wake.snapshot()
            if self.state.backlog().idle:
                self.gauges()
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            self._wake.wait(generation, left)
