"""`archiver demo`: fake service with traffic, a local archive and the daemon in one process, and a status line."""

from __future__ import annotations

import logging
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from archiver.app import logs as logsetup
from archiver.app import process
from archiver.app.daemon import Daemon
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.errors import ArchiverError
from archiver.fake import FakeService
from archiver.layout.manifest import parse_manifest
from archiver.store import open_store
from archiver.web.webconfig import load_web_config

DEMO_TOKEN = "demo-token"
#: Real-time retention of the demo's fake service: short, so deadlines visibly tick down.
DEMO_RETENTION = 300.0
DEMO_ARTIFACT_PATHS = ("/var/log/game", "/srv/replays", "/srv/crash")


@dataclass(frozen=True, slots=True)
class DemoOptions:
    archive_dir: Path = Path("demo-archive")
    state_dir: Path = Path(".archiver-demo-state")
    listen: tuple[str, int] = ("127.0.0.1", 9877)
    duration: float | None = None
    #: Sessions the traffic generator starts per minute, and how long they run (seconds).
    rate_per_min: float = 20.0
    min_duration: float = 15.0
    max_duration: float = 45.0
    crash_ratio: float = 0.25
    status_every: float = 5.0
    #: How to invoke this program again in the printed hints (`.venv/bin/archiver` under make).
    program: str = "archiver"
    #: Exporter-toolkit web config (TLS, basic auth) of the /metrics server and the browser.
    web_config_file: Path | None = None
    #: Only warnings by default: the status line is the demo's output.
    log_format: str = "logfmt"
    log_level: str = "warn"


@dataclass(frozen=True, slots=True)
class Status:
    active: int
    players: int
    ended: int
    archived: int
    pending_fetch: int
    pending_upload: int
    next_deadline_in: float | None

    def line(self) -> str:
        deadline = f"{self.next_deadline_in:.0f}s" if self.next_deadline_in is not None else "-"
        return (
            f"active {self.active:3d} | players {self.players:3d} | ended {self.ended:3d} | "
            f"archived {self.archived:3d} | pending fetch {self.pending_fetch:2d} upload {self.pending_upload:2d} | "
            f"next deadline {deadline}"
        )


def read_status(daemon: Daemon, now: float) -> Status:
    """The demo's status from the daemon's own metrics registry and last poll (what /metrics says)."""
    value = daemon.registry.get_sample_value

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return value(name, labels or {}) or 0.0

    deadline = value("archiver_next_fetch_deadline_timestamp_seconds", {})
    summary = daemon.last_poll_summary
    return Status(
        active=summary.sessions,
        players=summary.players,
        ended=int(sample("archiver_sessions_ended_total")),
        archived=int(sample("archiver_completion_delay_seconds_count")),
        pending_fetch=int(sample("archiver_pending_items", {"stage": "fetch"})),
        pending_upload=int(sample("archiver_pending_items", {"stage": "upload"})),
        next_deadline_in=max(0.0, deadline - now) if deadline else None,
    )


def _port_free(host: str, port: int) -> bool:
    if port == 0:
        return True
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def demo_settings(options: DemoOptions, api_url: str) -> Settings:
    host, port = options.listen
    # A busy default port is no reason to fail a first run: take any free one and say where.
    listen = (host, port if _port_free(host, port) else 0)
    return Settings(
        api_url=api_url,
        api_token=Token(DEMO_TOKEN),
        store=options.archive_dir.resolve().as_uri(),
        listen=listen,
        state_dir=options.state_dir,
        poll_interval=1.0,
        retention=DEMO_RETENTION,
        deadline_margin=30.0,
        artifact_paths=DEMO_ARTIFACT_PATHS,
        max_sessions=10000,
        fetch_workers=4,
        upload_workers=2,
        web_config_file=options.web_config_file,
        log_format=options.log_format,
        log_level=options.log_level,
    )


def run_demo(
    options: DemoOptions,
    out: TextIO,
    *,
    stop: threading.Event | None = None,
    is_tty: bool = False,
    clock: Callable[[], float] = time.time,
    early: Iterable[logging.LogRecord] = (),
) -> Status:
    """Run until `stop` is set or `duration` passes; returns the final status (printed as a summary).

    ``early``: log records kept while the command line was read (deprecated option names), written
    once logging is set up."""
    stop = stop or threading.Event()
    web_config = load_web_config(options.web_config_file) if options.web_config_file else None
    options.archive_dir.mkdir(parents=True, exist_ok=True)
    logsetup.configure(options.log_format, options.log_level, secrets=[DEMO_TOKEN], stream=out, early=early)

    with FakeService([DEMO_TOKEN], retention=DEMO_RETENTION) as fake:
        # A few short matches so the first archives appear within seconds, one of them a crash.
        for i, (lifetime, crashed) in enumerate([(4.0, False), (6.0, True), (9.0, False)]):
            fake.add_session(
                DEMO_TOKEN,
                location=("eu-west-1", "us-east-1", "ap-southeast-1")[i],
                labels={"mode": "duel", "tournament": "demo-cup"},
                players=[f"player-{i}-{n}" for n in range(i + 1)],
                crashed=crashed,
                lifetime=lifetime,
            )
        fake.start_traffic(
            DEMO_TOKEN,
            rate_per_min=options.rate_per_min,
            min_duration=options.min_duration,
            max_duration=options.max_duration,
            crash_ratio=options.crash_ratio,
        )
        settings = demo_settings(options, fake.base_url)
        # The demo runs the daemon: it starts as `archiver run` does (the fake's ends of the follow
        # streams are in this process too, a few with the demo's traffic).
        applied = process.apply(follows=settings.follow_cap)
        daemon = Daemon(settings, list_digests=applied.list_digests)
        daemon.start()
        # The evidence browser over the same archive, next to /metrics (the port after it when free).
        host, port = options.listen
        browse_port = port + 1 if port and port < 65535 and _port_free(host, port + 1) else 0
        browse_store = open_store(options.archive_dir.resolve().as_uri())
        browser = BrowseServer((host, browse_port), BrowseApp(browse_store), web_config=web_config)
        browser.start()
        started = clock()
        out.write(
            f"fake session hosting service: {fake.base_url} (token {DEMO_TOKEN}, retention {DEMO_RETENTION:.0f}s)\n"
            f"metrics:  {daemon.server.url}/metrics\n"
            f"browser:  {browser.url}/sessions\n"
            f"archive:  {options.archive_dir.resolve()}\n"
            f"{'Ctrl-C to stop' if options.duration is None else f'stopping after {options.duration:.0f}s'}\n"
        )
        out.flush()
        status = read_status(daemon, clock())
        last_plain = float("-inf")
        try:
            while not stop.wait(0.5):
                now = clock()
                status = read_status(daemon, now)
                if is_tty:
                    out.write("\r\x1b[2K" + status.line())
                    out.flush()
                elif now - last_plain >= options.status_every:
                    out.write(status.line() + "\n")
                    out.flush()
                    last_plain = now
                if options.duration is not None and now - started >= options.duration:
                    break
        finally:
            fake.stop_traffic(DEMO_TOKEN)
            browser.stop()
            browse_store.close()
            daemon.stop()
            status = read_status(daemon, clock())
    if is_tty:
        out.write("\n")
    out.write(summary(status, options, options.program))
    out.flush()
    return status


def newest_archived(archive_dir: Path) -> str | None:
    """The id of the most recently archived session in the demo store, for the hints."""
    found = [*(archive_dir / "sessions").glob("*/manifest.json"), *(archive_dir / "sessions").glob("*/*/manifest.json")]
    manifests = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    for path in manifests:
        try:
            return parse_manifest(path.read_bytes()).session_id
        except (OSError, ArchiverError):
            continue
    return None


def summary(status: Status, options: DemoOptions, program: str = "archiver") -> str:
    store = options.archive_dir.resolve().as_uri()
    sid = newest_archived(options.archive_dir)
    shown = shlex.quote(sid) if sid else "SESSION_ID"
    return (
        f"\nsummary: {status.ended} sessions ended, {status.archived} archived, "
        f"{status.pending_fetch + status.pending_upload} items still pending\n"
        "next, try:\n"
        f"  {program} ls --store {store}\n"
        f"  {program} show {shown} --store {store}\n"
        f"  {program} logs {shown} --store {store}\n"
        f"  {program} get {shown} --out ./evidence --extract --store {store}\n"
        f"  {program} browse --store {store}   (the same archive in a web browser)\n"
        f"(the pipeline state is kept in {options.state_dir}; a later demo resumes it)\n"
    )
