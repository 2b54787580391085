"""Benchmark of a sharded fleet (README, "Scaling and high availability"): 100,000 sessions served to
4 shard processes, each exporting its quarter, beside one process holding all 100,000, same run.

Usage: python benchmarks/sharded.py [--sessions 100000] [--shards 4] [--polls 15] [--json out.json]

The list bodies and the stand-in upstream are the scrape benchmark's (`scrape.py`: realistic
`GET /session` bodies, ~2 % of the sessions changing per poll, held in memory by a process of its
own; the fake service's Python JSON encoder would dominate at this size, and it is the archiver's
cost we measure). Each measured daemon runs the daemon's poll path in a fresh process (Poller with the
shard's SessionListParser, SnapshotRenderer, MetricsServer), one after the other, each against a
fresh upstream process: per shard, poll p50 (wall clock, and the CPU time the daemon spent, which
a loaded machine disturbs far less), scrape p50 (gzip, as Prometheus asks) and peak RSS. Every shard
still receives the whole list, parsed as it streams in a window at a time (the 63 MB body is never
held whole), and reads every entry's id; only its own entries are hashed, parsed and rendered.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import scrape  # noqa: E402  (the list bodies, the stand-in upstream and the scrape timing)

BUDGET_POLL_P50_MS = 250.0
BUDGET_RSS_MB = 150.0


def child_daemon(polls: int, upstream: str, shard: int, total: int) -> None:
    """The daemon's poll path for one shard (`total` 1: the unsharded daemon)."""
    from prometheus_client import CollectorRegistry

    from archiver.app import process

    applied = process.apply()  # as `archiver run` does at start-up (no live capture here)

    from archiver.config.sharding import Shard
    from archiver.exporter.exposition import SnapshotRenderer
    from archiver.exporter.metricsserver import MetricsServer
    from archiver.exporter.poller import SESSIONS, Poller
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.upstream.api import SessionHostClient, Token
    from archiver.upstream.listparser import SessionListParser

    me = Shard(shard, total)
    client = SessionHostClient.connect(upstream, Token("benchmark"))
    parser = SessionListParser(owns=None if me.whole else me.owns, digests=applied.list_digests)
    poller = Poller(client, interval=10.0, on_result=lambda r: None, parser=parser, upstream_metrics=shard == 0)
    renderer = SnapshotRenderer(max_sessions=10**6, label_allowlist=["mode", "tournament"])
    totals, lists, cpus = [], [], []
    snapshot = None
    exported = 0
    for i in range(1 + polls):
        t0, c0 = time.perf_counter(), time.process_time()
        result = poller.poll_once()
        snapshot = renderer.render(result.sessions, result.families, now=result.started_at)
        t1, c1 = time.perf_counter(), time.process_time()
        if result.errors:
            raise RuntimeError(f"poll failed: {result.errors}")
        exported = len(result.sessions or ())
        if i:
            totals.append(t1 - t0)
            cpus.append(c1 - c0)
            lists.append(result.durations[SESSIONS])
        del result
    server = MetricsServer(
        ("127.0.0.1", 0),
        snapshot_source=lambda: snapshot,
        self_metrics=SelfMetrics(CollectorRegistry()),
        health=lambda: (True, "ok"),
        ready=lambda: (True, "ok"),
        web_config=None,
    )
    server.start()
    ready = {
        "url": server.url,
        "poll_p50_ms": scrape.p50_ms(totals),
        "poll_cpu_p50_ms": scrape.p50_ms(cpus),
        "list_p50_ms": scrape.p50_ms(lists),
    }
    print(json.dumps({**ready, "sessions": exported}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"maxrss_mb": scrape.maxrss_mb()}), flush=True)
    server.stop()


class Child(scrape.Child):
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark child {args[:2]} exited with {self.proc.wait()}")
        self.ready = json.loads(line)


def measure(paths: list[Path], args: argparse.Namespace, shard: int, total: int) -> dict[str, Any]:
    common = ["--paths", ",".join(map(str, paths)), "--polls", str(args.polls)]
    upstream = Child(["--child", "upstream", *common])
    daemon = Child(
        ["--child", "daemon", *common, "--upstream", upstream.ready["url"], "--shard", str(shard),
         "--total", str(total)]
    )  # fmt: skip
    with httpx.Client(timeout=120) as client:
        scrape_ms, _ = scrape.scrape_p50(client, daemon.ready["url"] + "/metrics", gzip=True, samples=args.samples)
    result = {k: v for k, v in daemon.ready.items() if k != "url"}
    result.update(shard=shard, total=total, scrape_p50_ms=scrape_ms, rss_mb=daemon.finish()["maxrss_mb"])
    upstream.finish()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--polls", type=int, default=15, help="poll cycles measured per process")
    parser.add_argument("--samples", type=int, default=30, help="scrapes per process")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--child", choices=("daemon", "upstream"), help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        paths = [Path(p) for p in args.paths.split(",")]
        if args.child == "daemon":
            child_daemon(args.polls, args.upstream, args.shard, args.total)
        else:
            scrape.child_upstream(paths, args.polls)
        return 0

    with tempfile.TemporaryDirectory(prefix="archiver-bench-") as tmp:
        print(f"generating {args.sessions:,} sessions ...", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, str(HERE / "scrape.py"), "--child", "generate", "--sessions", str(args.sessions),
             "--paths", tmp, "--polls", str(args.polls)],
            check=True,
        )  # fmt: skip
        paths = scrape.variant_paths(Path(tmp), args.sessions, args.polls)
        results = []
        for shard in range(args.shards):
            print(f"shard {shard} of {args.shards} ...", file=sys.stderr, flush=True)
            results.append(measure(paths, args, shard, args.shards))
        print("one process, every session ...", file=sys.stderr, flush=True)
        results.append(measure(paths, args, 0, 1))
    print(
        f"sharded benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, {args.sessions:,} sessions in the list"
    )
    print(f"{'':24}{'sessions':>10}{'poll p50 ms':>14}{'CPU p50 ms':>12}{'list p50 ms':>14}{'scrape p50 ms':>15}"
          f"{'peak RSS MB':>13}")  # fmt: skip
    failed = False
    for r in results:
        name = f"shard {r['shard']} of {r['total']}" if r["total"] > 1 else "unsharded"
        ok = r["poll_p50_ms"] <= BUDGET_POLL_P50_MS and r["rss_mb"] <= BUDGET_RSS_MB
        verdict = "" if r["total"] == 1 else ("  PASS" if ok else "  FAIL")
        failed |= r["total"] > 1 and not ok
        print(f"{name:24}{r['sessions']:>10,}{r['poll_p50_ms']:>14.1f}{r['poll_cpu_p50_ms']:>12.1f}{r['list_p50_ms']:>14.1f}"
              f"{r['scrape_p50_ms']:>15.1f}{r['rss_mb']:>13.1f}{verdict}")  # fmt: skip
    print(f"budget per shard: poll p50 <= {BUDGET_POLL_P50_MS:g} ms, peak RSS <= {BUDGET_RSS_MB:g} MB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
