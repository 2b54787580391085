"""Benchmark of `archiver grep`: decompressed log text searched per second, and memory flat in the number of sessions.

Usage: python benchmarks/grep.py [--sessions 100] [--mib-per-session 4] [--workers 4] [--repeats 3]
                                [--budget-mbps 100] [--max-rss-growth 0.25]

A directory store (the local case of the issue: the page cache holds it, so the store's own I/O is
not what is measured) holds sessions whose gzipped plain-text logs are the same realistic lines
(about one in a thousand is a hit). Each measurement runs in a fresh process (`--child`) so that
its peak RSS is its own: the throughput (total decompressed bytes / wall time of listing and
searching, the median of ``--repeats`` runs; the MB per CPU second and the cores the run kept busy
are printed beside it, because on a machine shared with other work the wall time says how much
CPU the run got as much as how fast it is), and two runs with 100 and 1,000 smaller sessions
whose peak RSS must stay within ``--max-rss-growth`` of each other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from archiver.layout import keys
from archiver.layout.manifest import (
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
)
from archiver.retrieval import retrieve
from archiver.retrieval.grep import Matcher, grep_sessions
from archiver.store import FileStore

NOW = 1_795_000_000.0
NEEDLE = "speedhack detected"
MIB = 1024 * 1024


def log_body(size: int, seed: int = 7) -> bytes:
    """About ``size`` bytes of game-server log lines; one line in a thousand carries the needle."""
    rng = random.Random(seed)
    levels = ["info", "info", "info", "debug", "warn"]
    lines = []
    total = 0
    n = 0
    while total < size:
        n += 1
        if n % 1000 == 0:
            line = f"2026-11-24T06:{n % 60:02d}:00.000Z [warn] anticheat: {NEEDLE} for player p{rng.randint(1, 64)}"
        else:
            line = (
                f"2026-11-24T06:{n % 60:02d}:{n % 60:02d}.{n % 1000:03d}Z [{rng.choice(levels)}] tick {n} "
                f"player=p{rng.randint(1, 64)} pos=({rng.uniform(-1e3, 1e3):.2f},{rng.uniform(-1e3, 1e3):.2f}) "
                f"latency={rng.randint(5, 120)}ms"
            )
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


def seed(root: Path, sessions: int, body: bytes) -> None:
    """``sessions`` archives with the same gzipped logs, written as plain files in the store's layout."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    gz = compressor.compress(body) + compressor.flush()
    digest = hashlib.sha256(gz).hexdigest()
    for n in range(sessions):
        sid, ended = f"bench-{n:05d}", NOW - 60 - n
        key = keys.logs_key("", sid, "txt")
        item = ManifestItem(
            kind="logs", source="GET /query/log", outcome="archived", key=key, size=len(gz), sha256=digest,
            content_type="application/gzip",
        )  # fmt: skip
        manifest = build_manifest(
            session_id=sid, image="demo-game", tag="1.1.0", location="eu-west-1", host="203.0.113.42",
            created=ended - 1800, labels={}, players=("p1",), player_count=1, last_status="exited",
            last_seen_active=ended - 10, first_seen_ended=ended, fetch_deadline=None, archived_at=ended + 30,
            items=[item],
        )  # fmt: skip
        mkey = keys.manifest_key("", sid)
        files = {
            key: gz,
            mkey: manifest_to_bytes(manifest),
            keys.index_key("", ended, sid): index_entry_to_bytes(index_entry_for(manifest, mkey)),
        }
        for name, data in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def child(root: Path, workers: int) -> dict[str, float]:
    """List and search the store at ``root`` in this process; bytes, seconds, hits and this process's peak RSS."""
    store = FileStore(root)
    with open(os.devnull, "w", encoding="utf-8") as sink:
        started, cpu = time.perf_counter(), time.process_time()
        entries = retrieve.list_sessions(store, since=NOW - 7200, now=NOW)
        report = grep_sessions(store, entries, Matcher(NEEDLE), sink, workers=workers)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "sessions": report.sessions, "bytes": report.bytes, "seconds": elapsed, "cpu_seconds": cpu,
        "hits": report.hits, "rss_mib": rss_kib / 1024,
    }  # fmt: skip


def run_children(sessions: int, size: int, workers: int, repeats: int = 1) -> list[dict[str, float]]:
    """Seed a store here; measure the search ``repeats`` times, each in a fresh process (peak RSS: its own)."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        seed(Path(tmp), sessions, log_body(size))
        for _ in range(repeats):
            argv = [sys.executable, __file__, "--child", tmp, "--workers", str(workers)]
            results.append(json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--mib-per-session", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-mbps", type=float, default=100.0)
    parser.add_argument("--max-rss-growth", type=float, default=0.25)
    parser.add_argument("--child", metavar="STORE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.workers)))
        return 0

    runs = run_children(args.sessions, int(args.mib_per_session * MIB), args.workers, args.repeats)
    fast = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]  # the median run
    mbps = fast["bytes"] / 1e6 / fast["seconds"]
    [few] = run_children(100, 256 * 1024, args.workers)
    [many] = run_children(1000, 256 * 1024, args.workers)
    growth = many["rss_mib"] / few["rss_mib"] - 1
    ok = mbps >= args.budget_mbps and growth <= args.max_rss_growth and many["hits"] == 10 * few["hits"] > 0
    print(f"grep over {fast['sessions']:.0f} sessions x {args.mib_per_session:g} MiB of plain-text logs "
          f"({args.workers} workers, median of {len(runs)}): {fast['bytes'] / 1e6:.0f} MB decompressed in "
          f"{fast['seconds']:.2f} s = {mbps:.0f} MB/s (budget {args.budget_mbps:.0f} MB/s), {fast['hits']:.0f} hits; "
          f"{fast['bytes'] / 1e6 / fast['cpu_seconds']:.0f} MB per CPU second "
          f"({fast['cpu_seconds'] / fast['seconds']:.2f} cores busy)")  # fmt: skip
    print(f"peak RSS: {few['rss_mib']:.1f} MiB with 100 sessions, {many['rss_mib']:.1f} MiB with 1000 "
          f"({growth:+.1%}, budget {args.max_rss_growth:+.0%}) {'ok' if ok else 'MISSED'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
