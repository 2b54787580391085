"""`archiver run`: assembles client, poller, renderer, HTTP server and pipeline; runs them until stopped."""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import signal
import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from archiver import __version__
from archiver.app import logs as logsetup
from archiver.app import process
from archiver.config.settings import Settings
from archiver.durable import StateDirLock
from archiver.exporter.exposition import SnapshotRenderer
from archiver.exporter.metricsserver import MetricsServer
from archiver.exporter.poller import ENDPOINTS, SESSIONS, Poller, PollResult
from archiver.exporter.snapshot import Snapshot
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.upstream.api import SessionHostClient
from archiver.upstream.listparser import SessionListParser
from archiver.upstream.models import Session
from archiver.upstream.sessionlist import Digests, sha256_digests
from archiver.web.webconfig import load_web_config

if TYPE_CHECKING:
    from archiver.index import schedule as index_schedule

_PLAYER_COUNT = operator.attrgetter("player_count")

log = logging.getLogger("archiver.daemon")


class ArchivePipeline(Protocol):
    """What the daemon needs of the archiving half (archiver.archive.pipeline.Pipeline)."""

    def recover(self) -> None: ...
    def start(self, *, reconcile: bool = ..., follow: bool = ...) -> None: ...
    def paused(self) -> contextlib.AbstractContextManager[None]: ...
    def stop(self, timeout: float = ...) -> bool: ...
    def observe_poll(
        self, sessions: list[Session] | None, now: float, *, present_ids: AbstractSet[str] = ...
    ) -> None: ...
    def alive(self) -> bool: ...
    def gauges(self) -> object: ...
    def distrust_store(self) -> None: ...
    def probe_store(self) -> bool: ...
    def check_store(self) -> bool: ...

    @property
    def store_url(self) -> str: ...


PipelineFactory = Callable[[Settings, SessionHostClient, SelfMetrics], ArchivePipeline]


def default_pipeline(settings: Settings, client: SessionHostClient, metrics: SelfMetrics) -> ArchivePipeline:
    """The store and the state DB named by the settings, with the pipeline between them."""
    from archiver.archive.pipeline import Pipeline

    return Pipeline.open(settings, client, metrics)


@dataclass(frozen=True, slots=True)
class PollSummary:
    """Counts of the last successful session poll (for status lines; the snapshot has the detail)."""

    sessions: int = 0
    players: int = 0


class Daemon:
    """The long-running process. `start()` returns once everything runs; `stop()` is graceful."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: SessionHostClient | None = None,
        pipeline_factory: PipelineFactory | None = default_pipeline,
        clock: Callable[[], float] = time.time,
        list_digests: Digests = sha256_digests,
    ) -> None:
        """``list_digests``: how the poller's parser remembers entries, the entry point's choice
        (`process.apply`: the keyed hash under the process tuning)."""
        self.settings = settings
        self._clock = clock
        self.registry = CollectorRegistry()
        self.metrics = SelfMetrics(self.registry, version=__version__, endpoints=ENDPOINTS)
        self.metrics.set_retention(settings.retention)
        shard = settings.shard
        self.metrics.set_shard(shard.index, shard.total, shard.replica)
        if client is None:
            api_url, token = settings.require_api()
            client = SessionHostClient.connect(
                api_url, token, observer=self._observe_request, retry_observer=self.metrics.retried
            )
        self.client = client
        self.renderer = SnapshotRenderer(
            max_sessions=settings.max_sessions, label_allowlist=settings.session_label_allowlist
        )
        self._snapshot: Snapshot | None = None
        self._first_poll_done = False
        #: Why the last poll's end detection failed (None: it did not).
        self._detection_error: str | None = None
        self.last_poll_summary = PollSummary()
        self._stop = threading.Event()
        self.poller = Poller(
            client,
            interval=settings.poll_interval,
            on_result=self._on_poll,
            clock=clock,
            # Sharded: other shards' entries are skipped before their parse; shard 0 re-exposes /metrics.
            parser=SessionListParser(owns=None if shard.whole else shard.owns, digests=list_digests),
            upstream_metrics=shard.index == 0,
        )
        self._poll_thread = threading.Thread(target=self._poll_loop, name="poller", daemon=True)
        self._probe_thread = threading.Thread(target=self._probe_store, name="store-probe", daemon=True)
        #: Created by start() (which takes the state dir's lock first): None until then, and when exporting only.
        self.pipeline: ArchivePipeline | None = None
        #: Shard 0 compacts the columnar index (every replica, staggered; create-once keeps one copy).
        self.index_compactor: index_schedule.IndexCompactor | None = None
        if settings.store and shard.index == 0:
            from archiver.index.schedule import IndexCompactor  # duckdb, botocore: only where it runs
            from archiver.store import open_store

            self.index_compactor = IndexCompactor(
                functools.partial(
                    open_store, settings.store, s3_endpoint_url=settings.s3_endpoint_url,
                    checksum_mode=settings.s3_checksum,
                ),
                interval=settings.index_compact_interval,
                clock=clock,
                on_error=lambda: self.metrics.error("index_compact"),
                # Not at start-up (recovery and the first polls come first); replicas a minute apart.
                first_delay=60.0 * (shard.replica + 1),
            )  # fmt: skip
        self._pipeline_factory = pipeline_factory if settings.store else None
        self._lock = StateDirLock(settings.state_dir)
        web_config = load_web_config(settings.web_config_file) if settings.web_config_file else None
        self.server = MetricsServer(
            settings.listen,
            snapshot_source=lambda: self._snapshot,
            self_metrics=self.metrics,
            health=self.health,
            ready=self.ready,
            web_config=web_config,
        )

    def _observe_request(self, endpoint: str, code: str, seconds: float) -> None:
        self.metrics.upstream_request(endpoint, code)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._pipeline_factory is not None:
            self._lock.acquire()
            self.pipeline = self._pipeline_factory(self.settings, self.client, self.metrics)
            # Until the probe has shown that the store enforces If-None-Match, writes check first.
            self.pipeline.distrust_store()
            self._probe_thread.start()
            self.pipeline.recover()
            self.pipeline.start()
            self.poller.guard = self.pipeline.paused
        else:
            log.info("no --store configured: exporting only, nothing will be archived")
        self.server.start()
        self._poll_thread.start()
        if self.index_compactor is not None:
            self.index_compactor.start()
        log.info(
            "serving /metrics",
            extra={
                "url": f"{self.server.url}/metrics",
                "upstream": self.settings.api_url,
                "store": self.settings.store,
            },
        )

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._poll_thread.ident is not None:  # stop() is safe before start(), e.g. after a failed start
            self._poll_thread.join(timeout)
        if self.index_compactor is not None:
            self.index_compactor.stop(timeout)
        if self.pipeline is not None:
            self.pipeline.stop(timeout)
        self.server.stop()
        self.client.close()
        self._lock.release()
        log.info("stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        self._stop.set()

    def _probe_store(self, retry_every: float = 30.0) -> None:
        """Probe the store until it answers (an outage at start-up must not stop the daemon), then
        check its health every poll interval, so `archiver_store_up` tells the truth within one
        interval even when nothing is being uploaded."""
        pipeline = self.pipeline
        assert pipeline is not None
        retry_every = min(retry_every, self.settings.poll_interval)
        warned = False
        while not self._stop.is_set():
            try:
                if pipeline.probe_store():
                    break
            except Exception:  # the thread's edge: counted, and writes keep checking first
                self.metrics.error("store_probe")
                log.exception("store probe crashed")
                return
            if not warned:
                log.error("STORE UNREACHABLE at start-up (%s): archives wait in the spool; probing every %gs",
                          pipeline.store_url, retry_every)  # fmt: skip
                warned = True
            self._stop.wait(retry_every)
        while not self._stop.wait(self.settings.poll_interval):
            try:
                pipeline.check_store()
            except Exception:  # the thread's edge
                self.metrics.error("store_probe")
                log.exception("store health check crashed")

    # --- the poll -----------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        self.poller.run(self._stop)

    def _on_poll(self, result: PollResult) -> None:
        # The archiving half first: it is the one with a deadline, and an exporter problem must
        # not hold it up.
        if self.pipeline is not None:
            self._detect(result)
        self.metrics.upstream_invalid_entries(len(result.invalid))  # quarantined list entries (0: no-op)
        for endpoint in ENDPOINTS if self.poller.upstream_metrics else (SESSIONS,):
            self.metrics.poll_result(
                endpoint,
                ok=endpoint not in result.errors,
                duration=result.durations.get(endpoint, 0.0),
                now=result.started_at,
            )
        try:
            self._snapshot = self.renderer.render(
                result.sessions, result.families, now=result.started_at, delta=result.delta
            )
        except Exception:  # the render's edge: the last snapshot keeps being served, and /readyz ages it
            self.metrics.error("render")
            log.exception("rendering the snapshot failed")
        if result.sessions is not None:
            # C-level sum: this runs on the poller thread every poll, over every listed session.
            players = sum(filter(None, map(_PLAYER_COUNT, result.sessions)))
            self.last_poll_summary = PollSummary(len(result.sessions), players)
        self._first_poll_done = True

    def _detect(self, result: PollResult) -> None:
        """End detection for one poll; a failure here is ours, not the upstream's, and must show."""
        assert self.pipeline is not None
        try:
            present = {e.session_id for e in result.invalid if e.session_id}
            self.pipeline.observe_poll(result.sessions, result.started_at, present_ids=present)
            self.pipeline.gauges()  # backlog gauges as fresh as the snapshot they are scraped with
        except Exception as exc:  # the poll's edge: counted, shown on /readyz and by archiver_detection_up
            self.metrics.error("poll")
            self.metrics.set_detection_up(False)
            self._detection_error = f"{type(exc).__name__}: {exc}"[:200]
            log.exception("end detection failed for this poll")
            return
        if result.sessions is not None:
            self.metrics.set_detection_up(True)
            self._detection_error = None

    # --- probes -------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Alive: the poll loop has turned recently and the pipeline's workers are running."""
        if self._poll_thread.is_alive():
            silent_for = time.monotonic() - self.poller.heartbeat
            # One interval plus the poll's own retry budget, with room to spare.
            if self.poller.heartbeat and silent_for > self.settings.poll_interval * 3 + 60:
                return False, f"poll loop silent for {silent_for:.0f}s"
        elif not self._stop.is_set():
            return False, "poll loop is not running"
        if self.pipeline is not None and not self.pipeline.alive():
            return False, "archive workers are not running"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Ready: first poll done, state recovered, and the snapshot not older than a few polls."""
        if not self._first_poll_done or self._snapshot is None:
            return False, "first poll not done yet"
        if self._detection_error is not None:
            return False, f"end detection failing: {self._detection_error}"
        age = self._clock() - self._snapshot.rendered_at
        if age > self.settings.poll_interval * 5 + 30:
            return False, f"snapshot is {age:.0f}s old"
        return True, "ok"


def run_forever(settings: Settings, *, early: Iterable[logging.LogRecord] = ()) -> None:
    """The `archiver run` entry point: logs, signals, start, wait, graceful stop.

    ``early``: log records kept while the configuration was read (deprecated option names), written
    in the configured format."""
    applied = process.apply(follows=settings.follow_cap)
    # Every value the token has held, asked per line: a rotated token file adds one.
    secrets = settings.api_token.known_values if settings.api_token else ()
    logsetup.configure(settings.log_format, settings.log_level, secrets=secrets, early=early)
    daemon = Daemon(settings, list_digests=applied.list_digests)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    daemon.start()
    while not daemon.wait(1.0):
        pass
    daemon.stop()


def archive_now(
    settings: Settings, session_ids: list[str], *, timeout: float, early: Iterable[logging.LogRecord] = ()
) -> tuple[list[str], bool]:
    """`archiver archive ID...`: backfill these sessions through the same pipeline and wait for it.

    Returns the ids that were queued and whether everything finished within `timeout`.
    Meant for when no daemon runs on the same state dir (SQLite has one writer).
    """
    process.apply(tuning=False)  # one short run, no live capture (`Pipeline.start(follow=False)`)
    # Every value the token has held, asked per line: a rotated token file adds one.
    secrets = settings.api_token.known_values if settings.api_token else ()
    logsetup.configure(settings.log_format, settings.log_level, secrets=secrets, early=early)
    api_url, token = settings.require_api()
    settings.require_store()
    from archiver.archive.pipeline import Pipeline

    metrics = SelfMetrics(CollectorRegistry(), version=__version__)
    lock = StateDirLock(settings.state_dir)
    lock.acquire()  # a daemon on the same state dir would have its in-flight work reset by recover()
    try:  # released whatever fails, so the caller's process may open this state dir again
        with SessionHostClient.connect(api_url, token) as client:
            pipeline = Pipeline.open(settings, client, metrics)
            try:
                pipeline.distrust_store()  # writes check first unless the probe passes
                pipeline.probe_store()
                pipeline.recover()
                pipeline.start(reconcile=False, follow=False)
                queued = pipeline.backfill(session_ids)
                finished = pipeline.run_until_idle(timeout)
            finally:
                pipeline.stop(30.0)
    finally:
        lock.release()
    return queued, finished
