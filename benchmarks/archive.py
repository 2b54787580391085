"""Benchmark of the archive pipeline (ARCHITECTURE.md §8): one 100 MB artifact, and 1,000 sessions ending at once.

Usage: python benchmarks/archive.py [--json out.json] [--sessions 1000] [--artifact-mib 100]

The upstream (archiver.fake) runs in a child process and S3 is a real SeaweedFS server
(benchmarks/peers.py), both on 127.0.0.1, so they do not share the archiver's GIL or memory; this
process runs the archiver (the real Pipeline: detection, confirm, fetch to spool, S3 upload,
manifest, as `archiver run` starts: allocator tuning, upload workers `auto`) and the baselines.

1. Large artifact: RSS growth of this process while the artifact is archived (peak RSS is reset
   through /proc/self/clear_refs before it starts) and the upload stage's throughput (spool file →
   S3, multipart, journaled, HEAD-verified) against a plain boto3 `upload_file` of the same bytes
   from a file to the same endpoint, measured right after. End-to-end throughput (session end seen
   → manifest written, fetch and upload one after the other) is reported too.
2. Many sessions: N sessions (1 MB of logs and a 5 MB artifact each) end at once; the wall time
   until all are archived (fetch included), with a check that every item was archived and every
   object is there. Reference: `rclone copy` of files of the same sizes from disk to the same
   server (the time the best copier needs for the bytes alone); goal (issue 14) <= 1.5x.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peers import (
    AWS_ENV,
    boto3_client,
    cpu_seconds,
    finish,
    rclone_copy,
    reset_peak_rss,
    seaweedfs,
    server_cpu_seconds,
    status_kb,
    write_random_files,
)
from benchmarks.signals import ArchivedSignal

TOKEN = "bench-token"
MIB = 1024 * 1024
BIG_PATH = "/srv/replays/big.replay"
REPLAY = "/srv/replays/match.replay"
#: Fake log lines per session for about 1 MB of logs (lines average ~50 bytes).
LOG_LINES_1MB = 20_000
BUDGETS = {"rss_growth_mb": 64.0, "throughput_ratio": 0.75, "many_vs_rclone": 1.5}


# --- children ---------------------------------------------------------------------------------------


def child_fake(log_lines: int) -> None:
    """The fake upstream; prints its URL, then runs JSON commands from stdin (add / end sessions).

    Every session gets the same log script: the fake writes a session's log line by line from its
    own random generator, about 0.9 s of pure-Python CPU per 1 MB log on this machine (measured),
    so with a script per session the stand-in upstream, not the archiver, would set the pace of
    the many-sessions case (1,000 sessions: 15 CPU minutes on a 2-core machine shared with us).
    """
    import functools

    from archiver.fake import FakeService, routes, server
    from archiver.fake import logs as fake_logs
    from archiver.fake.content import FileSpec, file_kind
    from archiver.fake.oracle import Tally

    one_script = functools.cache(fake_logs._script.__wrapped__)
    fake_logs._script = lambda session_id, body_lines: one_script("benchmark", body_lines)  # type: ignore[assignment]

    # For the same reason every session's artifact body is made once (about 15 ms of CPU per 5 MB
    # otherwise: generating, checksumming and tarring) and the oracle's sha256 of every body served
    # is not computed (nothing here reads it). The archiver still receives, hashes, spools and
    # uploads every byte of every session, and SeaweedFS stores every object (it does not dedupe).
    make_artifact = routes.artifact_stream

    @functools.cache
    def one_artifact(path: str, size: int) -> tuple[bytes, ...]:
        body = make_artifact("benchmark", {path: FileSpec(path, size, file_kind(path))}, path)
        assert body is not None
        return tuple(body)

    def artifact_stream(session_id: str, files: dict[str, FileSpec], path: str) -> Iterator[bytes] | None:
        spec = files.get(path)
        return iter(one_artifact(path, spec.size)) if spec is not None else None

    class SizeOnly(Tally):
        def add(self, data: bytes) -> None:
            self.size += len(data)

    routes.artifact_stream = artifact_stream  # type: ignore[assignment]
    server.Tally = SizeOnly  # type: ignore[misc]

    with FakeService((TOKEN,), log_lines=log_lines) as fake:
        print(fake.base_url, flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "add":
                for sid in cmd["ids"]:
                    fake.add_session(TOKEN, id=sid, files=cmd.get("files") or {})
            elif cmd["op"] == "end":
                for sid in cmd["ids"]:
                    fake.end_session(TOKEN, sid)
            print("ok", flush=True)


class Child:
    """A child process of this script speaking line by line on stdin/stdout."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **AWS_ENV},
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError(f"child {args} did not start")

    def command(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":
            raise RuntimeError(f"child refused {cmd['op']}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- measurement helpers ----------------------------------------------------------------------------


def rss_mb() -> float:
    return status_kb("VmRSS") / 1024


def peak_rss_mb() -> float:
    return status_kb("VmHWM") / 1024


class Archiver:
    """The real pipeline in this process against the children."""

    def __init__(self, fake_url: str, endpoint: str, bucket: str, state_dir: Path, paths: tuple[str, ...],
                 fetch_workers: int, upload_workers: int | None) -> None:  # fmt: skip
        from prometheus_client import CollectorRegistry

        from archiver.archive.pipeline import Pipeline, Tuning
        from archiver.archive.state import StateDB
        from archiver.config.settings import Settings
        from archiver.metrics.selfmetrics import SelfMetrics
        from archiver.store import open_store
        from archiver.upstream.api import SessionHostClient, Token

        self.settings = Settings(
            state_dir=state_dir,
            artifact_paths=paths,
            fetch_workers=fetch_workers,
            **({} if upload_workers is None else {"upload_workers": upload_workers}),  # type: ignore[arg-type]
        )
        self.client = SessionHostClient.connect(fake_url, Token(TOKEN))
        self.store = open_store(f"s3://{bucket}/archive/", s3_endpoint_url=endpoint)
        self.state = StateDB.open(state_dir)
        self.registry = CollectorRegistry()
        self.pipeline = Pipeline(
            self.settings, self.client, self.store, self.state, SelfMetrics(self.registry),
            tuning=Tuning(idle_wait=0.5),
        )  # fmt: skip
        self.pipeline.probe_store()  # as the daemon does at start-up (create-once, checksum checks)

    def poll(self) -> None:
        self.pipeline.observe_poll(self.client.list_sessions().sessions, time.time())

    def archived(self, ids: list[str]) -> int:
        return sum(1 for r in self.state.sessions_in("archived") if r.id in set(ids))

    def close(self) -> None:
        self.pipeline.stop(30)
        self.client.close()
        self.state.close()


def timed(fn: Callable[..., Any], record: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - started)

    return wrapper


def wait_archived(arch: Archiver, archived: ArchivedSignal, ids: list[str], timeout: float) -> float:
    """Poll the upstream as the daemon does (once a second) until the pipeline has logged every id
    archived; seconds taken. Nothing else runs in this process meanwhile: no look at the state DB."""
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout:
            arch.poll()
            if archived.wait(1.0):
                return time.monotonic() - started
    finally:
        archived.close()
    raise RuntimeError(f"only {arch.archived(ids)} of {len(ids)} sessions archived after {timeout} s")


# --- the two benchmarks -----------------------------------------------------------------------------


def _key(state: Any, sid: str) -> str:
    """The state DB key of the newest instance of `sid` (rows are per session instance)."""
    row = state.latest(sid)
    assert row is not None, sid
    return str(row.key)


def bench_large(endpoint: str, tmp: Path, artifact_mib: int) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig

    fake = Child("fake", "120")
    try:
        s3 = boto3_client(endpoint)
        bucket = "bench-large"
        s3.create_bucket(Bucket=bucket)
        fake.command(op="add", ids=["big"], files={BIG_PATH: artifact_mib * MIB})
        arch = Archiver(fake.url, endpoint, bucket, tmp / "state-large", (BIG_PATH,), 4, None)
        uploads: list[float] = []
        arch.pipeline.uploader.upload = timed(arch.pipeline.uploader.upload, uploads)  # type: ignore[method-assign]
        arch.pipeline.recover()
        arch.poll()
        reset_peak_rss()
        rss_before = rss_mb()
        archived = ArchivedSignal(["big"])
        arch.pipeline.start()
        fake.command(op="end", ids=["big"])
        e2e = wait_archived(arch, archived, ["big"], 600)
        rss_growth = peak_rss_mb() - rss_before
        big = arch.state.latest("big")
        assert big is not None
        (item,) = [i for i in arch.state.items_of(big.key) if i.kind == "artifact"]
        size = item.size or 0
        upload_seconds = max(uploads)
        arch.close()

        # Baseline: the same bytes from a file, plain boto3 managed upload, same endpoint.
        source = tmp / "baseline.bin"
        with source.open("wb") as out:
            for chunk in arch.store.iter_bytes(item.key or ""):
                out.write(chunk)
        started = time.perf_counter()
        s3.upload_file(str(source), bucket, "baseline/object.bin", Config=TransferConfig())
        baseline_seconds = time.perf_counter() - started
        source.unlink()
    finally:
        fake.close()
    ours = size / upload_seconds / 1e6
    base = size / baseline_seconds / 1e6
    return {
        "artifact_bytes": size,
        "rss_growth_mb": round(rss_growth, 1),
        "upload_mb_s": round(ours, 1),
        "baseline_boto3_mb_s": round(base, 1),
        "throughput_ratio": round(ours / base, 3),
        "end_to_end_s": round(e2e, 2),
        "end_to_end_mb_s": round(size / e2e / 1e6, 1),
    }


def bench_many(endpoint: str, tmp: Path, count: int, fetch_workers: int, upload_workers: int | None) -> dict[str, Any]:
    fake = Child("fake", str(LOG_LINES_1MB))
    try:
        s3 = boto3_client(endpoint)
        bucket = "bench-many"
        s3.create_bucket(Bucket=bucket)
        ids = [f"match-{n:05d}" for n in range(count)]
        fake.command(op="add", ids=ids, files={REPLAY: 5 * MIB})
        arch = Archiver(fake.url, endpoint, bucket, tmp / "state-many", (REPLAY,), fetch_workers, upload_workers)
        workers = arch.pipeline.upload_workers
        arch.pipeline.recover()
        arch.poll()
        reset_peak_rss()
        rss_before = rss_mb()
        cpu_before = (_own_cpu(), cpu_seconds(fake.proc.pid), server_cpu_seconds(endpoint))
        archived = ArchivedSignal(ids)
        arch.pipeline.start()
        fake.command(op="end", ids=ids)
        wall = wait_archived(arch, archived, ids, 3600)
        cpu_after = (_own_cpu(), cpu_seconds(fake.proc.pid), server_cpu_seconds(endpoint))
        rss_growth = peak_rss_mb() - rss_before
        outcomes = arch.state.outcome_counts()
        sizes = [(i.kind, i.size or 0) for sid in ids for i in arch.state.items_of(_key(arch.state, sid))]
        arch.close()
        keys = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="archive/"):
            keys += len(page.get("Contents", []))
    finally:
        fake.close()
    # Reference: rclone copies files of the same sizes (random bytes) from disk to the same server.
    source = tmp / "rclone-source"
    source.mkdir()
    for n, (kind, size) in enumerate(sizes):
        write_random_files(source, 1, size, name=f"{n:06d}-{kind}.bin")
    rclone_cpu_before = (_children_cpu(), server_cpu_seconds(endpoint))
    rclone_seconds = rclone_copy(endpoint, source, bucket, "rclone/")
    rclone_cpu = [
        after - before
        for before, after in zip(rclone_cpu_before, (_children_cpu(), server_cpu_seconds(endpoint)), strict=True)
    ]
    ours_cpu = [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]
    total_bytes = sum(size for _, size in sizes)
    archived = outcomes.get(("logs", "archived"), 0) + outcomes.get(("artifact", "archived"), 0)
    return {
        "sessions": count,
        "wall_s": round(wall, 1),
        "sessions_per_s": round(count / wall, 1),
        "items_archived": archived,
        "items_expected": 2 * count,
        "objects": keys,
        "objects_expected": 4 * count,
        "stored_mb": round(total_bytes / 1e6),
        "rss_growth_mb": round(rss_growth, 1),
        "upload_workers": workers,
        "rclone_s": round(rclone_seconds, 1),
        "vs_rclone": round(wall / rclone_seconds, 2),
        # Where the 2 cores went (CPU seconds): the archiver (this process), the stand-in upstream,
        # SeaweedFS; and during the reference, rclone and SeaweedFS.
        "cpu_archiver_s": round(ours_cpu[0], 1),
        "cpu_fake_s": round(ours_cpu[1], 1),
        "cpu_seaweedfs_s": round(ours_cpu[2], 1),
        "cpu_rclone_s": round(rclone_cpu[0], 1),
        "cpu_seaweedfs_rclone_s": round(rclone_cpu[1], 1),
    }


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions ending at once (0 skips)")
    parser.add_argument("--artifact-mib", type=int, default=100, help="size of the large artifact (0 skips)")
    parser.add_argument("--fetch-workers", type=int, default=4)
    parser.add_argument("--upload-workers", type=int, help="default: auto, as `archiver run`")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_fake(int(args.child[1]))
        return 0

    from archiver.app.process import tune_allocator

    tune_allocator()  # this process is the archiver: started as `archiver run` starts
    results: dict[str, Any] = {
        "when": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    verdicts: dict[str, bool] = {}
    with seaweedfs() as endpoint, tempfile.TemporaryDirectory(prefix="archiver-bench-") as tmp:
        if args.artifact_mib:
            print(f"archiving one {args.artifact_mib} MiB artifact ...", file=sys.stderr, flush=True)
            large = bench_large(endpoint, Path(tmp), args.artifact_mib)
            results["large_artifact"] = large
            verdicts["rss_growth"] = large["rss_growth_mb"] <= BUDGETS["rss_growth_mb"]
            verdicts["throughput"] = large["throughput_ratio"] >= BUDGETS["throughput_ratio"]
        if args.sessions:
            print(f"archiving {args.sessions} sessions ending at once ...", file=sys.stderr, flush=True)
            many = bench_many(endpoint, Path(tmp), args.sessions, args.fetch_workers, args.upload_workers)
            results["many_sessions"] = many
            verdicts["all_archived"] = (
                many["items_archived"] == many["items_expected"] and many["objects"] == many["objects_expected"]
            )
            verdicts["many_vs_rclone"] = many["vs_rclone"] <= BUDGETS["many_vs_rclone"]

    print(f"archive benchmark, {results['when']}, Python {results['python']}, {results['cpus']} CPUs")
    if "large_artifact" in results:
        r = results["large_artifact"]
        print(
            f"  {r['artifact_bytes'] / 1e6:.0f} MB artifact: RSS growth {r['rss_growth_mb']} MB "
            f"(budget <= {BUDGETS['rss_growth_mb']:.0f}) {_pf(verdicts['rss_growth'])}"
        )
        print(
            f"  upload stage {r['upload_mb_s']} MB/s vs plain boto3 {r['baseline_boto3_mb_s']} MB/s = "
            f"{r['throughput_ratio']:.0%} (budget >= {BUDGETS['throughput_ratio']:.0%}) {_pf(verdicts['throughput'])}"
        )
        print(f"  end to end (fetch, then upload): {r['end_to_end_s']} s, {r['end_to_end_mb_s']} MB/s")
    if "many_sessions" in results:
        m = results["many_sessions"]
        print(
            f"  {m['sessions']} sessions ending at once: all archived in {m['wall_s']} s "
            f"({m['sessions_per_s']} sessions/s, {m['stored_mb']} MB, {m['upload_workers']} upload workers), "
            f"items {m['items_archived']}/{m['items_expected']}, objects {m['objects']}/{m['objects_expected']}, "
            f"RSS growth {m['rss_growth_mb']} MB {_pf(verdicts['all_archived'])}"
        )
        print(
            f"  rclone copy of the same bytes from disk: {m['rclone_s']} s; ours/rclone {m['vs_rclone']}x "
            f"(goal <= {BUDGETS['many_vs_rclone']}) {_pf(verdicts['many_vs_rclone'])}"
        )
        print(
            f"  CPU seconds: archiver {m['cpu_archiver_s']}, stand-in upstream {m['cpu_fake_s']}, "
            f"SeaweedFS {m['cpu_seaweedfs_s']}; during rclone: rclone {m['cpu_rclone_s']}, "
            f"SeaweedFS {m['cpu_seaweedfs_rclone_s']}"
        )
    return finish(results, verdicts, args.json)


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


if __name__ == "__main__":
    sys.exit(main())
