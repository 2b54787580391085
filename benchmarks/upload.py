"""Benchmark of the upload stage against a real S3 server: ours beside `rclone copy` and boto3 in one run.

Usage: python benchmarks/upload.py [--rounds 3] [--small 200] [--large-mib 100] [--json out.json]

One SeaweedFS server on 127.0.0.1 (benchmarks/peers.py). Per round, in turn on the same server:
- ours (in a child process started like `archiver run`, allocator tuning included): the real
  Pipeline's upload workers (UploadStage: claim from the state DB, create-once PUT or
  multipart upload, outcome committed, spool file removed, then the session's manifest and index
  entry), from a state DB seeded with one ended session whose items are already spooled
  (hard links to the source files), timed from the workers' start until the pipeline logs the
  session archived;
- `rclone copy` of the same directory (defaults: 4 transfers) to another prefix;
- boto3 `upload_file` of the same files, 1 at a time and 4 at a time (rclone's transfers).
Two cases: `--small` files of 1 MiB, and one file of `--large-mib` MiB (RSS growth of this
process while ours uploads it: peak RSS reset through /proc/self/clear_refs first). Medians over
the rounds, ratios taken within each round (the machine is shared: only same-run ratios mean much).
CPU per object: ours over the timed window (set-up excluded), rclone's whole process (start included);
on 2 cores the server competes for the same CPU, so the client's CPU per object bounds the throughput.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peers import (
    MIB,
    boto3_client,
    boto3_upload_dir,
    finish,
    rclone_copy,
    reset_peak_rss,
    seaweedfs,
    status_kb,
    write_random_files,
)
from benchmarks.signals import ArchivedSignal

BUCKET = "bench-upload"
#: Goals of issue 14 (same run, this machine).
GOALS = {"small_vs_rclone": 1.0, "large_vs_boto3": 0.9, "large_rss_growth_mb": 32.0}
PEER_THREADS = 4


def seed_spooled(state_dir: Path, files: list[Path], prefix: str, tag: str) -> None:
    """A state DB holding one ended session whose items are every file, already spooled (hard links)."""
    from archiver.archive.state import StateDB

    spool = state_dir / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    state = StateDB.open(state_dir)
    key = f"1700000000000:{tag}"
    with state.write() as db:
        db.execute(
            "INSERT INTO sessions (key, id, instance, image, state, created, first_seen_ended, fetch_deadline) "
            "VALUES (?, ?, '', 'bench', 'ended', 1700000000.0, ?, ?)",
            (key, tag, time.time(), time.time() + 14400),
        )
        for n, path in enumerate(files):
            spooled = spool / f"{tag}-{n:05d}.part"
            os.link(path, spooled)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            db.execute(
                "INSERT INTO items (session_key, session_id, kind, path, status, deadline, source, key, "
                "spool_path, size, sha256, content_type, fetched_at) "
                "VALUES (?, ?, 'artifact', ?, 'spooled', ?, 'bench', ?, ?, ?, ?, 'application/octet-stream', ?)",
                (key, tag, f"/srv/{path.name}", time.time() + 14400, f"{prefix}{tag}/{path.name}",
                 str(spooled), path.stat().st_size, digest, time.time()),
            )  # fmt: skip
    state.close()


def run_ours(endpoint: str, state_dir: Path, files: list[Path], tag: str, workers: int | None) -> dict[str, float]:
    """Seconds for the real upload stage to store `files` and archive their session; RSS growth in MiB."""
    from prometheus_client import CollectorRegistry

    from archiver.archive.pipeline import Pipeline, Tuning
    from archiver.archive.state import StateDB
    from archiver.config.settings import Settings
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.store import open_store
    from archiver.upstream.api import SessionHostClient, Token

    prefix = "ours/"
    seed_spooled(state_dir, files, prefix, tag)
    extra = {} if workers is None else {"upload_workers": workers}
    settings = Settings(state_dir=state_dir, fetch_workers=1, **extra)  # type: ignore[arg-type]
    store = open_store(f"s3://{BUCKET}/{prefix}", s3_endpoint_url=endpoint)
    state = StateDB.open(state_dir)
    client = SessionHostClient.connect("http://127.0.0.1:9", Token("unused"))  # never called: nothing to fetch
    pipeline = Pipeline(settings, client, store, state, SelfMetrics(CollectorRegistry()), tuning=Tuning(idle_wait=0.2))
    pipeline.probe_store()  # as the daemon does at start-up
    key = f"1700000000000:{tag}"
    archived = ArchivedSignal([tag])
    reset_peak_rss()
    rss_before = status_kb("VmRSS")
    cpu_before = process_cpu()
    started = time.perf_counter()
    pipeline.start(reconcile=False)
    try:
        if not archived.wait(600):
            raise RuntimeError(f"session {tag} not archived after 600 s")
        seconds = time.perf_counter() - started
        cpu = process_cpu() - cpu_before
        growth = (status_kb("VmHWM") - rss_before) / 1024
        row = state.session(key)
        if row is None or row.state != "archived":
            raise RuntimeError(f"session {tag} logged as archived but is {row.state if row else 'missing'}")
    finally:
        archived.close()
        pipeline.stop(30)
        client.close()
        state.close()
        store.close()
    outcomes = [i.outcome for i in StateDB.open(state_dir).items_of(key)]
    if outcomes != ["archived"] * len(files):
        raise RuntimeError(f"not every item archived: {outcomes}")
    return {
        "seconds": seconds,
        "rss_growth_mb": growth,
        "workers": float(pipeline.upload_workers),
        "cpu_ms_per_object": cpu * 1000 / len(files),
    }


def process_cpu() -> float:
    """CPU seconds (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_ours(endpoint: str, state_dir: str, files_dir: str, tag: str, workers: str) -> None:
    """`run_ours` in a process of its own, started as `archiver run` starts (allocator tuning), so
    neither its RSS nor its allocator settings mix with the peers'; prints the result as JSON."""
    from archiver.app.process import tune_allocator

    tune_allocator()
    files = sorted(Path(files_dir).iterdir())
    print(json.dumps(run_ours(endpoint, Path(state_dir), files, tag, int(workers) or None)), flush=True)


def ours_in_child(endpoint: str, state_dir: Path, files: list[Path], tag: str, workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child-ours", endpoint, str(state_dir), str(files[0].parent), tag, str(workers)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def one_round(endpoint: str, work: Path, case: str, files: list[Path], n: int, workers: int) -> dict[str, float]:
    """Ours and each peer once; the order rotates from round to round (no one always goes first)."""
    client = boto3_client(endpoint)
    size = sum(p.stat().st_size for p in files)
    out: dict[str, float] = {}

    def ours() -> None:
        result = ours_in_child(endpoint, work / f"state-{case}-{n}", files, f"{case}-{n}", workers)
        out["ours_mb_s"] = size / result["seconds"] / 1e6
        out["ours_rss_growth_mb"] = result["rss_growth_mb"]
        out["ours_workers"] = result["workers"]
        out["ours_cpu_ms_per_object"] = result["cpu_ms_per_object"]

    def rclone() -> None:
        cpu_before = children_cpu()
        out["rclone_mb_s"] = size / rclone_copy(endpoint, files[0].parent, BUCKET, f"rclone-{case}-{n}/") / 1e6
        out["rclone_cpu_ms_per_object"] = (children_cpu() - cpu_before) * 1000 / len(files)

    def boto3_1() -> None:
        out["boto3_1_mb_s"] = size / boto3_upload_dir(client, files, BUCKET, f"boto3-1-{case}-{n}/", 1) / 1e6

    def boto3_n() -> None:
        seconds = boto3_upload_dir(client, files, BUCKET, f"boto3-n-{case}-{n}/", PEER_THREADS)
        out["boto3_n_mb_s"] = size / seconds / 1e6

    runs = [ours, rclone, boto3_1] + ([boto3_n] if len(files) > 1 else [])
    for run in runs[n % len(runs) :] + runs[: n % len(runs)]:
        run()
    out["vs_rclone"] = out["ours_mb_s"] / out["rclone_mb_s"]
    out["vs_boto3_1"] = out["ours_mb_s"] / out["boto3_1_mb_s"]
    if "boto3_n_mb_s" in out:
        out["vs_boto3_n"] = out["ours_mb_s"] / out["boto3_n_mb_s"]
    client.close()
    return out


def children_cpu() -> float:
    """CPU seconds (user + system) of the waited-for child processes so far (rclone, and ours)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=200, help="number of 1 MiB files (0 skips)")
    parser.add_argument("--large-mib", type=int, default=100, help="size of the large file (0 skips)")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--upload-workers", type=int, default=0, help="ours' upload workers (0: auto, the default)")
    parser.add_argument("--child-ours", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_ours:
        child_ours(*args.child_ours)
        return 0
    results: dict[str, Any] = {
        "when": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    verdicts: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="archiver-bench-upload-") as tmp, seaweedfs() as endpoint:
        work = Path(tmp)
        client = boto3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        # Warm-up: the server allocates the bucket's volumes on its first writes; nobody measures that.
        warm = write_random_files(work / "warm", 8, MIB)
        boto3_upload_dir(client, warm, BUCKET, "warm-up/", PEER_THREADS)
        cases = []
        if args.small:
            cases.append(("small", write_random_files(work / "small", args.small, MIB)))
        if args.large_mib:
            cases.append(("large", write_random_files(work / "large", 1, args.large_mib * MIB)))
        for case, files in cases:
            print(f"uploading {case}: {len(files)} files ...", file=sys.stderr, flush=True)
            rounds = [one_round(endpoint, work, case, files, n, args.upload_workers) for n in range(args.rounds)]
            results[case] = {"files": len(files), "bytes": sum(p.stat().st_size for p in files), **medians(rounds)}
            results[case]["rounds"] = rounds
    if "small" in results:
        verdicts["small_vs_rclone"] = results["small"]["vs_rclone"] >= GOALS["small_vs_rclone"]
    if "large" in results:
        verdicts["large_vs_boto3"] = results["large"]["vs_boto3_1"] >= GOALS["large_vs_boto3"]
        verdicts["large_rss_growth_mb"] = results["large"]["ours_rss_growth_mb"] <= GOALS["large_rss_growth_mb"]

    print(f"upload benchmark (SeaweedFS), {results['when']}, Python {results['python']}, {results['cpus']} CPUs")
    for case in ("small", "large"):
        if case not in results:
            continue
        r = results[case]
        line = (
            f"  {r['files']} x {r['bytes'] / r['files'] / MIB:.0f} MiB: ours {r['ours_mb_s']:.1f} MB/s "
            f"({r['ours_workers']:.0f} workers), rclone copy {r['rclone_mb_s']:.1f} MB/s, "
            f"boto3 upload_file {r['boto3_1_mb_s']:.1f} MB/s"
        )
        if "boto3_n_mb_s" in r:
            line += f", boto3 x{PEER_THREADS} threads {r['boto3_n_mb_s']:.1f} MB/s"
        line += f"; ours/rclone {r['vs_rclone']:.2f}, ours/boto3 {r['vs_boto3_1']:.2f}"
        if "vs_boto3_n" in r:
            line += f", ours/boto3 x{PEER_THREADS} {r['vs_boto3_n']:.2f}"
        line += f"; RSS growth {r['ours_rss_growth_mb']:.1f} MiB"
        cpu = r["ours_cpu_ms_per_object"], r["rclone_cpu_ms_per_object"]
        line += f"; CPU per object: ours {cpu[0]:.1f} ms, rclone {cpu[1]:.1f} ms"
        print(line)
    for name, ok in verdicts.items():
        print(f"  goal {name} ({GOALS[name]}): {'PASS' if ok else 'FAIL'}")
    return finish(results, verdicts, args.json)


if __name__ == "__main__":
    sys.exit(main())
