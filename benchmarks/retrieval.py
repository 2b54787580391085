"""Benchmark of `archiver ls`: 10,000 sessions over 30 days in a directory store, `--since 2h` under 1 s.

Usage: python benchmarks/retrieval.py [--sessions 10000] [--budget-ms 1000]

`ls` lists only the hour partitions of the window and reads only their index entries (the tests
count those requests); this measures the wall time of listing and rendering them, which a test
could only assert at the risk of flaking on a loaded machine.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from archiver.layout import keys
from archiver.layout.manifest import IndexEntry, index_entry_to_bytes
from archiver.retrieval import retrieve
from archiver.store import FileStore

NOW = 1_795_000_000.0
DAYS = 30


def measure_ls(root: Path, sessions: int) -> tuple[float, int]:
    """Seconds for `ls --since 2h` over `sessions` index entries spread over DAYS days, and rows listed."""
    store = FileStore(root)
    span = DAYS * 86400.0
    for i in range(sessions):
        sid, ended = f"sess-{i:05d}", NOW - span + span * (i + 0.5) / sessions
        entry = IndexEntry(
            session_id=sid, ended_at=ended, archived_at=ended + 30, image="demo-game", tag="1.1.0",
            location="eu-west-1", labels={"tournament": "spring"}, counts={"archived": 2}, total_bytes=1_049_000,
            manifest_key=keys.manifest_key(store.prefix, sid),
        )  # fmt: skip
        path = root / keys.index_key(store.prefix, ended, sid)  # plain files in the store's layout
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(index_entry_to_bytes(entry))
    started = time.perf_counter()
    entries = retrieve.list_sessions(store, since=NOW - 7200, now=NOW)
    retrieve.render_sessions(entries, io.StringIO())
    return time.perf_counter() - started, len(entries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--budget-ms", type=float, default=1000.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        elapsed, rows = measure_ls(Path(tmp), args.sessions)
    ok = elapsed * 1000 < args.budget_ms and rows > 0
    print(f"ls --since 2h over {args.sessions} sessions/{DAYS} days: {rows} rows in {elapsed * 1000:.1f} ms "
          f"(budget {args.budget_ms:.0f} ms) {'ok' if ok else 'MISSED'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
