"""The scrape path reuses what did not change: the self-metrics tail is rendered once per change."""

from __future__ import annotations

import gzip
import threading

from prometheus_client import CollectorRegistry

from archiver.exporter.snapshot import scrape_parts
from archiver.metrics.selfmetrics import SelfMetrics


def test_self_metrics_are_rendered_again_only_after_an_event() -> None:
    metrics = SelfMetrics(CollectorRegistry())
    first = metrics.render(True)
    assert metrics.render(True) is first  # nothing happened: the same bytes
    metrics.error("http")
    after = metrics.render(True)
    assert after is not first
    assert b'archiver_errors_total{where="http"} 1.0' in after
    assert metrics.render(False) is metrics.render(False)  # each format has its own render
    assert b"archiver_errors_total" in metrics.render(False) and not metrics.render(False).endswith(b"# EOF\n")


def test_every_public_method_but_render_is_an_event_that_moves_the_render() -> None:
    """A new event method without `@_event` would leave its change out of scrapes until another
    event happened; each of them wraps its method (functools.wraps) and moves the generation."""
    public = {name: f for name, f in vars(SelfMetrics).items() if callable(f) and not name.startswith("_")}
    assert "render" in public and len(public) > 20
    assert [name for name, f in public.items() if name != "render" and not hasattr(f, "__wrapped__")] == []
    metrics = SelfMetrics(CollectorRegistry())
    first = metrics.render(False)
    metrics.set_spool_bytes(7)
    assert metrics.render(False) is not first and b"archiver_spool_bytes 7.0" in metrics.render(False)


def test_with_the_render_cache_off_every_scrape_renders() -> None:
    # Without the process_* families, whose CPU and RSS move between two renders.
    metrics = SelfMetrics(CollectorRegistry(), process_metrics=False, render_cache=False)
    first = metrics.render(True)
    assert metrics.render(True) is not first and metrics.render(True) == first


def test_events_from_many_threads_are_all_in_the_next_render() -> None:
    metrics = SelfMetrics(CollectorRegistry())

    def work() -> None:
        for _ in range(100):
            metrics.item_done("logs", "archived")
            metrics.render(True)  # renders racing the events must never hide one

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b'archiver_items_total{kind="logs",outcome="archived"} 400.0' in metrics.render(True)


def test_a_gzip_scrape_with_a_cached_tail_decodes_to_the_new_tail_after_a_change() -> None:
    metrics = SelfMetrics(CollectorRegistry())
    for expected in (b'archiver_errors_total{where="poll"} 1.0', b'archiver_errors_total{where="poll"} 2.0'):
        metrics.error("poll")
        for _ in range(2):  # the second scrape uses the cached compressed tail
            body = gzip.decompress(b"".join(scrape_parts(None, metrics.render(True), openmetrics=True, gzip=True)))
            assert expected in body and body.endswith(b"# EOF\n")
