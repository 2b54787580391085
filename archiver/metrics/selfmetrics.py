"""The archiver's own health and pipeline metrics (`archiver_*`), on an injected prometheus_client registry.

These are few and change as work happens, so ordinary prometheus_client instrumentation fits; they are
rendered when they changed (every event method bumps a generation; a scrape re-renders only when it
moved) and appended after the pre-rendered snapshot. The two snapshot gauges
`archiver_sessions_exported` / `archiver_sessions_dropped` are NOT registered here: the snapshot
renders them (archiver.exposition), and a name must not appear twice in one body.
"""

from __future__ import annotations

import functools
import platform
import threading
from collections.abc import Callable, Iterable
from typing import Concatenate, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest as _text_generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as _om_generate_latest

from archiver import __version__
from archiver.live.report import LiveStats
from archiver.metrics.live import LiveMetrics
from archiver.metrics.process import register_process_collectors
from archiver.metrics.registration import Families
from archiver.metrics.tlog import LogMetrics
from archiver.retry import OPERATIONS
from archiver.vocabulary import OUTCOMES

#: Label values of archiver_items_total / archiver_pending_items (ARCHITECTURE.md §6; the outcomes are
#: `vocabulary.OUTCOMES`); pre-created at 0 so `rate()` and alerts see the series before the first event.
ITEM_KINDS = ("logs", "artifact")
PENDING_STAGES = ("fetch", "upload")
#: Label values of archiver_errors_total: every loop and request edge that counts what it caught.
#: Pre-created at 0: `increase()` reads a series born at 1 as no increase, so without them the first
#: error of an edge in a process's life would never fire ArchiverErrors.
ERROR_EDGES = (
    "poll",
    "render",
    "http",
    "confirm",
    "reconcile",
    "fetch",
    "spool",
    "store",
    "store_probe",
    "upload",
    "finalize",
    "manifest",
    "live",
    "tlog",
    "index_compact",
)

#: One `endpoint` vocabulary on every archiver_upstream_* metric: the API client names a request by
#: method and path template, the poll metrics by the polled resource ("sessions", "metrics"); the
#: requests counter uses the same short names, so `archiver_upstream_requests_total{endpoint="sessions"}`
#: and `archiver_upstream_up{endpoint="sessions"}` join.
ENDPOINT_LABELS = {
    "GET /session": "sessions",
    "GET /metrics": "metrics",
    "GET /session/{id}": "session",
    "POST /session": "session_create",
    "DELETE /session/{id}": "session_stop",
    "PUT /session/player/join": "player_join",
    "DELETE /session/player/leave": "player_leave",
    "GET /available-location/{image}": "available_locations",
    "GET /tag/{region}/{image}/{version}": "tag",
    "GET /artifacts": "artifacts",
    "GET /query/log": "log_query",
    "GET /logs": "logs",
}

#: Poll durations: a healthy poll is tens of ms, a struggling upstream takes seconds (timeouts ~30 s).
POLL_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Time left before the 4 h removal window closes when a fetch completes: minutes to 4 h; the 0 bucket
#: catches fetches that completed late (negative slack).
DEADLINE_SLACK_BUCKETS = (
    0.0,
    60.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    5400.0,
    7200.0,
    9000.0,
    10800.0,
    12600.0,
    14400.0,
)
#: End seen → manifest written: seconds when healthy, hours while the store is down.
COMPLETION_DELAY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0)


#: The help text of every `archiver_*` family registered here, in registration order (the order a
#: scrape lists them in): each declaration below is then one line of name and labels (`Families`).
_HELP = {
    "archiver_build_info": "Build information of the running archiver, always 1.",
    "archiver_upstream_up": "Whether the last poll of the upstream endpoint succeeded (1) or failed (0).",
    "archiver_upstream_last_success_timestamp_seconds": (
        "When the upstream endpoint was last polled successfully, in seconds since the epoch."
    ),
    "archiver_upstream_poll_duration_seconds": "Duration of polls of the upstream endpoint, successful or not.",
    "archiver_upstream_requests": (
        "Requests sent to the upstream, by endpoint and HTTP status (or 'error' without one)."
    ),
    "archiver_upstream_invalid_entries": (
        "Upstream session-list entries left out of a poll because a value failed the range checks."
    ),
    "archiver_sessions_ended": "Sessions seen disappearing from the session list (candidates for archiving).",
    "archiver_items": "Archive items (logs, artifacts) finished, by kind and outcome.",
    "archiver_pending_items": "Archive items waiting in each pipeline stage.",
    "archiver_next_fetch_deadline_timestamp_seconds": (
        "Earliest fetch deadline among pending items, in seconds since the epoch."
    ),
    "archiver_fetch_deadline_slack_seconds": (
        "Time left before the upstream removes a session's data when its fetch completed."
    ),
    "archiver_completion_delay_seconds": "Time from a session's end being seen to its manifest being written.",
    "archiver_bytes": "Bytes moved by the pipeline, by stage (fetch, upload) and kind (logs, artifact).",
    "archiver_spool_bytes": "Bytes held in the local spool awaiting upload.",
    "archiver_retention_seconds": "Configured upstream retention window after a session ends (the fetch deadline).",
    "archiver_last_archive_success_timestamp_seconds": (
        "When a session's manifest was last written, in seconds since the epoch."
    ),
    "archiver_errors": "Unexpected errors caught at loop and request edges, by where they happened.",
    "archiver_store_conditional_writes_supported": (
        "Whether the store honours create-once (If-None-Match) writes (1) or is emulated (0)."
    ),
    "archiver_store_guarantee": (
        "Whether the store keeps a guarantee (1) or the archiver falls back (0), as probed at start-up."
    ),
    "archiver_detection_up": (
        "Whether the last successful session-list poll was processed by end detection (1) or failed in it (0)."
    ),
    "archiver_sessions_failed": (
        "Sessions given up on: their manifest could not be written before the fetch deadline."
    ),
    "archiver_sessions_reopened": (
        "Sessions listed again after they were taken for ended (their real end is archived too)."
    ),
    "archiver_reconciled_sessions": (
        "Ended sessions found by reconciliation (GET /session?all=true) that the polls had missed."
    ),
    "archiver_archives_recognised": (
        "Sessions whose archive another replica or shard had written already (same items, same bytes): "
        "counted as archived, nothing written."
    ),
    "archiver_shard_info": (
        "This daemon's shard of total_shards and its replica within the shard, always 1 (sum by shard "
        "with max over replicas to count a fleet once)."
    ),
    "archiver_store_up": "1 when the last store operation or probe succeeded, 0 when it failed.",
    "archiver_retries": "Retries of transient failures, by operation (archiver.retry's named policies).",
}


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _event(method: Callable[Concatenate[SelfMetrics, _P], _R]) -> Callable[Concatenate[SelfMetrics, _P], _R]:
    """Marks an event method: once its change is made, the render generation moves, so the next
    scrape renders again. Every public method of SelfMetrics but `render` is one (a test checks)."""

    @functools.wraps(method)
    def wrapper(self: SelfMetrics, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        finally:
            with self._generation_lock:  # `+=` from two threads could lose a bump, or go back
                self._generation += 1

    return wrapper


class SelfMetrics:
    """Creates every `archiver_*` metric of ARCHITECTURE.md §6 (except the two snapshot gauges) and offers one
    method per event the poller and the pipeline report. All methods are thread-safe."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        version: str = __version__,
        endpoints: Iterable[str] = ("sessions", "metrics"),
        process_metrics: bool = True,
        render_cache: bool = True,
    ) -> None:
        self.registry = registry
        #: Whether `render` reuses its last bytes until an event method runs. The registry's render is
        #: most of what a scrape costs beyond sending the snapshot's prepared bytes, and scrapes come
        #: far more often than the events that change these metrics. False renders at every scrape
        #: (to rule the cache out when a value looks stale).
        self.render_cache = render_cache
        if process_metrics:
            # Rendered with the rest (see `render`): as fresh as the last event, at least every poll.
            register_process_collectors(registry)
        #: Bumped after every event method (see `_event`); `render` reuses its bytes while it stays.
        self._generation = 0
        self._generation_lock = threading.Lock()
        self._rendered: dict[bool, tuple[int, bytes]] = {}
        family = Families(registry, _HELP)
        self._build_info = family.gauge("archiver_build_info", "version", "python_version")
        self._build_info.labels(version, platform.python_version()).set(1)
        self._up = family.gauge("archiver_upstream_up", "endpoint")
        self._last_success = family.gauge("archiver_upstream_last_success_timestamp_seconds", "endpoint")
        self._poll_duration = family.histogram(
            "archiver_upstream_poll_duration_seconds", POLL_DURATION_BUCKETS, "endpoint"
        )
        self._requests = family.counter("archiver_upstream_requests", "endpoint", "code")
        self._upstream_invalid = family.counter("archiver_upstream_invalid_entries")
        self._sessions_ended = family.counter("archiver_sessions_ended")
        self._items = family.counter("archiver_items", "kind", "outcome")
        self._pending = family.gauge("archiver_pending_items", "stage")
        # Absent while nothing is pending (see `set_next_fetch_deadline`).
        self._next_deadline = family.optional_gauge("archiver_next_fetch_deadline_timestamp_seconds")
        self._deadline_slack = family.histogram("archiver_fetch_deadline_slack_seconds", DEADLINE_SLACK_BUCKETS)
        self._completion_delay = family.histogram("archiver_completion_delay_seconds", COMPLETION_DELAY_BUCKETS)
        self._bytes = family.counter("archiver_bytes", "stage", "kind")
        self._spool_bytes = family.gauge("archiver_spool_bytes")
        self._retention = family.gauge("archiver_retention_seconds")
        self._last_archive_success = family.gauge("archiver_last_archive_success_timestamp_seconds")
        self._errors = family.counter("archiver_errors", "where")
        self._conditional_writes = family.gauge("archiver_store_conditional_writes_supported")
        self._store_guarantees = family.gauge("archiver_store_guarantee", "guarantee")
        self._detection_up = family.gauge("archiver_detection_up")
        self._sessions_failed = family.counter("archiver_sessions_failed")
        self._sessions_reopened = family.counter("archiver_sessions_reopened")
        self._reconciled = family.counter("archiver_reconciled_sessions")
        self._recognised = family.counter("archiver_archives_recognised")
        self._shard_info = family.gauge("archiver_shard_info", "shard", "total_shards", "replica")
        # Absent until the first store operation or probe: export-only mode (no store) must not
        # show a store that is "down", and 0 before the first probe would claim a failure.
        self._store_up = family.optional_gauge("archiver_store_up")
        # archiver_upstream_up stays absent until the first poll: 0 would claim a failure that did not happen.
        for endpoint in endpoints:
            self._poll_duration.labels(endpoint)
        for kind in ITEM_KINDS:
            for outcome in OUTCOMES:
                self._items.labels(kind, outcome)
        for stage in PENDING_STAGES:
            self._pending.labels(stage)
        self._retries = family.counter("archiver_retries", "operation")
        # Every operation a retry policy names (S3's retries are botocore's own, not seen here: its
        # series stays at 0).
        for operation in OPERATIONS:
            self._retries.labels(operation)
        for where in ERROR_EDGES:
            self._errors.labels(where)
        self._live = LiveMetrics(registry)
        self._log = LogMetrics(registry)

    # --- poller ---------------------------------------------------------------------------------

    @_event
    def upstream_request(self, endpoint: str, code: int | str) -> None:
        """Count one upstream request; `code` is the HTTP status, or e.g. "error" when none came back.
        `endpoint` is the API client's request name ("GET /session"), exported as ENDPOINT_LABELS says."""
        self._requests.labels(ENDPOINT_LABELS.get(endpoint, endpoint), str(code)).inc()

    @_event
    def poll_result(self, endpoint: str, *, ok: bool, duration: float, now: float) -> None:
        """Record one poll of an endpoint (`now` is the wall-clock time of its end)."""
        self._up.labels(endpoint).set(1 if ok else 0)
        self._poll_duration.labels(endpoint).observe(duration)
        if ok:
            self._last_success.labels(endpoint).set(now)

    @_event
    def upstream_invalid_entries(self, count: int) -> None:
        """`count` entries of one session-list poll were left out (each poll that still sees one counts it)."""
        self._upstream_invalid.inc(count)

    @_event
    def sessions_ended(self, count: int = 1) -> None:
        self._sessions_ended.inc(count)

    # --- pipeline -------------------------------------------------------------------------------

    @_event
    def item_done(self, kind: str, outcome: str) -> None:
        """An item reached a final outcome (kind `logs|artifact`, outcome per vocabulary.OUTCOMES)."""
        self._items.labels(kind, outcome).inc()

    @_event
    def set_pending(self, stage: str, count: int) -> None:
        self._pending.labels(stage).set(count)

    @_event
    def set_next_fetch_deadline(self, timestamp: float | None) -> None:
        """The earliest pending fetch deadline; None removes the series (nothing pending)."""
        self._next_deadline.set(timestamp)

    @_event
    def fetch_completed(self, slack_seconds: float) -> None:
        """A fetch finished `slack_seconds` before its deadline (negative when after it)."""
        self._deadline_slack.observe(slack_seconds)

    @_event
    def archive_completed(self, *, delay_seconds: float, now: float) -> None:
        """A session's manifest was written `delay_seconds` after its end was seen."""
        self._completion_delay.observe(delay_seconds)
        self._last_archive_success.set(now)

    @_event
    def add_bytes(self, stage: str, kind: str, count: int) -> None:
        self._bytes.labels(stage, kind).inc(count)

    @_event
    def set_spool_bytes(self, count: int) -> None:
        self._spool_bytes.set(count)

    @_event
    def set_retention(self, seconds: float) -> None:
        self._retention.set(seconds)

    @_event
    def set_conditional_writes_supported(self, supported: bool) -> None:
        self._conditional_writes.set(1 if supported else 0)

    @_event
    def set_store_guarantees(self, held: Iterable[tuple[str, bool]]) -> None:
        """What the store probe found, per guarantee (S3 stores only)."""
        for guarantee, ok in held:
            self._store_guarantees.labels(guarantee).set(1 if ok else 0)

    @_event
    def set_store_up(self, up: bool) -> None:
        """The outcome of the latest store operation or probe (absent until the first one)."""
        self._store_up.set(1 if up else 0)

    @_event
    def set_shard(self, shard: int, total_shards: int, replica: int) -> None:
        self._shard_info.clear()
        self._shard_info.labels(str(shard), str(total_shards), str(replica)).set(1)

    @_event
    def archive_recognised(self, now: float | None = None) -> None:
        """A session another replica (or an earlier owner) had archived already: success, nothing
        written. Given `now` (found before fetching: no manifest of ours follows), it is also this
        daemon's last archive success, so a replica that mostly finds its partner's archives is not
        taken for stuck."""
        self._recognised.inc()
        if now is not None:
            self._last_archive_success.set(now)

    @_event
    def set_detection_up(self, up: bool) -> None:
        self._detection_up.set(1 if up else 0)

    @_event
    def session_failed(self) -> None:
        self._sessions_failed.inc()

    @_event
    def session_reopened(self, count: int = 1) -> None:
        self._sessions_reopened.inc(count)

    @_event
    def reconciled(self, count: int) -> None:
        self._reconciled.inc(count)

    @_event
    def restore_last_archive_success(self, timestamp: float | None) -> None:
        """After a restart: the newest manifest the state DB knows of (absent → left at 0)."""
        if timestamp is not None:
            self._last_archive_success.set(timestamp)

    @_event
    def retried(self, operation: str) -> None:
        """One retry of `operation` (an archiver.retry observer)."""
        self._retries.labels(operation).inc()

    @_event
    def live_capture(self, take: Callable[[], LiveStats]) -> None:
        """Live capture's state (`archiver_live_*`; its edge errors as `where="live"`) from `take`:
        its `stats`, called under `LiveMetrics`' lock."""
        errors = self._live.report(take)
        if errors:
            self._errors.labels("live").inc(errors)

    @_event
    def log_checkpoint(self, *, appended: int, size: int, now: float) -> None:
        self._log.checkpoint(appended, size, now)

    @_event
    def set_log_state(self, *, pending: int, consistent: bool) -> None:
        self._log.state(pending, consistent)

    @_event
    def error(self, where: str) -> None:
        """An unexpected exception was caught at a loop or request edge (`where`: e.g. poll, fetch, http)."""
        self._errors.labels(where).inc()

    # --- exposition -----------------------------------------------------------------------------

    def render(self, openmetrics: bool) -> bytes:
        """The registry in the requested format; the OpenMetrics body ends with `# EOF` (it goes last).

        Rendered again only when an event method ran since the last render of that format (see
        `render_cache`). The generation is read before rendering: an event that lands during the
        render moves it, so the next scrape renders again and nothing is ever served stale past one
        scrape.
        """
        generation = self._generation
        cached = self._rendered.get(openmetrics)
        if self.render_cache and cached is not None and cached[0] == generation:
            return cached[1]
        if openmetrics:
            # prometheus_client's OpenMetrics writer has no annotations.
            body: bytes = _om_generate_latest(self.registry)  # type: ignore[no-untyped-call]
        else:
            body = _text_generate_latest(self.registry)
        self._rendered[openmetrics] = (generation, body)
        return body
