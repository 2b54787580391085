"""The log stage killed at each of its crash points (a subprocess, `ARCHIVER_CRASH_AT`), then restarted:
every queued archive ends up a leaf exactly once, in queue order, and the queue is empty."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # subprocesses and restarts: `make test-slow`, which CI runs

WRITER = "shard-0-replica-0"
LEAVES = 700  # three batches of BATCH_SIZE, the first full tiles among them
BATCH_SIZE = 300


def _signer() -> Any:
    from archiver.tlog.note import Signer

    return Signer("archiver.test/log", hashlib.sha256(b"crash test key").digest())


def _leaf(i: int) -> bytes:
    from archiver.tlog.leaf import Leaf

    return Leaf.of(hashlib.sha256(b"m%d" % i).hexdigest(), f"s{i}", None, 1_790_000_000 + i).encode()


def _run(config: dict[str, Any]) -> int:
    """Append the queue batch by batch until it is empty (exit 0)."""
    from prometheus_client import CollectorRegistry

    from archiver.archive import crashpoints, log_stage
    from archiver.archive.state import StateDB
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.store import open_store

    log_stage.BATCH = BATCH_SIZE
    crashpoints.arm()  # what an entry point does (archiver.app.process.apply)
    state = StateDB.open(Path(config["state_dir"]))
    store = open_store(Path(config["store"]).as_uri())
    stage = log_stage.LogStage(
        state, store, _signer(), WRITER, SelfMetrics(CollectorRegistry()), lambda: 1.8e9, interval=1
    )
    while stage.run_once():
        pass
    return 0 if state.log_pending_count() == 0 else 3


if __name__ == "__main__":
    sys.exit(_run(json.loads(sys.argv[1])))


from archiver.archive.crashpoints import EXIT_CODE  # noqa: E402
from archiver.archive.state import StateDB  # noqa: E402
from archiver.store import open_store  # noqa: E402
from archiver.tlog.log import TileLog  # noqa: E402


def _start(config: dict[str, Any], crash_at: str | None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "ARCHIVER_CRASH_AT"}
    if crash_at:
        env["ARCHIVER_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, __file__, json.dumps(config)], env=env, capture_output=True, timeout=120, check=False
    )


@pytest.mark.parametrize("point", ["after_log_tiles:1", "after_log_tiles:2", "after_log_checkpoint:2"])
def test_a_crash_in_the_log_stage_loses_no_leaf_and_duplicates_none(point: str, tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "store": str(tmp_path / "store")}
    state = StateDB.open(tmp_path / "state")
    for i in range(LEAVES):
        state.add_log_pending(f"k{i:04d}", _leaf(i), now=float(i))
    state.close()

    crashed = _start(config, point)
    assert crashed.returncode == EXIT_CODE, crashed.stderr.decode(errors="replace")[-3000:]
    state = StateDB.open(tmp_path / "state")
    assert 0 < state.log_pending_count() <= LEAVES  # the crash left work queued
    state.close()

    done = _start(config, None)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]

    store = open_store((tmp_path / "store").as_uri())
    log = TileLog(store, WRITER, _signer())
    assert log.open() == []  # nothing left beyond the checkpoint
    assert log.size == LEAVES
    assert [entry for _, entry in log.entries(0, LEAVES, LEAVES)] == [_leaf(i) for i in range(LEAVES)]
