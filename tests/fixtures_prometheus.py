"""A real Prometheus server (Debian package `prometheus`) on loopback, scraping a target the test names."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import free_port, wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PrometheusServer:
    """One Prometheus process scraping `target` every 200 ms; `query` polls its HTTP API."""

    def __init__(self, workdir: Path, target: str, scheme: str = "http") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "scrape_configs:\n"
            "  - job_name: archiver\n"
            "    scrape_interval: 500ms\n"
            "    scrape_timeout: 450ms\n"
            f"    scheme: {scheme}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("wb"),
        )
        self.log = workdir / "prometheus.log"

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout, interval=0.1, message="prometheus ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def wait_for(
        self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = []

        def met() -> bool:
            nonlocal result
            result = self.query(promql)
            return predicate(result)

        wait_until(met, timeout, interval=0.2, message=lambda: f"{promql}: condition; last result {result}")
        return result

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[str], PrometheusServer]]:
    if not Path(PROMETHEUS).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("the prometheus binary is not installed (.ci/run installs the Debian package)")
        pytest.skip("the prometheus binary is not installed (CI installs the Debian package)")
    servers: list[PrometheusServer] = []

    def start(target: str) -> PrometheusServer:
        workdir = tmp_path / f"prom{len(servers)}"
        workdir.mkdir()
        server = PrometheusServer(workdir, target)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def promtool() -> str:
    """Path of promtool: a failure under CI=true (CI installs it), a skip on a developer machine."""
    path = shutil.which("promtool", path=f"{os.environ.get('PATH', '')}:/usr/bin")
    if path is None:
        message = "promtool is not installed (CI installs Debian's prometheus package)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
