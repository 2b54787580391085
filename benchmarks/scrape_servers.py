"""The processes the /metrics benchmark (`scrape.py`) measures, each run in a child of its own: the
stand-in upstream, our daemon's poll path and server, the static floor, and the prometheus_client
baseline. `scrape.py --child NAME` starts one; each prints one JSON line when ready, and its peak RSS
once told (on stdin) that the measurement is done."""

from __future__ import annotations

import json
import resource
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import HTTPServer
from pathlib import Path
from typing import Any


def maxrss_mb() -> float:
    """Peak RSS of this process in MB. Linux keeps ru_maxrss across fork+exec, so a child reports at
    least its parent's RSS at fork time: the parent therefore stays small (it only runs httpx; the
    bodies are generated in a child of their own)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def serve_until_done(server: HTTPServer) -> None:
    """Serves in a thread: says where (one JSON line), and its peak RSS once stdin says it is done."""
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_port}"}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.readline()
    print(json.dumps({"maxrss_mb": maxrss_mb()}), flush=True)


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def child_upstream(paths: list[Path], polls: int, *, reads_disk: bool = False) -> None:
    """A stand-in upstream in a process of its own: `GET /session` answers the next body of the poll
    sequence, `GET /metrics` a count.

    Every body is in memory before the first poll, as a real service holds its sessions. Read from
    disk per request (`--upstream-reads-disk`, the older method), each large body's first byte waits
    for a read into fresh pages: small in the poll cycle, but this process's work, not the daemon's."""
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

    serve_until_done(http.server.HTTPServer(("127.0.0.1", 0), Handler))


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

    serve_until_done(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler))


def child_ours(paths: list[Path], polls: int, allowlist: list[str], upstream: str) -> None:
    """The daemon's poll path, exactly: Poller.poll_once (SessionHostClient over loopback, the
    poller's SessionListParser) then SnapshotRenderer.render, as Daemon._on_poll does."""
    from prometheus_client import CollectorRegistry

    from archiver.app import process

    applied = process.apply()  # as `archiver run` does at start-up (no live capture here)

    from archiver.exporter.exposition import SnapshotRenderer
    from archiver.exporter.metricsserver import MetricsServer
    from archiver.exporter.poller import METRICS, SESSIONS, Poller
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.upstream.api import SessionHostClient, Token
    from archiver.upstream.listparser import STREAM_WINDOW, SessionListParser
    from archiver.upstream.models import SessionList

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
    parser = TimedParser(digests=applied.list_digests)
    poller = Poller(client, interval=10.0, on_result=lambda result: None, parser=parser)
    renderer = SnapshotRenderer(max_sessions=10**6, label_allowlist=allowlist)
    fetch, metrics_fetch, render, total, cpu = [], [], [], [], []
    first_ms = 0.0
    first_parts = 0
    snapshot = None
    for i in range(1 + polls):
        t0, c0 = time.perf_counter(), time.process_time()
        result = poller.poll_once()
        t1 = time.perf_counter()
        snapshot = renderer.render(result.sessions, result.families, now=result.started_at, delta=result.delta)
        t2, c2 = time.perf_counter(), time.process_time()
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
        cpu.append(c2 - c0)
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
                "poll_p50_ms": p50_ms(total),
                # CPU time of the poll cycle (this process, every thread): what a loaded machine disturbs least.
                "poll_cpu_p50_ms": p50_ms(cpu),
                "list_p50_ms": p50_ms(fetch),
                "parse_p50_ms": p50_ms(parse_times),
                "metrics_fetch_p50_ms": p50_ms(metrics_fetch),
                "render_p50_ms": p50_ms(render),
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

    from archiver.exporter.families import label_names_for
    from archiver.upstream.sessionlist import parse_session_list

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
