"""The daemon's process-level guarantees: one writer per state dir, backfill through the CLI, a poisoned
session-list entry quarantined without holding up any other session."""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from archiver.app.daemon import Daemon
from archiver.app.process import tune_allocator
from archiver.config.settings import Settings, load_settings
from archiver.durable import StateDirLock
from archiver.errors import ConfigError
from archiver.fake import FakeService
from tests.fixtures_fake import TEST_TOKEN
from tests.support import wait_until

ARCHIVER = str(Path(sys.executable).parent / "archiver")


def _file_store_settings(fake_service: FakeService, tmp_path: Path) -> Settings:
    """A daemon's settings over the fake and a directory store in `tmp_path` (made here), its state beside it."""
    (tmp_path / "archive").mkdir()
    return load_settings(
        {"api_url": fake_service.base_url, "store": (tmp_path / "archive").as_uri(),
         "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip


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
    daemon = Daemon(_file_store_settings(fake_service, tmp_path))
    daemon.start()  # takes the state dir's lock
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
    daemon = Daemon(_file_store_settings(fake_service, tmp_path))
    daemon.start()
    try:
        wait_until(
            lambda: daemon.registry.get_sample_value("archiver_store_conditional_writes_supported") == 1.0,
            timeout=20,
            message="probe result never reported",
        )
        assert daemon.pipeline is not None and daemon.pipeline.store.conditional_writes is True
    finally:
        daemon.stop()


def test_status_command_reads_the_state_dir(fake_service: FakeService, tmp_path: Path) -> None:
    daemon = Daemon(_file_store_settings(fake_service, tmp_path))
    daemon.start()  # takes the state dir and creates the state DB
    daemon.stop()
    result = subprocess.run(
        [ARCHIVER, "status", "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nothing pending"


def test_a_store_that_does_not_answer_the_probe_leaves_writes_checking_first(tmp_path: Path) -> None:
    """The probe's verdict is reported when the store answers; an unreachable store is not an error."""
    from prometheus_client import CollectorRegistry

    from archiver.archive.store_health import probe_store
    from archiver.metrics.selfmetrics import SelfMetrics
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


POISON_SECRET = "planted-env-secret-0451"


def test_a_poisoned_list_entry_is_left_out_counted_and_logged_once_while_every_good_session_is_exported(
    fake_service: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad entry must not stop end detection for the fleet: the poll stays up, the good sessions
    are scraped, the bad ones are counted every poll and logged once each, without their env."""
    for sid in ("good-1", "good-2"):
        fake_service.add_session(TEST_TOKEN, id=sid, env={"MATCH_SECRET": POISON_SECRET})
    env = {"env": json.dumps({"MATCH_SECRET": POISON_SECRET})}
    poisoned = [
        {"id": "huge", "image": "demo-game", "location": "eu-west-1", "created": 1_700_000_000_000,
         "playerCount": 1e30, "labels": env},
        {"id": "evil\ud800\x1b[31m", "image": "demo-game", "location": "eu-west-1",
         "created": 1_700_000_000_000, "labels": env},
    ]  # fmt: skip
    injected = httpx.post(
        f"{fake_service.base_url}/_fake/list-entries",
        content=json.dumps({"entries": poisoned}),  # json.dumps sends the lone surrogate as "\\ud800"
        headers={"Authorization": f"Bearer {TEST_TOKEN}"},
    )
    assert injected.status_code == 200
    settings = load_settings(
        {"api_url": fake_service.base_url, "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0",
         "poll_interval": "0.2s"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="archiver.poller")
    daemon = Daemon(settings)
    daemon.start()
    try:
        # Three polls at least: the counter counts every poll, the log says it once.
        wait_until(
            lambda: (daemon.registry.get_sample_value("archiver_upstream_invalid_entries_total") or 0) >= 6,
            timeout=20,
            message="the poisoned entries were never counted",
        )
        scrape = httpx.get(f"{daemon.server.url}/metrics", timeout=5).text
    finally:
        daemon.stop()

    assert 'archiver_upstream_up{endpoint="sessions"} 1.0' in scrape
    assert 'session_id="good-1"' in scrape and 'session_id="good-2"' in scrape
    assert 'session_id="huge"' not in scrape
    invalid_total = [line for line in scrape.splitlines() if line.startswith("archiver_upstream_invalid_entries_total")]
    assert len(invalid_total) == 1 and float(invalid_total[0].split()[-1]) >= 6
    warnings = [r.getMessage() for r in caplog.records if "left out of this poll" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once per entry, not once per poll
    assert "upstream list entry 2 (id 'huge') left out of this poll" in warnings[0]
    assert "field 'playerCount' is out of the 64-bit integer range" in warnings[0]
    # The id is shown printable: the surrogate and the terminal escape as text, never raw.
    assert "(id 'evil\\ud800\\x1b[31m')" in warnings[1]
    assert all(m.isprintable() for m in warnings)
    assert POISON_SECRET not in caplog.text and POISON_SECRET not in scrape


def test_an_invalid_entry_is_logged_again_when_it_comes_back_after_a_clean_poll(
    fake_service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    """The poller remembers only the last poll's invalid entries: memory stays bounded, and a problem
    that returns is news again. A shift of the entry's position alone does not log it again."""
    from archiver.exporter.poller import Poller
    from archiver.upstream.api import SessionHostClient, Token

    fake_service.add_session(TEST_TOKEN, id="first")
    bad = {"id": "neg", "image": "demo-game", "location": "eu-west-1", "created": -1}
    caplog.set_level(logging.WARNING, logger="archiver.poller")
    with SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN)) as client:
        poller = Poller(client, interval=5.0, on_result=lambda result: None)
        fake_service.inject_list_entries(TEST_TOKEN, [bad])
        first = poller.poll_once()
        fake_service.end_session(TEST_TOKEN, "first")  # the bad entry moves from index 1 to 0
        fake_service.advance(5 * 3600)  # past retention: "first" leaves the list
        second = poller.poll_once()
        fake_service.clear_list_entries(TEST_TOKEN)
        clean = poller.poll_once()
        fake_service.inject_list_entries(TEST_TOKEN, [bad])
        again = poller.poll_once()

    assert [(i.index, i.session_id) for i in first.invalid] == [(1, "neg")]
    assert [(i.index, i.session_id) for i in second.invalid] == [(0, "neg")]
    assert clean.invalid == () and again.invalid == second.invalid
    assert first.errors == second.errors == again.errors == {}
    logged = [r for r in caplog.records if "left out of this poll" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.WARNING, logging.WARNING]  # first poll, and after the clean one


def test_the_id_of_an_invalid_entry_is_cut_in_its_log_line(
    fake_service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    """Upstream ids have no length limit; a log line must stay a line."""
    from archiver.exporter.poller import Poller
    from archiver.upstream.api import SessionHostClient, Token

    long_id = "L" * 5000
    fake_service.inject_list_entries(TEST_TOKEN, [{"id": long_id, "image": "i", "location": "l", "created": -1}])
    caplog.set_level(logging.WARNING, logger="archiver.poller")
    with SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN)) as client:
        result = Poller(client, interval=5.0, on_result=lambda result: None).poll_once()

    assert [i.session_id for i in result.invalid] == [long_id]  # the caller gets the id whole
    [message] = [r.getMessage() for r in caplog.records if "left out of this poll" in r.getMessage()]
    assert f"(id '{'L' * 80}…')" in message
    assert len(message) < 400


def test_store_up_goes_to_zero_when_the_store_becomes_unreachable(
    fake_service: FakeService, moto_endpoint: str, tmp_path: Path
) -> None:
    """The health check runs every poll interval, so a dead store shows without any upload going on."""
    from moto.server import ThreadedMotoServer

    from archiver.store import make_s3_client

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    make_s3_client(endpoint_url=endpoint, checksum_mode="when_supported").create_bucket(Bucket="evidence")
    settings = load_settings(
        {"api_url": fake_service.base_url, "store": "s3://evidence/", "s3_endpoint_url": endpoint,
         "state_dir": str(tmp_path / "state"), "listen": "127.0.0.1:0", "poll_interval": "0.5s"},
        {"ARCHIVER_API_TOKEN": TEST_TOKEN},
    )  # fmt: skip
    daemon = Daemon(settings)
    daemon.start()
    try:
        wait_until(
            lambda: daemon.registry.get_sample_value("archiver_store_up") == 1.0,
            timeout=30,
            message="store never reported up",
        )
        server.stop()
        wait_until(
            lambda: daemon.registry.get_sample_value("archiver_store_up") == 0.0,
            timeout=60,
            message="a dead store was never reported down",
        )
    finally:
        daemon.stop()
        server.stop()


def test_start_up_tuning_lets_a_polls_new_objects_live_without_a_garbage_collection() -> None:
    """A poll replacing 2 % of 50,000 sessions leaves ~8,000 new long-lived containers (models,
    label dicts, cached lines): after `archiver run`'s start-up tuning they trigger no collection
    of the young generation (at CPython's default of 700 they triggered ~11, each rescanning them)."""
    before = gc.get_threshold()
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    try:
        assert tune_allocator({}) is True
        assert gc.get_threshold()[1:] == before[1:]  # the older generations keep their thresholds
        gc.collect()
        gc.callbacks.append(count)
        try:
            kept = [{"session": n} for n in range(8_000)]
        finally:
            gc.callbacks.remove(count)
        assert len(kept) == 8_000 and started == []
    finally:
        gc.set_threshold(*before)


def test_process_tuning_switched_off_leaves_the_interpreters_defaults_alone() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        assert tune_allocator({"ARCHIVER_PROCESS_TUNING": "off"}) is False
        assert gc.get_threshold() == (700, *before[1:])
        assert tune_allocator({"ARCHIVER_PROCESS_TUNING": " ON "}) is True
        assert gc.get_threshold()[0] > 700
    finally:
        gc.set_threshold(*before)


def test_a_bad_process_tuning_value_is_a_config_error_naming_the_variable() -> None:
    before = gc.get_threshold()
    with pytest.raises(ConfigError, match=r"^ARCHIVER_PROCESS_TUNING='maybe': expected on or off$"):
        tune_allocator({"ARCHIVER_PROCESS_TUNING": "maybe"})
    assert gc.get_threshold() == before
