"""Benchmark of reconciliation (issue 9): what `GET /session?all=true` every --reconcile-interval
adds to the steady-state poll cost at 10,000 active sessions.

Usage: python benchmarks/reconcile.py [--active 10000] [--ended 10000] [--json out.json]

A stand-in upstream in its own process serves realistic bodies over 127.0.0.1: the plain list
holds the active sessions, the `all=true` list the active plus the ended ones (what the real
service keeps for 4 hours). This process runs the archiver's own code paths against it:
- steady poll (archive half): `GET /session` with the poller's incremental parser, then
  `Pipeline.observe_poll`, the same list every time (p50);
- steady reconciliation: `Pipeline.reconcile()` when every ended session is already archived (p50);
- first reconciliation of a new state DB, which queues every ended session (once).
Budget: reconciliation amortized over the polls between two reconciliations (10 s polls, 5 min
reconciliations by default) costs at most as much as one poll, i.e. it does not double the poll cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scrape import make_session

POLL_INTERVAL = 10.0
RECONCILE_INTERVAL = 300.0
#: Amortized reconciliation cost per poll, as a fraction of the steady poll cost.
BUDGET_RATIO = 1.0


def child_upstream(active: Path, everything: Path) -> None:
    bodies = {False: active.read_bytes(), True: everything.read_bytes()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = bodies["all=true" in self.path]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def _p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def measure(upstream: str, workdir: Path, ended_count: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from archiver.app.process import list_digests
    from archiver.archive.pipeline import Pipeline
    from archiver.archive.state import StateDB
    from archiver.config.settings import Settings
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.store import FileStore
    from archiver.upstream.api import SessionHostClient, Token
    from archiver.upstream.listparser import SessionListParser

    (workdir / "store").mkdir()
    settings = Settings(state_dir=workdir / "state")
    client = SessionHostClient.connect(upstream, Token("benchmark"))
    state = StateDB.open(settings.state_dir)
    pipeline = Pipeline(settings, client, FileStore(workdir / "store"), state, SelfMetrics(CollectorRegistry()))

    parser = SessionListParser(digests=list_digests())  # the daemon's poll parser's (nothing else tuned)
    poll_times = []
    for i in range(21):
        t0 = time.perf_counter()
        listing = client.list_sessions(parser=parser)
        pipeline.observe_poll(listing.sessions, 1_800_000_000.0 + i)
        if i:
            poll_times.append(time.perf_counter() - t0)

    # Every ended session archived already: the steady state of reconciliation.
    t0 = time.perf_counter()
    queued = pipeline.reconcile()
    first_ms = (time.perf_counter() - t0) * 1000
    with state.write() as db:
        db.execute("UPDATE sessions SET state = 'archived', done_at = 1800000000 WHERE state != 'active'")
        db.execute("DELETE FROM items")
    reconcile_times = []
    for _ in range(9):
        t0 = time.perf_counter()
        assert pipeline.reconcile() == 0
        reconcile_times.append(time.perf_counter() - t0)
    client.close()
    state.close()
    poll_ms = _p50_ms(poll_times)
    reconcile_ms = _p50_ms(reconcile_times)
    amortized = reconcile_ms * POLL_INTERVAL / RECONCILE_INTERVAL
    return {
        "steady_poll_p50_ms": poll_ms,
        "reconcile_p50_ms": reconcile_ms,
        "reconcile_amortized_per_poll_ms": round(amortized, 2),
        "ratio_to_poll": round(amortized / poll_ms, 3),
        "first_reconcile_ms": round(first_ms, 1),
        "first_reconcile_queued": queued,
        "ended": ended_count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--active", type=int, default=10_000)
    parser.add_argument("--ended", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_upstream(Path(args.child[0]), Path(args.child[1]))
        return 0
    rnd = random.Random(11)
    base_ms = 1_790_000_000_000
    active = [make_session(rnd, base_ms + i * 250) for i in range(args.active)]
    for entry in active:
        entry["status"] = "running"
    ended = [make_session(rnd, base_ms - 3_600_000 + i * 250) for i in range(args.ended)]
    for entry in ended:
        entry["status"] = "exited"
    with tempfile.TemporaryDirectory(prefix="archiver-reconcile-") as tmp:
        workdir = Path(tmp)
        (workdir / "active.json").write_bytes(json.dumps({"sessions": active}).encode())
        (workdir / "all.json").write_bytes(json.dumps({"sessions": active + ended}).encode())
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", str(workdir / "active.json"), str(workdir / "all.json")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            upstream = child.stdout.readline().strip()
            (workdir / "run").mkdir()
            result = measure(upstream, workdir / "run", args.ended)
        finally:
            child.kill()
            child.wait()
    result.update(
        {
            "active": args.active,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(),
        }
    )
    ok = result["ratio_to_poll"] <= BUDGET_RATIO and result["first_reconcile_queued"] == args.ended
    print(json.dumps(result, indent=2))
    print(
        f"{'PASS' if ok else 'FAIL'}: reconciliation every {RECONCILE_INTERVAL:.0f} s adds "
        f"{result['reconcile_amortized_per_poll_ms']} ms per {POLL_INTERVAL:.0f} s poll "
        f"({result['ratio_to_poll']:.1%} of the steady poll, budget <= {BUDGET_RATIO:.0%})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
