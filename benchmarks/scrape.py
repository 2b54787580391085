"""Benchmark of the /metrics path (ARCHITECTURE.md §8): scrape latency, poll cycle and peak RSS per session count.

Usage: python benchmarks/scrape.py [--sessions 10000,50000] [--json out.json]

Each measured server runs in a fresh subprocess (so sizes do not pollute each other's RSS and the
client does not share a GIL with the server); this process is only the HTTP client (httpx, over
127.0.0.1). Per size:
(`scrape_servers.py` holds the children.)
- ours: a child runs the daemon's poll path (Poller.poll_once: SessionHostClient + the poller's
  SessionListParser, then SnapshotRenderer.render) against a stand-in upstream in another process
  serving realistic `GET /session` bodies over 127.0.0.1 (~2 % of sessions changing per poll), and
  serves the snapshots with archiver.exporter.metricsserver.MetricsServer;
- baseline: a child sets the same series on prometheus_client Gauges and serves them with
  prometheus_client's own start_http_server (gzip when the client asks, as Prometheus does).
Scrape times are request sent → last body byte received (no client-side decompression, which is the
scraper's cost and the same for both). Peak RSS is the child's ru_maxrss after polling and serving.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The measured processes (re-exported: sharded.py and follow.py use them through this module).
from scrape_servers import child_baseline, child_ours, child_static
from scrape_servers import child_upstream as child_upstream
from scrape_servers import maxrss_mb as maxrss_mb
from scrape_servers import p50_ms as p50_ms

IMAGES = (("demo-game", ("1.0.0", "1.1.0")), ("arena-shooter", ("2024.11.1", "2024.12.0")), ("racer", ("7",)))
LOCATIONS = ("eu-west-1", "us-east-1", "ap-southeast-1", "eu-central-1")
STATUSES = ("running",) * 18 + ("draining", "restarting")
MODES = ("duel", "ffa", "ranked", "casual")
#: Sessions whose labels change between two consecutive polls, and sessions replaced (ended + new).
CHANGED_FRACTION = 0.01
REPLACED_FRACTION = 0.01
BUDGETS = {
    10_000: {
        "gzip_p50_ms": 25.0,
        "identity_p50_ms": 10.0,
        "ratio": 30.0,
        "poll_p50_ms": 50.0,
        "floor_ratio": 1.5,
        "rss_mb": 80.0,
    },
    50_000: {"gzip_p50_ms": 150.0, "poll_p50_ms": 250.0, "floor_ratio": 1.5, "rss_mb": 300.0},
}
#: What Prometheus 3 sends (scrape/scrape.go, default scrape protocols); Prometheus 2.42 (Debian's,
#: `strings /usr/bin/prometheus`) sends `application/openmetrics-text;version=1.0.0,...;q=0.75,
#: text/plain;version=0.0.4;q=0.5,*/*;q=0.1`: both prefer OpenMetrics, so scrapes here get it.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


# --- data -------------------------------------------------------------------------------------------


def make_session(rnd: random.Random, created_ms: int) -> dict[str, Any]:
    """A list entry shaped like the real service's (labels as JSON strings, env with secrets)."""
    sid = "-".join(f"{rnd.getrandbits(bits):0{bits // 4}x}" for bits in (32, 16, 16, 16, 48))
    image, tags = rnd.choice(IMAGES)
    host = f"203.0.{rnd.randrange(113, 120)}.{rnd.randrange(1, 255)}"
    ports = {"7777/udp": rnd.randrange(20000, 30000), "27015/tcp": rnd.randrange(20000, 30000)}
    env = {
        "GAMEYE_SESSION_ID": sid,
        "GAMEYE_HOST": host,
        "GAMEYE_PORT_7777_UDP": str(ports["7777/udp"]),
        "MATCH_SECRET": f"{rnd.getrandbits(128):032x}",
        "LOG_LEVEL": "info",
    }
    return {
        "id": sid,
        "image": image,
        "tag": rnd.choice(tags),
        "location": rnd.choice(LOCATIONS),
        "host": host,
        "created": created_ms,
        "port": ports,
        "status": rnd.choice(STATUSES),
        "playerCount": rnd.randrange(0, 17) if rnd.random() > 0.02 else None,
        "enableMetrics": False,
        "labels": {
            "env": json.dumps(env),
            "tags": json.dumps({"mode": rnd.choice(MODES), "tournament": "winter-cup", "match": sid[:8]}),
            "gameye": json.dumps({"version": "1.2.1"}),
        },
    }


def write_variants(
    count: int, directory: Path, seed: int = 7, churn: str = "random", *, polls: int, lone_surrogate: bool = False
) -> list[Path]:
    """`polls + 1` session-list bodies, one per poll (the first poll renders everything), each ~2 %
    different from the previous one: player counts change at random, and sessions end either at
    random positions (`random`, the goal's case: every block of the exposition is touched) or oldest
    first (`oldest`, as matches of similar length do), while as many new ones start.

    The sequence only goes forward, as the service's list does: a session that ended never comes
    back. (Polls used to go back and forth over 6 bodies; from the second pass on, every session
    that came and went had been re-added at the tail of the exposition, so the "random" ends all
    fell in the last few blocks and the render measured a churn concentrated at the tail.)

    `lone_surrogate` gives the middle entry of every body a raw image label ending in half of a
    surrogate pair (a name cut in the middle of an emoji): msgspec refuses the JSON escape, the
    entry is left out of every poll, and the parser's way around it keeps the others' reuse."""
    rnd = random.Random(seed)
    base_ms = 1_760_000_000_000
    sessions = [make_session(rnd, base_ms + i * 250) for i in range(count)]
    next_created = base_ms + count * 250
    paths = []
    for v in range(polls + 1):
        if v:
            for entry in rnd.sample(sessions, max(1, int(count * CHANGED_FRACTION))):
                entry["playerCount"] = rnd.randrange(0, 17)
            replaced = max(1, int(count * REPLACED_FRACTION))
            if churn == "oldest":
                del sessions[:replaced]  # the list is in creation order: the oldest come first
                for _ in range(replaced):
                    next_created += 250
                    sessions.append(make_session(rnd, next_created))
            for index in rnd.sample(range(count), replaced) if churn == "random" else ():
                next_created += 250
                sessions[index] = make_session(rnd, next_created)
        if lone_surrogate:
            sessions[count // 2]["labels"]["note"] = "Zo\ud83d"
        path = directory / f"sessions-{count}-{v}.json"
        path.write_bytes(json.dumps({"sessions": sessions}).encode())
        paths.append(path)
    return paths


def variant_paths(directory: Path, count: int, polls: int) -> list[Path]:
    """The bodies `write_variants` wrote for `count` sessions and `polls` measured polls, in poll order."""
    return [directory / f"sessions-{count}-{v}.json" for v in range(polls + 1)]


# --- parent -----------------------------------------------------------------------------------------


def scrape_p50(client: httpx.Client, url: str, *, gzip: bool, samples: int, warmup: int = 3) -> tuple[float, int]:
    """Median of `samples` scrapes (after `warmup`), in ms, and the body size on the wire."""
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip" if gzip else "identity"}
    times: list[float] = []
    size = 0
    for i in range(warmup + samples):
        t0 = time.perf_counter()
        with client.stream("GET", url, headers=headers) as response:
            response.raise_for_status()
            size = sum(len(chunk) for chunk in response.iter_raw())
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return p50_ms(times), size


class Child:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark child {args[:2]} exited with {self.proc.wait()}")
        self.ready: dict[str, Any] = json.loads(line)

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        result: dict[str, Any] = json.loads(self.proc.stdout.readline())
        self.proc.wait(timeout=60)
        return result


def bench_size(count: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    generate = ["--child", "generate", "--sessions", str(count), "--paths", str(workdir), "--churn", args.churn]
    generate += ["--lone-surrogate"] if args.lone_surrogate else []
    subprocess.run([sys.executable, __file__, *generate, "--polls", str(args.polls)], check=True)
    paths = variant_paths(workdir, count, args.polls)
    common = ["--paths", ",".join(map(str, paths)), "--allowlist", args.allowlist]
    result: dict[str, Any] = {
        "sessions": count,
        "body_bytes": paths[0].stat().st_size,
        "upstream_reads_disk": args.upstream_reads_disk,
    }
    disk = ["--upstream-reads-disk"] if args.upstream_reads_disk else []
    upstream = Child(["--child", "upstream", "--polls", str(args.polls), *disk, *common])
    ours = Child(["--child", "ours", "--polls", str(args.polls), "--upstream", upstream.ready["url"], *common])
    # The floor serves the very bytes of one of our scrapes (identity and gzip, as sent).
    bodies = [workdir / f"static-{count}.om", workdir / f"static-{count}.om.gz"]
    with httpx.Client(timeout=120) as client:
        url = ours.ready["url"] + "/metrics"
        for path, encoding in zip(bodies, ("identity", "gzip"), strict=True):
            headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": encoding}
            with client.stream("GET", url, headers=headers) as response:
                path.write_bytes(b"".join(response.iter_raw()))
    static = Child(["--child", "static", "--paths", ",".join(map(str, bodies))])
    with httpx.Client(timeout=120) as client:
        url = ours.ready["url"] + "/metrics"
        floor_url = static.ready["url"] + "/metrics"
        # Interleaved rounds, ours then the floor, so both see the same machine load.
        rounds: dict[str, list[float]] = {"gzip": [], "identity": [], "static_gzip": [], "static_identity": []}
        for _ in range(args.rounds):
            for encoding in ("gzip", "identity"):
                gzip = encoding == "gzip"
                p50, result[f"{encoding}_bytes"] = scrape_p50(client, url, gzip=gzip, samples=args.samples)
                rounds[encoding].append(p50)
                p50, _ = scrape_p50(client, floor_url, gzip=gzip, samples=args.samples)
                rounds[f"static_{encoding}"].append(p50)
        for name, values in rounds.items():
            result[f"{name}_p50_ms"] = statistics.median(values)
        result["floor_ratio_gzip"] = result["gzip_p50_ms"] / result["static_gzip_p50_ms"]
        result["floor_ratio_identity"] = result["identity_p50_ms"] / result["static_identity_p50_ms"]
        # Sanity: the compressed body decodes to the identity body's size (httpx decodes it here).
        decoded = client.get(url, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}).content
        result["gzip_decodes"] = abs(len(decoded) - result["identity_bytes"]) < 4096
        result["openmetrics"] = decoded.rstrip().endswith(b"# EOF")
    static.finish()
    for path in bodies:
        path.unlink()
    result.update({k: v for k, v in ours.ready.items() if k != "url"})
    result["rss_mb"] = ours.finish()["maxrss_mb"]
    upstream.finish()

    if count <= args.baseline_max:
        base = Child(["--child", "baseline", *common])
        with httpx.Client(timeout=300) as client:
            url = base.ready["url"] + "/metrics"
            samples = args.baseline_samples
            result["baseline_gzip_p50_ms"], _ = scrape_p50(client, url, gzip=True, samples=samples, warmup=1)
            result["baseline_identity_p50_ms"], _ = scrape_p50(client, url, gzip=False, samples=samples, warmup=1)
        result["baseline_update_ms"] = base.ready["update_ms"]
        result["baseline_rss_mb"] = base.finish()["maxrss_mb"]
        result["ratio_gzip"] = result["baseline_gzip_p50_ms"] / result["gzip_p50_ms"]
        result["ratio_identity"] = result["baseline_identity_p50_ms"] / result["identity_p50_ms"]
    for path in paths:
        path.unlink()
    return result


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    budget = BUDGETS.get(result["sessions"], {})
    checks = {
        "gzip_p50_ms": ("gzip_p50_ms", lambda v, b: v <= b),
        "identity_p50_ms": ("identity_p50_ms", lambda v, b: v <= b),
        "ratio": ("ratio_gzip", lambda v, b: v >= b),
        "poll_p50_ms": ("poll_p50_ms", lambda v, b: v <= b),
        "floor_ratio": ("floor_ratio_gzip", lambda v, b: v <= b),
        "rss_mb": ("rss_mb", lambda v, b: v <= b),
    }
    out = {}
    for name, limit in budget.items():
        key, ok = checks[name]
        if key in result:
            out[name] = "PASS" if ok(result[key], limit) else "FAIL"
    return out


def print_table(results: list[dict[str, Any]]) -> None:
    rows = [
        ("scrape p50, gzip (ms)", "gzip_p50_ms", "gzip_p50_ms", "{:.1f}"),
        ("scrape p50, identity (ms)", "identity_p50_ms", "identity_p50_ms", "{:.1f}"),
        ("baseline p50, gzip (ms)", "baseline_gzip_p50_ms", None, "{:.1f}"),
        ("baseline p50, identity (ms)", "baseline_identity_p50_ms", None, "{:.1f}"),
        ("ratio baseline/ours, gzip", "ratio_gzip", "ratio", "{:.0f}x"),
        ("ratio baseline/ours, identity", "ratio_identity", None, "{:.0f}x"),
        ("static floor p50, gzip (ms)", "static_gzip_p50_ms", None, "{:.2f}"),
        ("static floor p50, identity (ms)", "static_identity_p50_ms", None, "{:.2f}"),
        ("ours / floor, gzip", "floor_ratio_gzip", "floor_ratio", "{:.2f}x"),
        ("ours / floor, identity", "floor_ratio_identity", None, "{:.2f}x"),
        ("poll cycle p50 (ms)", "poll_p50_ms", "poll_p50_ms", "{:.1f}"),
        ("  CPU time of the poll cycle p50 (ms)", "poll_cpu_p50_ms", None, "{:.1f}"),
        ("  GET /session, fetch + parse p50 (ms)", "list_p50_ms", None, "{:.1f}"),
        ("    SessionListParser.parse p50 (ms)", "parse_p50_ms", None, "{:.1f}"),
        ("  GET /metrics p50 (ms)", "metrics_fetch_p50_ms", None, "{:.1f}"),
        ("  render + gzip p50 (ms)", "render_p50_ms", None, "{:.1f}"),
        ("  block parts compressed per poll", "parts_share", None, "{:.0%}"),
        ("first poll, full render (ms)", "first_poll_ms", None, "{:.1f}"),
        ("peak RSS (MB)", "rss_mb", "rss_mb", "{:.1f}"),
        ("baseline peak RSS (MB)", "baseline_rss_mb", None, "{:.1f}"),
        ("body, identity / gzip (KB)", None, None, ""),
    ]
    header = f"{'':40}" + "".join(f"{r['sessions']:>22,}" for r in results)
    print(header)
    for label, key, budget_key, fmt in rows:
        cells = []
        for r in results:
            if key is None:
                cells.append(f"{r['identity_bytes'] // 1024} / {r['gzip_bytes'] // 1024}")
                continue
            if key not in r:
                cells.append("-")
                continue
            cell = fmt.format(r[key])
            budget = BUDGETS.get(r["sessions"], {}).get(budget_key or "")
            if budget is not None:
                cell += f" {verdicts(r)[budget_key]} ({'>=' if budget_key == 'ratio' else '<='}{budget:g})"  # type: ignore[index]
            cells.append(cell)
        print(f"{label:40}" + "".join(f"{c:>22}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="10000,50000", help="comma-separated session counts")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--samples", type=int, default=40, help="scrapes per measurement (>= 30)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of ours and the floor (median)")
    parser.add_argument("--polls", type=int, default=40, help="poll cycles measured per size")
    parser.add_argument("--baseline-max", type=int, default=10_000, help="largest size to run the baseline at")
    parser.add_argument("--baseline-samples", type=int, default=30)
    parser.add_argument("--allowlist", default="mode,tournament", help="session label allowlist")
    parser.add_argument(
        "--churn",
        choices=("random", "oldest"),
        default="random",
        help="which sessions end between polls: at random positions (default, the goals' case) or oldest first",
    )
    parser.add_argument(
        "--lone-surrogate",
        action="store_true",
        help="one entry of every list carries a lone surrogate escape (left out of every poll; the others keep reuse)",
    )
    parser.add_argument(
        "--upstream-reads-disk",
        action="store_true",
        help="the stand-in upstream reads each body from disk when asked (the older method)",
    )
    parser.add_argument(
        "--child", choices=("ours", "upstream", "baseline", "generate", "static"), help=argparse.SUPPRESS
    )
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    allowlist = [k for k in args.allowlist.split(",") if k]
    if args.child == "generate":
        write_variants(
            int(args.sessions), Path(args.paths), churn=args.churn, polls=args.polls, lone_surrogate=args.lone_surrogate
        )
        return 0
    if args.child:
        paths = [Path(p) for p in args.paths.split(",")]
        if args.child == "static":
            child_static(paths)
        elif args.child == "ours":
            child_ours(paths, args.polls, allowlist, args.upstream)
        elif args.child == "upstream":
            child_upstream(paths, args.polls, reads_disk=args.upstream_reads_disk)
        else:
            child_baseline(paths, allowlist)
        return 0

    sizes = [int(s) for s in args.sessions.split(",") if s]
    results = []
    with tempfile.TemporaryDirectory(prefix="archiver-bench-") as tmp:
        for count in sizes:
            print(f"measuring {count:,} sessions ...", file=sys.stderr, flush=True)
            results.append(bench_size(count, args, Path(tmp)))
    print(
        f"/metrics benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, churn: {args.churn}, "
        f"{'one lone-surrogate entry per list, ' if args.lone_surrogate else ''}"
        f"stand-in upstream: {'reads each body from disk' if args.upstream_reads_disk else 'bodies in memory'}"
    )
    print_table(results)
    failed = [f"{r['sessions']}: {k}" for r in results for k, v in verdicts(r).items() if v == "FAIL"]
    if args.json:
        for r in results:
            r["verdicts"] = verdicts(r)
        args.json.write_text(
            json.dumps({"date": datetime.datetime.now(datetime.UTC).isoformat(), "results": results}, indent=2)
        )
    print("all budgets met" if not failed else "budgets missed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
