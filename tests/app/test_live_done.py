"""Issue 25's "done when", with the real daemon (`archiver run` in a subprocess) against the fake: logs gone at
termination, every follow stream cut once mid-line, one kill -9 while the sessions run, sessions ending
normally and by crash: every session's archived log holds exactly the fake's lines, in order, once."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver.fake import FakeClock, FakeService
from archiver.fake.logs import render_ndjson
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_manifest
from archiver.live.segment import segment_file_name
from archiver.live.store import DIR_NAME
from archiver.live.table import DB_NAME
from archiver.store import open_store
from tests.support import ARCHIVER, free_port, wait_until

pytestmark = pytest.mark.slow  # the real daemon, a kill -9 and a restart: `make test-slow`, which CI runs

TOKEN = "done-when-token"
SESSIONS = 6


class Daemon:
    """`archiver run` against the fake and a directory store, its output in a log file."""

    def __init__(self, fake: FakeService, tmp: Path) -> None:
        self.fake = fake
        self.tmp = tmp
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        args = [
            ARCHIVER, "run", "--api-url", self.fake.base_url, "--store", (self.tmp / "archive").as_uri(),
            "--state-dir", str(self.tmp / "state"), "--web.listen-address", f"127.0.0.1:{self.port}",
            "--poll-interval", "0.3s", "--reconcile-interval", "10s", "--log.level", "info",
        ]  # fmt: skip
        with (self.tmp / f"daemon-{self.runs}.log").open("wb") as log:
            env = {**os.environ, "ARCHIVER_API_TOKEN": TOKEN}
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("daemon-*.log")))


def captured_lines(state_dir: Path) -> dict[str, int]:
    """Lines each session's capture holds (read beside the daemon, read-only): a segment's lines
    file where it has one (its checkpointed row is only a resume point, rewritten now and then),
    else its row (a sealed segment keeps its lines in the seal)."""
    path = state_dir / DIR_NAME / DB_NAME
    if not path.is_file():
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)) as db:
        try:
            rows = db.execute("SELECT key, idx, session_id, lines FROM segments").fetchall()
        except sqlite3.OperationalError:  # the table is being created
            return {}
    held: dict[str, int] = {}
    for key, index, sid, lines in rows:
        with contextlib.suppress(FileNotFoundError):
            lines = (state_dir / DIR_NAME / segment_file_name(key, index)).read_bytes().count(b"\n")
        held[sid] = held.get(sid, 0) + int(lines)
    return held


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[FakeService, Daemon]]:
    (tmp_path / "archive").mkdir()
    clock = FakeClock(1_700_000_000, time_scale=10.0)
    with FakeService((TOKEN,), clock=clock, log_lines=60, quirks={"logs_gone_at_termination": True}) as fake:
        daemon = Daemon(fake, tmp_path)
        try:
            yield fake, daemon
        finally:
            daemon.kill()


def test_logs_gone_cut_streams_and_a_kill_9_still_archive_every_line_exactly_once(
    setup: tuple[FakeService, Daemon], tmp_path: Path
) -> None:
    fake, daemon = setup
    state_dir = tmp_path / "state"
    fake.set_fault("GET /logs", kind="cut", after=450, per_session=1, follow_only=True)
    sids = [fake.add_session(TOKEN, id=f"done-{i}", crashed=i % 2 == 1) for i in range(SESSIONS)]
    daemon.start()

    def cut_and_kept() -> bool:
        assert daemon.alive(), daemon.logs()[-3000:]
        held = captured_lines(state_dir)
        return fake.faults_fired("GET /logs").get("cut", 0) == SESSIONS and all(held.get(s, 0) > 5 for s in sids)

    wait_until(cut_and_kept, timeout=60.0, message="every stream cut once and some lines kept")
    at_kill = captured_lines(state_dir)
    daemon.kill()  # SIGKILL while every session runs
    fake.advance(8.0)  # lines written while no daemon follows
    daemon.start()
    wait_until(
        lambda: all(n > at_kill[s] + 4 for s, n in captured_lines(state_dir).items()),
        timeout=60.0,
        message="the captures resumed after the restart",
    )
    for sid in sids:
        fake.end_session(TOKEN, sid)  # "dead" for the crashed ones, "exited" for the rest

    store = open_store((tmp_path / "archive").as_uri())

    def manifests() -> dict[str, Manifest] | None:
        assert daemon.alive(), daemon.logs()[-3000:]
        found = {}
        for sid in sids:
            instance = keys.instance_name(int(fake.session(TOKEN, sid).created * 1000))
            key = keys.manifest_key(store.prefix, sid, instance)
            if store.head(key) is None:
                return None
            found[sid] = parse_manifest(b"".join(store.iter_bytes(key)))
        return found

    archived = wait_until(manifests, timeout=90.0, message="every session archived")
    daemon.kill(signal.SIGTERM)
    for sid, manifest in archived.items():
        logs = [item for item in manifest.items if item.kind == "logs"]
        assert [(i.outcome, i.capture) for i in logs] == [("archived", "complete")], sid
        assert logs[0].key is not None
        body = gzip.decompress(b"".join(store.iter_bytes(logs[0].key)))
        assert body == render_ndjson(fake.log_lines(TOKEN, sid)), sid
        assert manifest.last_status == ("dead" if sid.endswith(("1", "3", "5")) else "exited")
    assert {e.status for e in fake.oracle.ended()} == {"dead", "exited"}
    log_text = daemon.logs()
    assert "follow stream ended: cut" in log_text and TOKEN not in log_text
