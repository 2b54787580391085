"""The `archiver_live_*` metrics of live log capture (`archiver.live`), fed from its stats at every
gauge refresh (`Pipeline.gauges`: after a poll, and from the stage workers)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric

from archiver.live.policy import Ending, Finish
from archiver.live.report import FIRST_BYTE_BUCKETS, LiveStats
from archiver.metrics.registration import Families

#: The help text of each family, in the order a scrape lists them (the first-byte histogram last).
_HELP = {
    "archiver_live_followed_sessions": (
        "Active sessions whose log this daemon follows live (a stream open, opening, or waiting to reopen)."
    ),
    "archiver_live_unfollowed_sessions": (
        "Active sessions of this shard left without a live follow by --follow-logs-max."
    ),
    "archiver_live_reconnects": (
        "Follow streams reopened, by how the stream before ended (cut, stalled, refused, gone, throttled, ...)."
    ),
    "archiver_live_lines": "Log lines captured live (kept once each).",
    "archiver_live_bytes": "Bytes of log lines captured live (kept once each).",
    "archiver_live_captures": (
        "Live captures finished, by state: complete (saw the end), gap (end not seen), diverged (a "
        "later replay differed; kept beside it)."
    ),
    "archiver_live_scratch_bytes": (
        "Bytes of running captures held in --follow-logs-scratch-dir (0 without one): size its tmpfs by it."
    ),
    "archiver_live_scratch_spills": (
        "Running captures moved from the scratch to the state dir: the scratch reached "
        "--follow-logs-scratch-size or its filesystem was full."
    ),
    "archiver_live_seals_unsynced": (
        "Finished captures' seals not synced yet, each waiting up to --follow-logs-seal-sync-delay for "
        "its upload: what a machine crash now would lose where the service forgot the logs."
    ),
    "archiver_live_first_byte_seconds": (
        "Seconds from a session's first listing to the first line captured of its log by a live follow."
    ),
}
FIRST_BYTE = "archiver_live_first_byte_seconds"


class LiveMetrics:
    """Gauges of followed and unfollowed sessions; counters of reconnects (by the reason the stream
    before ended), lines and bytes captured, and captures finished (by how complete). The engine
    keeps running totals; each report adds what grew since the previous one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry, _HELP)
        self._followed = family.gauge("archiver_live_followed_sessions")
        self._unfollowed = family.gauge("archiver_live_unfollowed_sessions")
        self._reconnects = family.counter("archiver_live_reconnects", "reason")
        self._lines = family.counter("archiver_live_lines")
        self._bytes = family.counter("archiver_live_bytes")
        self._captures = family.counter("archiver_live_captures", "state")
        self._scratch_bytes = family.gauge("archiver_live_scratch_bytes")
        self._spills = family.counter("archiver_live_scratch_spills")
        self._unsynced = family.gauge("archiver_live_seals_unsynced")
        for reason in Ending:
            self._reconnects.labels(reason.value)
        for state in Finish:
            self._captures.labels(state.value)
        #: The running totals of the previous report (all zero before the first).
        self._last = LiveStats(
            followed=0, draining=0, unfollowed=0, lines=0, bytes=0, ends={}, reconnects={}, finished={}
        )
        #: Stats are taken and reported one caller at a time (the poller and every stage worker
        #: refresh gauges): two reports from one `_last`, or an older snapshot reported after a
        #: newer one, would add the same growth twice to counters that never go back.
        self._reporting = threading.Lock()
        #: The engine keeps the histogram's running counts: exposed as they were last reported.
        registry.register(self)

    def report(self, take: Callable[[], LiveStats]) -> int:
        """The engine's stats now (`take`: its `stats`); counters move by what grew since the last
        report. Returns the errors caught since then (for archiver_errors_total)."""
        with self._reporting:
            stats = take()
            last, self._last = self._last, stats
            self._followed.set(stats.followed)
            self._unfollowed.set(stats.unfollowed)
            self._lines.inc(max(0, stats.lines - last.lines))
            self._bytes.inc(max(0, stats.bytes - last.bytes))
            self._scratch_bytes.set(stats.scratch_bytes)
            self._spills.inc(max(0, stats.scratch_spills - last.scratch_spills))
            self._unsynced.set(stats.seals_unsynced)
            for reason, count in stats.reconnects.items():
                self._reconnects.labels(str(reason)).inc(max(0, count - last.reconnects.get(reason, 0)))
            for state, count in stats.finished.items():
                self._captures.labels(str(state)).inc(max(0, count - last.finished.get(state, 0)))
            return max(0, stats.errors - last.errors)

    # --- the first-byte histogram (a collector over the last report's running counts) ----------

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(FIRST_BYTE, _HELP[FIRST_BYTE])]

    def collect(self) -> Iterable[Metric]:
        stats = self._last
        counts = stats.first_byte_counts or (0,) * (len(FIRST_BYTE_BUCKETS) + 1)
        bounds = [*(str(float(b)) for b in FIRST_BYTE_BUCKETS), "+Inf"]
        buckets = [(bound, float(total)) for bound, total in zip(bounds, itertools.accumulate(counts), strict=True)]
        return [HistogramMetricFamily(FIRST_BYTE, _HELP[FIRST_BYTE], buckets=buckets, sum_value=stats.first_byte_sum)]
