"""`archiver demo --duration 20` as a newcomer runs it: sessions get archived and /metrics answers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

ARCHIVER = str(Path(sys.executable).parent / "archiver")


def test_demo_archives_sessions_and_serves_metrics(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [ARCHIVER, "demo", "--duration", "20", "--web.listen-address", "127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    metrics_url = None
    browser_url = None
    scraped = ""
    browsed = ""
    deadline = time.monotonic() + 60
    for line in process.stdout:
        lines.append(line)
        match = re.match(r"metrics:\s+(\S+)", line)
        if match:
            metrics_url = match.group(1)
        match = re.match(r"browser:\s+(\S+)", line)
        if match:
            browser_url = match.group(1)
        # Scrape while it runs, once a few status lines show sessions.
        if metrics_url and not scraped and re.search(r"active\s+[1-9]", line):
            scraped = httpx.get(metrics_url, timeout=5).text
        if browser_url and not browsed and re.search(r"archived\s+[1-9]", line):
            browsed = httpx.get(browser_url, timeout=5).text
        assert time.monotonic() < deadline, "".join(lines)
    assert process.wait(30) == 0, "".join(lines)
    output = "".join(lines)

    assert metrics_url, output
    assert "sessionhost_session_info{" in scraped
    assert re.search(r'archiver_upstream_up\{endpoint="sessions"\} 1\.0', scraped)
    assert browser_url, output  # printed next to the metrics URL
    assert 'class="session"' in browsed, browsed  # an archived session listed in the browser
    assert "summary:" in output and "archiver ls --store file://" in output
    assert "Traceback" not in output

    manifests = list((tmp_path / "demo-archive" / "sessions").glob("*/*/manifest.json"))
    assert manifests, output
    manifest = json.loads(manifests[0].read_text())
    assert manifest["items"], manifest
    assert any(item["outcome"] == "archived" for item in manifest["items"])
    assert list((tmp_path / "demo-archive" / "index").rglob("*.json"))
