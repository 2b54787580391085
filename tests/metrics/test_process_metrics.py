"""`process_*` and `python_*` on the daemon's /metrics and the browser's, scraped over real sockets:
what the README sizes memory and troubleshoots OOMKilled by."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from archiver.app.daemon import Daemon
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.config.settings import load_settings
from archiver.fake import FakeService
from archiver.store import open_store
from tests.fixtures_fake import TEST_TOKEN
from tests.support import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process_* are read from /proc (Linux only)")

WANTED = (
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_start_time_seconds",
)


def samples(text: str) -> dict[str, float]:
    """Sample name → value of an exposition (the last one of a name)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] = sample.value
    return found


def check_this_process(text: str) -> None:
    """The families describe the process that served them (this one: the servers run in-process)."""
    found = samples(text)
    for name in WANTED:
        assert name in found, f"{name} missing from /metrics"
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    assert 0 < found["process_resident_memory_bytes"] <= peak_rss * 1.01
    assert found["process_cpu_seconds_total"] > 0
    assert 3 <= found["process_open_fds"] <= len(os.listdir("/proc/self/fd")) + 16  # the sockets open meanwhile
    assert found["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert time.time() - 3600 < found["process_start_time_seconds"] <= time.time()
    version = f'version="{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"'
    [info] = [line for line in text.splitlines() if line.startswith("python_info{")]
    assert version in info and info.endswith(" 1.0")
    assert "python_gc_collections_total" in found


def test_the_daemons_metrics_carry_process_and_python_families(fake_service: FakeService, tmp_path: Path) -> None:
    settings = load_settings(
        {"api_url": fake_service.base_url, "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0",
         "poll_interval": "0.2s"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip
    daemon = Daemon(settings)
    daemon.start()
    try:
        wait_until(lambda: daemon.registry.get_sample_value("archiver_upstream_up", {"endpoint": "sessions"}) == 1)
        text = httpx.get(f"{daemon.server.url}/metrics", timeout=5).text
        check_this_process(text)
        # Rendered with the archiver_* families at each poll: the CPU counter moves between polls.
        first = samples(text)["process_cpu_seconds_total"]
        sum(i * i for i in range(3_000_000))  # CPU time the counter must show
        wait_until(
            lambda: (
                samples(httpx.get(f"{daemon.server.url}/metrics", timeout=5).text)["process_cpu_seconds_total"] > first
            ),
            message="process_cpu_seconds_total never moved",
        )
        openmetrics = httpx.get(
            f"{daemon.server.url}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=5
        )
        assert "# TYPE process_cpu_seconds counter" in openmetrics.text
        assert openmetrics.text.rstrip().endswith("# EOF") and openmetrics.text.count("# EOF") == 1
    finally:
        daemon.stop()


def test_the_browsers_metrics_carry_process_and_python_families(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    with BrowseServer(("127.0.0.1", 0), BrowseApp(store)) as server:
        response = httpx.get(f"{server.url}/metrics", timeout=5)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        check_this_process(response.text)
        openmetrics = httpx.get(
            f"{server.url}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5
        )
        assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
        assert openmetrics.text.rstrip().endswith("# EOF")
    store.close()
