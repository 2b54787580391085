"""Benchmark of live log capture (issue 25): CPU and memory of following 1,000 and 5,000 sessions, and the
10,000-session poll cycle with and without following, in the same run.

Usage: python benchmarks/follow.py [--streams 1000,5000] [--window 20] [--polls 12] [--json out.json]

Three kinds of process, each on its own:
- a stand-in upstream for follow streams (asyncio, no archiver code): every `GET /logs` gets a
  chunked NDJSON answer with 4 boot lines at once and then one ~110-byte line every 2 s, the
  streams' lines spread evenly over the 2 s (a timer tick every 50 ms writes the lines due);
- the scrape benchmark's stand-in upstream for `GET /session` (`scrape.py`: realistic 10,000-session
  bodies, ~2 % changing per poll, held in memory);
- the measured process: `archiver.live.engine.LiveCapture` with a real capture store in a
  temporary state dir (files, checkpoints, syncfs), as `archiver run` holds it.

Following N sessions: the measured process starts with nothing followed (RSS noted), is handed N
sessions, waits until every stream delivered its boot lines plus a warm-up, then measures over
`--window` seconds its CPU time (all threads: the loop, the checkpoints) and its RSS at the end.
Reported: cores, cores per 1,000 followed sessions, and RSS per followed session (the increase
over the process before it followed anything, divided by N).

The poll cycle: the measured process runs the daemon's poll path (Poller.poll_once over loopback,
SnapshotRenderer.render, as `scrape.py` and `sharded.py` measure it), polls 0.5 s apart, in these
conditions:
- no engine: nothing followed (half of these polls before following starts, half after it ends);
- then, while 5,000 sessions are followed, one poll of each in turn, `--polls` times:
  - parked: the stand-in follow upstream is stopped (SIGSTOP) and the engine's loop parked through
    the gap before the poll and the poll: the same process holding the same 5,000 connections,
    following nothing. This is "without following" measured alternately with the others, so the
    shared machine's changing load falls on all of them alike; the stand-in, which in production
    is the remote service, adds no load of its own;
  - following, paused: the followers run between polls and the poll runs inside
    `LiveCapture.paused()`, as the daemon does it;
  - following, unpaused: the followers run during the poll too (the GIL is shared), for the record.
The budget compares "following, paused" with "parked"; "no engine" is shown beside them.
Wall times include entering the pause; the poll thread's own CPU time and the CPU the process's
other threads took during the poll are reported too (a loaded machine moves wall times far more).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import scrape  # noqa: E402  (the session list bodies, their stand-in upstream, the p50 helper)

LINE_EVERY = 2.0
TICK = 0.05
BOOT_LINES = 4
POLL_SESSIONS = 10_000
POLL_STREAMS = 5_000
BUDGET_CORES_5000 = 0.5
BUDGET_RSS_MB_5000 = 150.0
BUDGET_POLL_INCREASE = 0.10
#: The poll-cycle conditions (see the module docstring).
CONDITIONS = ("first", "no_engine", "parked", "following_paused", "following_unpaused")
#: Seconds between two measured polls.
GAP = 0.5


def rss_mb() -> float:
    """Current resident set of this process, MB (VmRSS, not the peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the stand-in follow upstream -------------------------------------------------------------------


def child_server() -> None:
    """Holds every follow stream asked of it and writes each one a line every LINE_EVERY seconds."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)

    class Stream(asyncio.Protocol):
        __slots__ = ("head", "lines", "transport")

        def __init__(self) -> None:
            self.head = b""
            self.lines = 0
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if self.head is None:
                return
            self.head += data
            if b"\r\n\r\n" in self.head:
                self.head = None  # type: ignore[assignment]
                assert self.transport is not None
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                self.write(BOOT_LINES)
                slot = next(counter) % len(slots)
                slots[slot].add(self)
                streams[self] = slot

        def write(self, count: int) -> None:
            body = b"".join(self.line() for _ in range(count))
            assert self.transport is not None
            self.transport.write(b"%x\r\n%s\r\n" % (len(body), body))

        def line(self) -> bytes:
            self.lines += 1
            n = self.lines
            text = f"[{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}.{n % 1000:03d}] INFO  kill: "
            text += f"player-{n % 9973:04x} -> player-{n * 7 % 9973:04x} (rifle) tick {n}"
            return json.dumps({"streamType": 1, "line": text}).encode() + b"\n"

        def connection_lost(self, exc: Exception | None) -> None:
            slot = streams.pop(self, None)
            if slot is not None:
                slots[slot].discard(self)

    # Each stream writes when its slot comes round: streams are spread evenly over LINE_EVERY.
    slots: list[set[Stream]] = [set() for _ in range(int(LINE_EVERY / TICK))]
    streams: dict[Stream, int] = {}
    counter = itertools.count()

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        start, i = loop.time(), 0
        while True:
            for stream in list(slots[i % len(slots)]):
                stream.write(1)
            i += 1
            await asyncio.sleep(max(0.0, start + i * TICK - loop.time()))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Stream, "127.0.0.1", 0, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"url": f"http://127.0.0.1:{port}"}), flush=True)
        ticker = loop.create_task(tick())
        await loop.run_in_executor(None, sys.stdin.readline)
        ticker.cancel()
        print(json.dumps({"cpu_s": cpu_seconds(), "streams": len(streams)}), flush=True)

    asyncio.run(main())


# --- the measured process ---------------------------------------------------------------------------


def _engine(url: str, state: Path, streams: int) -> Any:
    from archiver.config.credentials import Token
    from archiver.live.engine import LiveCapture
    from archiver.live.store import CaptureStore

    return LiveCapture(url, Token("benchmark"), CaptureStore(state), max_streams=streams)


def _follow(engine: Any, streams: int, *, timeout: float = 120.0) -> float:
    """Hand `streams` sessions to the engine; seconds until every stream brought its boot lines."""
    base = 1_760_000_000_000
    keys = [f"{base + i}:bench-{i}" for i in range(streams)]
    t0 = time.monotonic()
    engine.update(keys)
    while engine.stats().lines < streams * BOOT_LINES:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"only {engine.stats().lines} lines after {timeout}s")
        threading.Event().wait(0.1)
    return time.monotonic() - t0


def child_follower(url: str, streams: int, window: float, warmup: float) -> None:
    """Follow `streams` sessions of the stand-in and measure CPU and RSS (see the module docstring)."""
    from archiver.app import process

    process.apply(follows=streams)  # as `archiver run` does at start-up, with --follow-logs-max streams
    with tempfile.TemporaryDirectory(prefix="archiver-follow-") as state:
        engine = _engine(url, Path(state), streams)
        engine.start()
        threading.Event().wait(1.0)
        base_rss = rss_mb()
        established_s = _follow(engine, streams)
        threading.Event().wait(warmup)
        lines0, c0, t0 = engine.stats().lines, cpu_seconds(), time.monotonic()
        threading.Event().wait(window)
        c1, t1, lines1 = cpu_seconds(), time.monotonic(), engine.stats().lines
        end_rss = rss_mb()
        stats = engine.stats()
        engine.stop()
    cores = (c1 - c0) / (t1 - t0)
    print(
        json.dumps(
            {
                "streams": streams,
                "followed": stats.followed,
                "established_s": established_s,
                "cores": cores,
                "cores_per_1000": cores / (streams / 1000),
                "lines_per_s": (lines1 - lines0) / (t1 - t0),
                "rss_base_mb": base_rss,
                "rss_mb": end_rss,
                "rss_per_stream_kib": (end_rss - base_rss) * 1024 / streams,
                "rss_increase_mb": end_rss - base_rss,
                "reopens": {k: v for k, v in stats.ends.items() if v},
            }
        ),
        flush=True,
    )


def child_polls(upstream: str, follow_url: str, polls: int, streams: int, server_pid: int) -> None:
    """The 10k poll cycle without following and while following `streams` (the conditions: the module docstring)."""
    from archiver.app import process

    applied = process.apply(follows=streams)  # as `archiver run` does at start-up
    from archiver.exporter.exposition import SnapshotRenderer
    from archiver.exporter.poller import Poller
    from archiver.upstream.api import SessionHostClient, Token
    from archiver.upstream.listparser import SessionListParser

    client = SessionHostClient.connect(upstream, Token("benchmark"))
    parser = SessionListParser(digests=applied.list_digests)
    poller = Poller(client, interval=10.0, on_result=lambda r: None, parser=parser)
    renderer = SnapshotRenderer(max_sessions=10**6, label_allowlist=["mode", "tournament"])
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in CONDITIONS}

    def measure(name: str, pause: Any) -> None:
        """One poll cycle: wall time (entering the pause included), the poll thread's CPU, and the
        CPU the process's other threads (the followers) took meanwhile."""
        gap = threading.Event()
        gap.wait(GAP)  # polls are seconds apart in the daemon: the followers run in between
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        with pause():
            result = poller.poll_once()
            renderer.render(result.sessions, result.families, now=result.started_at, delta=result.delta)
        wall, cpu, everything = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
        if result.errors:
            raise RuntimeError(f"poll failed: {result.errors}")
        samples[name].append((wall, cpu, everything - cpu))

    measure("first", contextlib.nullcontext)  # the first poll parses and renders everything
    for _ in range(polls // 2):
        measure("no_engine", contextlib.nullcontext)
    with tempfile.TemporaryDirectory(prefix="archiver-follow-") as state:
        engine = _engine(follow_url, Path(state), streams)
        engine.start()
        _follow(engine, streams)
        threading.Event().wait(2.0)
        # One poll of each condition in turn, so the machine's changing load falls on all alike.
        for _ in range(polls):
            with engine.paused():
                os.kill(server_pid, signal.SIGSTOP)
                try:
                    measure("parked", contextlib.nullcontext)
                finally:
                    os.kill(server_pid, signal.SIGCONT)
            measure("following_paused", engine.paused)
            measure("following_unpaused", contextlib.nullcontext)
        engine.stop()
        engine.store.close()
    for _ in range(polls - polls // 2):
        measure("no_engine", contextlib.nullcontext)
    del samples["first"]
    results = {
        name: {
            "p50_ms": scrape.p50_ms([w for w, _, _ in values]),
            "cpu_p50_ms": scrape.p50_ms([c for _, c, _ in values]),
            "others_cpu_p50_ms": scrape.p50_ms([o for _, _, o in values]),
            "polls": len(values),
            "walls_ms": [round(w * 1000, 1) for w, _, _ in values],
        }
        for name, values in samples.items()
    }
    print(json.dumps(results), flush=True)


# --- the parent -------------------------------------------------------------------------------------


def start_server() -> tuple[subprocess.Popen[str], str]:
    """The stand-in follow upstream in a process of its own, and its URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if not ready:
        raise RuntimeError(f"the stand-in follow upstream exited with {proc.wait()}")
    return proc, json.loads(ready)["url"]


def run_once(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1000,5000", help="comma-separated follow stream counts")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady following measured")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of following before measuring")
    parser.add_argument("--polls", type=int, default=12, help="poll cycles measured per condition")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--child", choices=("server", "follower", "polls"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "server":
        child_server()
        return 0
    if args.child == "follower":
        child_follower(args.url, int(args.streams), args.window, args.warmup)
        return 0
    if args.child == "polls":
        child_polls(args.upstream, args.url, args.polls, int(args.streams), int(args.server_pid))
        return 0

    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()
    server, url = start_server()
    following = []
    for count in (int(s) for s in args.streams.split(",") if s):
        print(f"following {count:,} sessions ...", file=sys.stderr, flush=True)
        following.append(
            run_once(["--child", "follower", "--url", url, "--streams", str(count), "--window", str(args.window),
                      "--warmup", str(args.warmup)])
        )  # fmt: skip
    print(f"poll cycle at {POLL_SESSIONS:,} sessions with and without following {POLL_STREAMS:,} ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="archiver-bench-") as tmp:
        polls = 4 * args.polls + 2
        subprocess.run(
            [sys.executable, str(HERE / "scrape.py"), "--child", "generate", "--sessions", str(POLL_SESSIONS),
             "--paths", tmp, "--churn", "random", "--polls", str(polls)],
            check=True,
        )  # fmt: skip
        paths = scrape.variant_paths(Path(tmp), POLL_SESSIONS, polls)
        upstream = scrape.Child(["--child", "upstream", "--polls", str(polls), "--paths", ",".join(map(str, paths))])
        cycle = run_once(["--child", "polls", "--upstream", upstream.ready["url"], "--url", url,
                          "--polls", str(args.polls), "--streams", str(POLL_STREAMS),
                          "--server-pid", str(server.pid)])  # fmt: skip
        upstream.finish()
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write("done\n")
    server.stdin.flush()
    server_end = json.loads(server.stdout.readline())
    server.wait(30)
    increase = cycle["following_paused"]["p50_ms"] / cycle["parked"]["p50_ms"] - 1
    against_no_engine = cycle["following_paused"]["p50_ms"] / cycle["no_engine"]["p50_ms"] - 1
    at_budget = next((r for r in following if r["streams"] == 5000), None)
    checks = {"poll cycle increase <= 10 %": increase <= BUDGET_POLL_INCREASE}
    if at_budget is not None:
        checks["5,000 streams <= 0.5 core"] = at_budget["cores"] <= BUDGET_CORES_5000
        checks["5,000 streams <= 150 MB"] = at_budget["rss_increase_mb"] <= BUDGET_RSS_MB_5000

    print(
        f"live capture benchmark, {started:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average at start {load[0]:.2f}"
    )
    print(f"{'streams':>8} {'cores':>7} {'core/1k':>8} {'lines/s':>8} {'RSS base':>9} {'RSS':>7} {'KiB/stream':>11}")
    for r in following:
        print(
            f"{r['streams']:>8,} {r['cores']:>7.3f} {r['cores_per_1000']:>8.3f} {r['lines_per_s']:>8.0f} "
            f"{r['rss_base_mb']:>8.1f}M {r['rss_mb']:>6.1f}M {r['rss_per_stream_kib']:>11.1f}"
        )
    for name, values in cycle.items():
        print(f"poll cycle {POLL_SESSIONS:,}, {name.replace('_', ' ')}: p50 {values['p50_ms']:.1f} ms, poll thread "
              f"CPU {values['cpu_p50_ms']:.1f} ms, other threads {values['others_cpu_p50_ms']:.1f} ms "
              f"({values['polls']} polls)")  # fmt: skip
    print("(other threads: the renderer's compression helper, and the followers while they run)")
    print(f"poll cycle while following {POLL_STREAMS:,} (paused during polls) against parked: {increase * 100:+.1f} %, "
          f"against no engine: {against_no_engine * 100:+.1f} %")  # fmt: skip
    print(f"stand-in follow upstream: {server_end['cpu_s']:.1f} s CPU in all")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": started.isoformat(),
                    "load": load,
                    "following": following,
                    "poll_cycle": cycle,
                    "checks": checks,
                },
                indent=2,
            )
        )
    print("all budgets met" if all(checks.values()) else "budgets missed")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
