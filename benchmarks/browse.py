"""Benchmark of the evidence browser (issue 13): the list's first page over 10,000 archived sessions, and
the memory a 100 MB artifact download costs.

Usage: python benchmarks/browse.py [--sessions 10000] [--days 7] [--artifact-mb 100] [--json out.json]

The sessions are written into a local directory store the way tests/support.py's
``put_session`` does (objects, create-once manifest, index entry, as archiver/upload.py writes
them), ending over the last ``--days`` days; one more session carries a 100 MB artifact stored with
``put_file``. ``archiver browse`` then serves the store from its own process, and this one requests:
- the list's first page (``GET /sessions``: 50 newest, default filters), p50 and p95 of 30;
- a filtered first page (a label only 1 % of sessions carry), p50 of 10 (reported, no budget);
- the 100 MB artifact, streamed and hashed here; the server's peak RSS (VmHWM) before and after.
Budgets: first page p50 < 200 ms; the download raises the server's peak RSS by < 32 MB (flat,
not the artifact's size) and arrives with the manifest's sha256.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from archiver.layout import keys
from archiver.layout.manifest import (
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
)
from archiver.store import ObjectStore, open_store
from tests.support import put_session

FIRST_PAGE_BUDGET_MS = 200.0
DOWNLOAD_RSS_BUDGET_MB = 32.0
BIG_ID = "big-artifact-session"


def write_archive(store: ObjectStore, sessions: int, days: float, now: float) -> None:
    rng = random.Random(13)
    ends = sorted((now - rng.uniform(60, days * 86400) for _ in range(sessions)), reverse=True)

    def one(i: int) -> None:
        labels = {"mode": "ranked" if i % 100 else "tournament", "region": ("eu", "us", "ap")[i % 3]}
        put_session(store, f"match-{i:05d}-{rng.getrandbits(32):08x}", ended_at=ends[i], labels=labels)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(sessions)))


def write_big_session(store: ObjectStore, tmp: Path, size: int, now: float) -> str:
    """One session whose artifact is ``size`` bytes, stored with put_file (never whole in memory)."""
    path = tmp / "big.tar.gz"
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for i in range(size // len(block)):
            chunk = block[:8] + i.to_bytes(8, "big") + block[16:]
            f.write(chunk)
            digest.update(chunk)
    sha = digest.hexdigest()
    key = keys.artifact_key(store.prefix, BIG_ID, "/srv/replays/big.replay")
    store.put_file(key, path, sha256=sha, size=size, content_type="application/gzip")
    item = ManifestItem(
        kind="artifact",
        source="GET /artifacts",
        outcome="archived",
        key=key,
        size=size,
        sha256=sha,
        content_type="application/gzip",
        path="/srv/replays/big.replay",
    )
    m = build_manifest(
        session_id=BIG_ID,
        image="demo-game",
        tag="1.1.0",
        location="eu-west-1",
        host="203.0.113.42",
        created=now - 1800,
        labels={},
        players=(),
        player_count=0,
        last_status="exited",
        last_seen_active=now - 40,
        first_seen_ended=now - 30,
        fetch_deadline=now + 3600,
        archived_at=now,
        items=[item],
    )
    mkey = keys.manifest_key(store.prefix, BIG_ID)
    store.put_bytes(mkey, manifest_to_bytes(m), content_type="application/json")
    store.put_bytes(
        keys.index_key(store.prefix, m.ended_at, BIG_ID),
        index_entry_to_bytes(index_entry_for(m, mkey)),
        content_type="application/json",
    )
    path.unlink()
    return sha


def rss_mb(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    assert found, field
    return int(found.group(1)) / 1024


def timed_get(client: httpx.Client, path: str, **params: str) -> float:
    start = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = (time.perf_counter() - start) * 1000
    assert response.status_code == 200, response.text[:500]
    assert response.text.count('class="session"') > 0
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--artifact-mb", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="browse-bench-") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "archive"
        root.mkdir()
        store = open_store(root.as_uri())
        start = time.perf_counter()
        write_archive(store, args.sessions, args.days, now)
        sha = write_big_session(store, tmp, args.artifact_mb << 20, now)
        print(
            f"wrote {args.sessions} sessions + one {args.artifact_mb} MB artifact "
            f"in {time.perf_counter() - start:.0f} s"
        )
        listen = ["--web.listen-address", "127.0.0.1:0"]
        server = subprocess.Popen(
            [sys.executable, "-m", "archiver.cli", "browse", "--store", root.as_uri(), *listen],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stderr is not None
            line = server.stderr.readline()
            found = re.search(r"(http://\S+)/sessions", line)
            assert found, line
            with httpx.Client(base_url=found.group(1), timeout=60) as client:
                timed_get(client, "/sessions")  # warm-up: imports, template compilation
                first = [timed_get(client, "/sessions") for _ in range(30)]
                filtered = [timed_get(client, "/sessions", label="mode=tournament", since="7d") for _ in range(10)]
                hwm_before = rss_mb(server.pid, "VmHWM")
                rss_before = rss_mb(server.pid, "VmRSS")
                digest = hashlib.sha256()
                received = 0
                start = time.perf_counter()
                with client.stream("GET", f"/sessions/{BIG_ID}/items/0") as response:
                    assert response.status_code == 200
                    for chunk in response.iter_raw():
                        digest.update(chunk)
                        received += len(chunk)
                download_s = time.perf_counter() - start
                hwm_after = rss_mb(server.pid, "VmHWM")
        finally:
            server.terminate()
            server.wait(timeout=30)
            store.close()
    p50 = statistics.median(first)
    p95 = statistics.quantiles(first, n=20)[18]
    growth = hwm_after - hwm_before
    result = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "sessions": args.sessions,
        "days": args.days,
        "first_page_p50_ms": round(p50, 1),
        "first_page_p95_ms": round(p95, 1),
        "filtered_page_p50_ms": round(statistics.median(filtered), 1),
        "download_mb": round(received / 2**20, 1),
        "download_mb_per_s": round(received / 2**20 / download_s, 1),
        "server_rss_before_mb": round(rss_before, 1),
        "server_peak_rss_growth_mb": round(growth, 1),
        "sha256_ok": digest.hexdigest() == sha,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = True
    if p50 >= FIRST_PAGE_BUDGET_MS:
        print(f"BUDGET MISSED: first page p50 {p50:.1f} ms >= {FIRST_PAGE_BUDGET_MS} ms")
        ok = False
    if growth >= DOWNLOAD_RSS_BUDGET_MB or received != args.artifact_mb << 20 or not result["sha256_ok"]:
        print(
            f"BUDGET MISSED: download peak RSS growth {growth:.1f} MB, {received} bytes, "
            f"sha256 ok {result['sha256_ok']}"
        )
        ok = False
    print("budgets met" if ok else "budgets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
