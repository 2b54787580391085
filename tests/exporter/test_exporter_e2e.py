"""`archiver run` against the fake, scraped by a real Prometheus server: values equal the fake's state,
the output passes promtool, no secret leaks, and upstream failures never break the scrape target."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from archiver.fake import FakeService
from tests.fixtures_fake import TEST_TOKEN
from tests.fixtures_prometheus import PrometheusServer
from tests.support import free_port, wait_until

ARCHIVER = str(Path(sys.executable).parent / "archiver")
SECRET = "hunter2"


class RunningDaemon:
    def __init__(self, fake: FakeService, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "archiver.log"
        env = {**os.environ, "ARCHIVER_API_TOKEN": TEST_TOKEN}
        self.process = subprocess.Popen(
            [
                ARCHIVER, "run",
                "--api-url", fake.base_url,
                "--web.listen-address", f"127.0.0.1:{self.port}",
                "--poll-interval", "0.3s",
                "--log.format", "json",
                "--state-dir", str(workdir / "state"),
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("wb"),
        )  # fmt: skip

    def get(self, path: str, **headers: str) -> httpx.Response:
        return httpx.get(self.url + path, headers=headers, timeout=5)

    def get_raw(self, path: str, **headers: str) -> tuple[httpx.Headers, bytes]:
        """The body as sent on the wire (httpx would otherwise decode Content-Encoding itself)."""
        with httpx.stream("GET", self.url + path, headers=headers, timeout=5) as response:
            return response.headers, b"".join(response.iter_raw())

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"archiver exited: {self.log_path.read_text()[-3000:]}")
        try:
            return self.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(15)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., RunningDaemon]]:
    daemons: list[RunningDaemon] = []

    def start(fake: FakeService, *extra: str) -> RunningDaemon:
        daemon = RunningDaemon(fake, tmp_path, *extra)
        daemons.append(daemon)
        wait_until(daemon.ready, message="archiver /readyz")
        return daemon

    yield start
    for daemon in daemons:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def seed(fake: FakeService) -> None:
    plan = [
        ("eu-west-1", "demo-game", ["p1", "p2"]),
        ("eu-west-1", "demo-game", ["p3"]),
        ("us-east-1", "demo-game", []),
        ("ap-southeast-1", "demo-game", ["p4", "p5", "p6"]),
    ]
    for i, (location, image, players) in enumerate(plan):
        fake.add_session(
            TEST_TOKEN,
            id=f"s{i}",
            location=location,
            image=image,
            players=players,
            labels={"tournament": "spring", "quote": 'a"b\\c\nd'},
            env={"SECRET": SECRET, "DB_PASSWORD": SECRET},
        )


def test_prometheus_scrapes_values_equal_to_the_fake_state(
    fake_service: FakeService,
    daemon_factory: Callable[..., RunningDaemon],
    prometheus_factory: Callable[[str], PrometheusServer],
) -> None:
    seed(fake_service)
    daemon = daemon_factory(fake_service, "--session-label-allowlist", "tournament,quote")
    prom = prometheus_factory(f"127.0.0.1:{daemon.port}")

    expected_by_location = Counter(s.location for s in _fake_sessions(fake_service))
    result = prom.wait_for(
        "sum by (location) (sessionhost_sessions)",
        lambda r: {x["metric"]["location"]: int(float(x["value"][1])) for x in r} == dict(expected_by_location),
    )
    assert result
    players = prom.wait_for("sessionhost_session_players", lambda r: len(r) == 4)
    assert {x["metric"]["session_id"]: int(float(x["value"][1])) for x in players} == {
        "s0": 2, "s1": 1, "s2": 0, "s3": 3,
    }  # fmt: skip
    count = prom.wait_for("sessionhost_upstream_session_count", lambda r: len(r) == 1)
    assert int(float(count[0]["value"][1])) == 4
    labels = prom.wait_for("sessionhost_session_labels", lambda r: len(r) == 4)
    assert labels[0]["metric"]["label_quote"] == 'a"b\\c\nd'  # escaped on the wire, intact after parsing
    up = prom.wait_for('archiver_upstream_up{endpoint="sessions"}', lambda r: len(r) == 1)
    assert up[0]["value"][1] == "1"

    # A session ends: the aggregates follow within a few polls.
    fake_service.end_session(TEST_TOKEN, "s3")
    prom.wait_for(
        'sum(sessionhost_sessions{location="ap-southeast-1"}) or vector(0)', lambda r: r[0]["value"][1] == "0"
    )


def _fake_sessions(fake: FakeService) -> list[object]:
    import httpx as _httpx

    body = _httpx.get(f"{fake.base_url}/session", headers={"Authorization": f"Bearer {TEST_TOKEN}"}).json()
    from archiver.upstream.sessionlist import parse_session_list

    return parse_session_list(body).sessions  # type: ignore[return-value]


def test_output_passes_promtool_and_never_carries_secrets(
    fake_service: FakeService, daemon_factory: Callable[..., RunningDaemon], promtool: str
) -> None:
    seed(fake_service)
    daemon = daemon_factory(fake_service, "--session-label-allowlist", "tournament,quote")
    headers, wire = daemon.get_raw("/metrics", **{"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip"
    bodies = [
        daemon.get("/metrics").content,
        gzip.decompress(wire),  # several gzip members back to back; gzip reads them all
        daemon.get("/metrics", Accept="application/openmetrics-text; version=1.0.0").content,
    ]
    assert b"sessionhost_session_info" in bodies[0]
    assert bodies[0] == bodies[1] or bodies[0].split(b"\narchiver_")[0] == bodies[1].split(b"\narchiver_")[0]
    assert bodies[2].rstrip().endswith(b"# EOF")
    for body in bodies:
        assert SECRET.encode() not in body and b"DB_PASSWORD" not in body
    checked = subprocess.run([promtool, "check", "metrics"], input=bodies[0], capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()
    assert checked.stdout.decode().strip() == "" and checked.stderr.decode().strip() == ""
    daemon.stop()
    log = daemon.log_path.read_text()
    assert SECRET not in log and TEST_TOKEN not in log


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 500},
        {"status": 502},
        {"kind": "garbage"},
        {"kind": "reset"},
        {"latency": 2.0, "status": None},
    ],
)
def test_upstream_failures_keep_serving_the_last_snapshot(
    fake_service: FakeService, daemon_factory: Callable[..., RunningDaemon], fault: dict[str, object]
) -> None:
    seed(fake_service)
    daemon = daemon_factory(fake_service)
    before = daemon.get("/metrics").text
    assert 'archiver_upstream_up{endpoint="sessions"} 1.0' in before
    fake_service.set_fault("GET /session", count=10_000, **fault)  # type: ignore[arg-type]

    def down() -> bool:
        response = daemon.get("/metrics")
        assert response.status_code == 200
        return 'archiver_upstream_up{endpoint="sessions"} 0.0' in response.text

    wait_until(down, timeout=30, message="archiver_upstream_up 0")
    during = daemon.get("/metrics").text
    assert "sessionhost_session_info{" in during  # the last snapshot is still served
    assert "archiver_upstream_last_success_timestamp_seconds" in during
    fake_service.clear_faults()
    wait_until(
        lambda: 'archiver_upstream_up{endpoint="sessions"} 1.0' in daemon.get("/metrics").text,
        timeout=30,
        message="archiver_upstream_up back to 1",
    )
    assert daemon.stop() == 0  # SIGTERM is a graceful stop
