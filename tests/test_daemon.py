"""The daemon's process-level guarantees: one writer per state dir, backfill through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archiver.daemon import Daemon
from archiver.durable import StateDirLock
from archiver.errors import ConfigError
from archiver.fake import FakeService
from archiver.settings import load_settings
from tests.fixtures_fake import TEST_TOKEN

ARCHIVER = str(Path(sys.executable).parent / "archiver")


def test_a_second_writer_on_the_same_state_dir_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state")
    first.acquire()
    with pytest.raises(ConfigError, match="in use by another archiver process"):
        StateDirLock(tmp_path / "state").acquire()
    first.release()
    again = StateDirLock(tmp_path / "state")
    again.acquire()  # free once the holder let go
    again.release()


def test_archive_command_refuses_to_run_beside_a_daemon(fake_service: FakeService, tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    settings = load_settings(
        {
            "api_url": fake_service.base_url,
            "store": (tmp_path / "archive").as_uri(),
            "state_dir": str(tmp_path / "state"),
            "listen": "127.0.0.1:0",
        },
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )
    daemon = Daemon(settings)
    try:
        result = subprocess.run(
            [ARCHIVER, "archive", "some-session", "--api-url", fake_service.base_url,
             "--store", (tmp_path / "archive").as_uri(), "--state-dir", str(tmp_path / "state")],
            env={**os.environ, "ARCHIVER_API_TOKEN": TEST_TOKEN},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        daemon.stop()
    assert result.returncode == 2
    assert "in use by another archiver process" in result.stderr
    assert "Traceback" not in result.stderr


def test_archive_command_backfills_an_ended_session(fake_service: FakeService, tmp_path: Path) -> None:
    sid = fake_service.add_session(TEST_TOKEN, id="late-match")
    fake_service.end_session(TEST_TOKEN, sid)
    (tmp_path / "archive").mkdir()
    result = subprocess.run(
        [ARCHIVER, "archive", sid, "--api-url", fake_service.base_url, "--store", (tmp_path / "archive").as_uri(),
         "--state-dir", str(tmp_path / "state"), "--artifact-path", "/srv/replays", "--timeout", "60s"],
        env={**os.environ, "ARCHIVER_API_TOKEN": TEST_TOKEN},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "queued 1 session(s)" in result.stdout
    (manifest,) = (tmp_path / "archive" / "sessions" / "late-match").glob("*/manifest.json")
    assert list((manifest.parent / "artifacts").glob("srv-replays-*.tar.gz"))


def test_the_store_probe_reports_conditional_write_support(fake_service: FakeService, tmp_path: Path) -> None:
    """At start-up the daemon probes the store (a file store enforces create-once) and says so in a metric."""
    (tmp_path / "archive").mkdir()
    settings = load_settings(
        {"api_url": fake_service.base_url, "store": (tmp_path / "archive").as_uri(),
         "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip
    daemon = Daemon(settings)
    daemon.start()
    try:
        deadline = time.monotonic() + 20
        while daemon.registry.get_sample_value("archiver_store_conditional_writes_supported") != 1.0:
            assert time.monotonic() < deadline, "probe result never reported"
            time.sleep(0.05)  # polling interval of a deadline loop
        assert daemon.pipeline is not None and daemon.pipeline.store.conditional_writes is True
    finally:
        daemon.stop()


def test_status_command_reads_the_state_dir(fake_service: FakeService, tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    settings = load_settings(
        {"api_url": fake_service.base_url, "store": (tmp_path / "archive").as_uri(),
         "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip
    Daemon(settings).stop()  # creates the state DB
    result = subprocess.run(
        [ARCHIVER, "status", "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nothing pending"


def test_a_store_that_does_not_answer_the_probe_leaves_writes_checking_first(tmp_path: Path) -> None:
    """The probe's verdict is reported when the store answers; an unreachable store is not an error."""
    from prometheus_client import CollectorRegistry

    from archiver.daemon import probe_store
    from archiver.selfmetrics import SelfMetrics
    from archiver.store import open_store

    (tmp_path / "archive").mkdir()
    store = open_store((tmp_path / "archive").as_uri())
    metrics = SelfMetrics(CollectorRegistry())
    assert probe_store(store, metrics) is True
    assert metrics.registry.get_sample_value("archiver_store_conditional_writes_supported") == 1.0

    (tmp_path / "gone").mkdir()
    gone = open_store((tmp_path / "gone").as_uri())
    (tmp_path / "gone").rmdir()  # the store's directory disappears (an unmounted volume)
    gone.conditional_writes = False
    assert probe_store(gone, SelfMetrics(CollectorRegistry())) is False
    assert gone.conditional_writes is False
