"""Benchmark of detection's state DB writes: a steady-state poll of 10,000 sessions, budget 50 ms.

Usage: python benchmarks/state.py [--sessions 10000] [--budget-ms 50]

Steady-state polls write only what changed (here: player counts, which are not persisted), so the
median of 7 polls must stay well under the poll interval. Kept out of the test suite because a
wall-clock budget flakes on a loaded CI machine; the tests check what is written instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.config.settings import Settings
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import FileStore
from archiver.upstream.models import Session


def _session(i: int, players: int) -> Session:
    return Session(
        id=f"sess-{i:05d}", image="demo-game", tag="1.1.0", location="eu-west-1", host="203.0.113.7",
        created_ms=1_700_000_000_000 + i, status="running", player_count=players,
        ports={"7777/udp": 20000 + i % 1000}, labels={"mode": "duel"}, env_keys=("GAMEYE_SESSION_ID",),
    )  # fmt: skip


def measure_polls(root: Path, sessions: int, polls: int = 7) -> list[float]:
    """Seconds per steady-state `observe_poll` of `sessions` running sessions (after a first poll)."""
    settings = Settings(state_dir=root / "state")
    (root / "store").mkdir()
    state = StateDB.open(settings.state_dir)
    # observe_poll never talks to the upstream: detection needs no client.
    pipeline = Pipeline(settings, None, FileStore(root / "store"), state, SelfMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    pipeline.observe_poll([_session(i, 2) for i in range(sessions)], 100.0)
    times = []
    for k in range(polls):
        listed = [_session(i, k) for i in range(sessions)]
        started = time.perf_counter()
        pipeline.observe_poll(listed, 101.0 + k)
        times.append(time.perf_counter() - started)
    state.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = measure_polls(Path(tmp), args.sessions)
    median_ms = statistics.median(times) * 1000
    ok = median_ms < args.budget_ms
    print(f"poll of {args.sessions} sessions: median {median_ms:.1f} ms (budget {args.budget_ms:.0f} ms) "
          f"{'ok' if ok else 'MISSED'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
