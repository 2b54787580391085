"""The `archiver_live_*` counters: each line, byte and reconnect is counted once, whichever threads
refresh the gauges and in whatever order their looks at the engine arrive."""

from __future__ import annotations

import dataclasses
import threading

from prometheus_client import CollectorRegistry

from archiver.live.report import FIRST_BYTE_BUCKETS, LiveStats, bucket_of
from archiver.metrics.live import LiveMetrics


def _stats(lines: int) -> LiveStats:
    return LiveStats(
        followed=1, draining=0, unfollowed=0, lines=lines, bytes=lines * 10, ends={}, reconnects={"cut": lines},
        finished={}, errors=lines,
    )  # fmt: skip


def test_two_refreshes_at_once_count_what_grew_once_even_when_the_older_look_reports_last() -> None:
    """A stage worker takes a look (10 lines); the poller takes a newer one (20) meanwhile. Were the
    newer reported first and the older after it, the next report would add 10 lines again."""
    registry = CollectorRegistry()
    metrics = LiveMetrics(registry)
    older_taking, newer_reported = threading.Event(), threading.Event()
    errors: list[int] = []

    def older() -> LiveStats:
        older_taking.set()
        newer_reported.wait(timeout=0.3)  # without one reporter at a time, the newer look reports first
        return _stats(10)

    worker = threading.Thread(target=lambda: errors.append(metrics.report(older)))
    worker.start()
    assert older_taking.wait(timeout=10)
    poller = threading.Thread(target=lambda: (errors.append(metrics.report(lambda: _stats(20))), newer_reported.set()))
    poller.start()
    worker.join(timeout=10)
    poller.join(timeout=10)
    errors.append(metrics.report(lambda: _stats(20)))

    assert registry.get_sample_value("archiver_live_lines_total") == 20
    assert registry.get_sample_value("archiver_live_bytes_total") == 200
    assert registry.get_sample_value("archiver_live_reconnects_total", {"reason": "cut"}) == 20
    assert sum(errors) == 20


def test_the_first_byte_histogram_shows_the_engines_running_counts_as_cumulative_buckets() -> None:
    """Before any report the histogram is empty; after one, its buckets add up the engine's counts
    (one session under 0.1 s, two under 0.25 s, one past the last bound) and its sum is theirs."""
    registry = CollectorRegistry()
    metrics = LiveMetrics(registry)
    assert registry.get_sample_value("archiver_live_first_byte_seconds_count") == 0
    counts = (1, 2, *([0] * (len(FIRST_BYTE_BUCKETS) - 2)), 1)
    metrics.report(lambda: dataclasses.replace(_stats(1), first_byte_counts=counts, first_byte_sum=400.5))
    value = registry.get_sample_value
    assert value("archiver_live_first_byte_seconds_bucket", {"le": "0.1"}) == 1
    assert value("archiver_live_first_byte_seconds_bucket", {"le": "0.25"}) == 3
    assert value("archiver_live_first_byte_seconds_bucket", {"le": "300.0"}) == 3
    assert value("archiver_live_first_byte_seconds_bucket", {"le": "+Inf"}) == 4
    assert value("archiver_live_first_byte_seconds_count") == 4
    assert value("archiver_live_first_byte_seconds_sum") == 400.5
    assert bucket_of(0.1) == 0 and bucket_of(0.2) == 1 and bucket_of(301.0) == len(FIRST_BYTE_BUCKETS)
