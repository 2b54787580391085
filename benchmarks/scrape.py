"""Benchmark of the /metrics path (ARCHITECTURE.md §8): scrape latency, poll cycle and peak RSS per session count.

Usage: python benchmarks/scrape.py [--sessions 10000,50000] [--json out.json]

Each measured server runs in a fresh subprocess (so sizes do not pollute each other's RSS and the
client does not share a GIL with the server); this process is only the HTTP client (httpx, over
127.0.0.1). Per size:
- ours: a child runs the daemon's poll path (Poller.poll_once: SessionHostClient + the poller's
  SessionListParser, then SnapshotRenderer.render) against a stand-in upstream in another process
  serving realistic `GET /session` bodies over 127.0.0.1 (~2 % of sessions changing per poll), and
  serves the snapshots with archiver.exporter.httpserver.MetricsServer;
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
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
#: Issue 14's goal: scrape p50 within this factor of the same bytes served static.
FLOOR_GOAL = 1.5


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


def write_variants(count: int, directory: Path, seed: int = 7, churn: str = "random", *, polls: int) -> list[Path]:
    """`polls + 1` session-list bodies, one per poll (the first poll renders everything), each ~2 %
    different from the previous one: player counts change at random, and sessions end either at
    random positions (`random`, the goal's case: every block of the exposition is touched) or oldest
    first (`oldest`, as matches of similar length do), while as many new ones start.

    The sequence only goes forward, as the service's list does: a session that ended never comes
    back. (Polls used to go back and forth over 6 bodies; from the second pass on, every session
    that came and went had been re-added at the tail of the exposition, so the "random" ends all
    fell in the last few blocks and the render measured a churn concentrated at the tail.)"""
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
        path = directory / f"sessions-{count}-{v}.json"
        path.write_bytes(json.dumps({"sessions": sessions}).encode())
        paths.append(path)
    return paths


def variant_paths(directory: Path, count: int, polls: int) -> list[Path]:
    """The bodies `write_variants` wrote for `count` sessions and `polls` measured polls, in poll order."""
    return [directory / f"sessions-{count}-{v}.json" for v in range(polls + 1)]


def maxrss_mb() -> float:
    """Peak RSS of this process in MB. Linux keeps ru_maxrss across fork+exec, so a child reports at
    least its parent's RSS at fork time: the parent therefore stays small (it only runs httpx; the
    bodies are generated in a child of their own)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


# --- children ---------------------------------------------------------------------------------------


def child_upstream(paths: list[Path], polls: int, *, reads_disk: bool = False) -> None:
    """A stand-in upstream in a process of its own: `GET /session` answers the next body of the poll
    sequence, `GET /metrics` a count.

    Every body is in memory before the first poll, as a real service holds its sessions. Read from
    disk per request (as before 2026-11-24: `--upstream-reads-disk`), the first byte of a
    50,000-session body came ~28 ms after a request from a plain socket client (a 32 MB read into
    fresh pages); in the poll cycle that showed as only 2-8 ms more waiting at 50k (paired runs),
    and 4-11 ms more cycle at 10k: small, but this process's work, not the daemon's."""
    import http.server

    sequence = iter(range(len(paths)))
    last = 0
    bodies = [None if reads_disk else path.read_bytes() for path in paths]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            nonlocal last
            if self.path.startswith("/session"):
                last = next(sequence, last)
                body, ctype = bodies[last] or paths[last].read_bytes(), "application/json"
            else:
                body, ctype = b"# TYPE session_count untyped\nsession_count 1\n", "text/plain; version=0.0.4"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_port}"}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.readline()
    print(json.dumps({"maxrss_mb": maxrss_mb()}), flush=True)


def child_static(paths: list[Path]) -> None:
    """The floor: `http.server` (HTTP/1.1 keep-alive, as ours) writing prepared bytes, nothing else.

    `paths` are the identity and the gzip body of one of our scrapes (captured by the parent), so
    both servers send exactly the same bytes with the same headers' shape."""
    import http.server

    identity, gzipped = paths[0].read_bytes(), paths[1].read_bytes()
    content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
            body = gzipped if gzip else identity
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if gzip:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_port}"}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.readline()
    print(json.dumps({"maxrss_mb": maxrss_mb()}), flush=True)


def child_ours(paths: list[Path], polls: int, allowlist: list[str], upstream: str) -> None:
    """The daemon's poll path, exactly: Poller.poll_once (SessionHostClient over loopback, the
    poller's SessionListParser) then SnapshotRenderer.render, as Daemon._on_poll does."""
    from prometheus_client import CollectorRegistry

    from archiver.daemon import tune_allocator

    tune_allocator()  # as `archiver run` does at start-up

    from archiver.exporter.exposition import SnapshotRenderer
    from archiver.exporter.httpserver import MetricsServer
    from archiver.exporter.poller import METRICS, SESSIONS, Poller
    from archiver.exporter.selfmetrics import SelfMetrics
    from archiver.upstream.api import SessionHostClient, Token
    from archiver.upstream.models import STREAM_WINDOW, SessionList, SessionListParser

    parse_times: list[float] = []

    class TimedParser(SessionListParser):
        """Delegates to the production parser; only records how long its parse took (for a body
        parsed as it streams in, without the time spent waiting for its chunks)."""

        def parse(self, body: bytes | bytearray) -> SessionList:
            t0 = time.perf_counter()
            try:
                return super().parse(body)
            finally:
                parse_times.append(time.perf_counter() - t0)

        def parse_stream(self, chunks: Iterable[bytes], *, window: int = STREAM_WINDOW) -> SessionList:
            waited = 0.0

            def timed() -> Iterator[bytes]:
                nonlocal waited
                source = iter(chunks)
                while True:
                    t = time.perf_counter()
                    chunk = next(source, None)
                    waited += time.perf_counter() - t
                    if chunk is None:
                        return
                    yield chunk

            t0 = time.perf_counter()
            try:
                return super().parse_stream(timed(), window=window)
            finally:
                parse_times.append(time.perf_counter() - t0 - waited)

    client = SessionHostClient.connect(upstream, Token("benchmark"))
    poller = Poller(client, interval=10.0, on_result=lambda result: None, parser=TimedParser())
    renderer = SnapshotRenderer(max_sessions=10**6, label_allowlist=allowlist)
    fetch, metrics_fetch, render, total = [], [], [], []
    first_ms = 0.0
    first_parts = 0
    snapshot = None
    for i in range(1 + polls):
        t0 = time.perf_counter()
        result = poller.poll_once()
        t1 = time.perf_counter()
        snapshot = renderer.render(result.sessions, result.families, now=result.started_at, delta=result.delta)
        t2 = time.perf_counter()
        if result.errors:
            raise RuntimeError(f"poll failed: {result.errors}")
        durations = result.durations
        del result  # the renderer's cache holds the sessions from here on, as in the daemon
        if i == 0:
            first_ms = (t2 - t0) * 1000  # the first poll parses and renders every session
            parse_times.clear()
            first_parts = renderer.parts_built
            continue
        fetch.append(durations[SESSIONS])
        metrics_fetch.append(durations[METRICS])
        render.append(t2 - t1)
        total.append(t2 - t0)
    registry = CollectorRegistry()
    server = MetricsServer(
        ("127.0.0.1", 0),
        snapshot_source=lambda: snapshot,
        self_metrics=SelfMetrics(registry),
        health=lambda: (True, "ok"),
        ready=lambda: (True, "ok"),
        web_config=None,
    )
    server.start()
    print(
        json.dumps(
            {
                "url": server.url,
                "first_poll_ms": first_ms,
                "poll_p50_ms": _p50_ms(total),
                "list_p50_ms": _p50_ms(fetch),
                "parse_p50_ms": _p50_ms(parse_times),
                "metrics_fetch_p50_ms": _p50_ms(metrics_fetch),
                "render_p50_ms": _p50_ms(render),
                "polls": len(total),
                "renders": renderer.render_count,
                # Block parts compressed again per poll, as a share of all parts (the rest reused).
                "parts_share": (renderer.parts_built - first_parts) / len(total) / max(1, first_parts),
            }
        ),
        flush=True,
    )
    sys.stdin.readline()  # the parent scrapes, then says it is done
    print(json.dumps({"maxrss_mb": maxrss_mb()}), flush=True)
    server.stop()


def child_baseline(paths: list[Path], allowlist: list[str]) -> None:
    """The same series through prometheus_client Gauges, the way a direct-instrumentation exporter does."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from archiver.exporter.exposition import label_names_for
    from archiver.upstream.models import parse_session_list

    label_names = label_names_for(allowlist)
    registry = CollectorRegistry()
    info = Gauge("sessionhost_session_info", "i", ["session_id", "image", "tag", "location", "host"], registry=registry)
    created = Gauge("sessionhost_session_created_timestamp_seconds", "c", ["session_id"], registry=registry)
    players = Gauge("sessionhost_session_players", "p", ["session_id"], registry=registry)
    status = Gauge("sessionhost_session_status", "s", ["session_id", "status"], registry=registry)
    labels = Gauge("sessionhost_session_labels", "l", ["session_id", *label_names.values()], registry=registry)
    agg = Gauge("sessionhost_sessions", "a", ["location", "image", "tag", "status"], registry=registry)
    agg_players = Gauge("sessionhost_players", "a", ["location", "image", "tag"], registry=registry)
    upstream = Gauge("sessionhost_upstream_session_count", "u", registry=registry)
    exported = Gauge("archiver_sessions_exported", "e", registry=registry)

    sessions = parse_session_list(json.loads(paths[0].read_bytes())).sessions
    t0 = time.perf_counter()
    counts: dict[tuple[str, ...], int] = {}
    sums: dict[tuple[str, ...], int] = {}
    for s in sessions:
        info.labels(s.id, s.image, s.tag, s.location, s.host).set(1)
        created.labels(s.id).set(s.created_ms / 1000)
        if s.player_count is not None:
            players.labels(s.id).set(s.player_count)
        status.labels(s.id, s.status).set(1)
        labels.labels(s.id, *(s.labels.get(k, "") for k in label_names)).set(1)
        key = (s.location, s.image, s.tag, s.status)
        counts[key] = counts.get(key, 0) + 1
        sums[key[:3]] = sums.get(key[:3], 0) + (s.player_count or 0)
    for key, n in counts.items():
        agg.labels(*key).set(n)
    for key3, n in sums.items():
        agg_players.labels(*key3).set(n)
    upstream.set(len(sessions))
    exported.set(len(sessions))
    update_ms = (time.perf_counter() - t0) * 1000
    del sessions
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_port}", "update_ms": update_ms}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"maxrss_mb": maxrss_mb()}), flush=True)
    server.shutdown()


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
    return _p50_ms(times), size


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
        "--upstream-reads-disk",
        action="store_true",
        help="the stand-in upstream reads each body from disk when asked (the method before 2026-11-24)",
    )
    parser.add_argument(
        "--child", choices=("ours", "upstream", "baseline", "generate", "static"), help=argparse.SUPPRESS
    )
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    allowlist = [k for k in args.allowlist.split(",") if k]
    if args.child == "generate":
        write_variants(int(args.sessions), Path(args.paths), churn=args.churn, polls=args.polls)
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
