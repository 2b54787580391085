"""Chaos run with an oracle (minutes; not in `make bench` or `make test`): prints the table of RELIABILITY.md.

Usage: python benchmarks/chaos.py [--seed 1] [--duration 120] [--sessions-per-min 60] [--kills 12]
       [--scrape-sessions 10000] [--outage-mode restart|gate] [--workdir DIR] [--json out.json]

`archiver run` archives the fake service's traffic into SeaweedFS while it is killed with SIGKILL at
random moments (half of them timed to land while a transfer is in flight), stopped for a while,
fed 5xx, 429, poll timeouts, truncated bodies and resets by the upstream, and the store is stopped
and started again on its data; the fake drops logs at termination and cuts every session's first
follow stream mid-line. Then the faults stop, one more session starts and ends, everything drains
and is checked against the fake's own record (every session it ended, the sha256 of every artifact
body it served, every log line by line); then `--scrape-sessions` active sessions are scraped by 50 concurrent scrapers.
The scenario itself lives in `tests/chaos_run.py` (its short version runs in `make test`). Exits 1
if anything was lost, duplicated, incomplete, different from the oracle, left behind or leaked.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos_run import MIB, ChaosConfig, percentile, run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of storm (default 120)")
    parser.add_argument("--sessions-per-min", type=float, default=60.0, help="traffic sessions started per minute")
    parser.add_argument("--big-sessions", type=int, default=8, help="sessions with a multipart-sized artifact")
    parser.add_argument("--big-mib", type=int, default=40, help="size of that artifact, MiB")
    parser.add_argument("--kills", type=int, default=12, help="SIGKILLs (half of them wait for a transfer)")
    parser.add_argument("--stops", type=int, default=2, help="windows with the daemon stopped")
    parser.add_argument("--stop-for", type=float, default=10.0)
    parser.add_argument("--store-outages", type=int, default=2)
    parser.add_argument("--store-outage-for", type=float, default=10.0)
    parser.add_argument("--outage-mode", choices=("restart", "gate"), default="restart")
    parser.add_argument("--scrape-sessions", type=int, default=10_000, help="0 skips the scrape phase")
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="the fake keeps logs after the end (default: drops them at termination)",
    )
    parser.add_argument("--cut-after", type=int, default=200, help="cut each first follow stream after N bytes (0: no)")
    parser.add_argument("--workdir", type=Path, help="keep SeaweedFS data, state dir and daemon logs here")
    parser.add_argument("--json", type=Path, help="also write the report as JSON")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        seed=args.seed, storm=args.duration, rate_per_min=args.sessions_per_min, lifetime=(2.0, 20.0),
        big_sessions=args.big_sessions, big_size=args.big_mib * MIB, kills=args.kills,
        targeted_kills=args.kills // 2, stops=args.stops, stop_for=args.stop_for,
        store_outages=args.store_outages, store_outage_for=args.store_outage_for,
        store_outage_mode=args.outage_mode, drain_timeout=args.drain_timeout,
        scrape_sessions=args.scrape_sessions, scrapers=args.scrapers, logs_gone=not args.keep_logs,
        cut_after=args.cut_after,
    )  # fmt: skip
    begun = time.monotonic()

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - begun:7.1f}s] {message}", file=sys.stderr, flush=True)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="archiver-chaos-"))
    progress(f"working in {workdir}")
    report = run_chaos(config, workdir, progress=progress)
    print(report.table())
    failures = report.failures()
    if args.json:
        doc = dataclasses.asdict(report)
        doc["scrape_p50_ms"] = percentile(report.scrape_ms, 50)
        doc["scrape_p99_ms"] = percentile(report.scrape_ms, 99)
        doc.pop("scrape_ms")
        doc["failures"] = failures
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    for line in failures:
        print(f"FAILED: {line}")
    print("nothing lost, duplicated or leaked" if not failures else "the chaos run FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
