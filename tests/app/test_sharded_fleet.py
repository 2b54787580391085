"""A fleet of 3 shards x 2 replicas (in-process daemons) against one fake and one directory store:
each replica group exports every active session exactly once, every ended session is archived
exactly once with the upstream's bytes, and losing a replica of each pair, then going from 3 to 4
shards mid-run, loses nothing and produces no conflict; two replicas compacting the index count
each archive once."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import httpx
import pytest

from archiver.app.daemon import Daemon
from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.config.sharding import Shard, shard_of
from archiver.fake import FakeService
from archiver.index.compact import compact
from archiver.index.ddl import ddl
from archiver.layout import keys
from archiver.layout.manifest import parse_index_entry, parse_manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retrieval.query import list_sessions
from archiver.store import ObjectStore, open_store
from archiver.store.file import FileStore
from archiver.upstream.api import SessionHostClient
from tests.fixtures_pipeline import FAST, FAST_POLICY, MISSING, REPLAY, TOKEN, Harness
from tests.support import wait_until

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

#: Replica 1 gives replica 0 a second's head start before a session's first fetch.
STAGGERED = dataclasses.replace(FAST, replica_stagger=1.0)
_SESSION_INFO = re.compile(r'^sessionhost_session_info\{[^}]*session_id="([^"]+)"', re.MULTILINE)


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with FakeService((TOKEN,)) as service:
        yield service


class Fleet:
    """In-process daemons sharing one fake and one store, each with its own state dir."""

    def __init__(self, fake: FakeService, root: Path) -> None:
        self.fake = fake
        self.root = root
        self.store_dir = root / "archive"
        self.store_dir.mkdir()
        self.daemons: dict[tuple[int, int, int], Daemon] = {}

    def start(self, shard: Shard, replicas: int, state_dir: str) -> Daemon:
        settings = Settings(
            api_url=self.fake.base_url,
            api_token=Token(TOKEN),
            store=self.store_dir.as_uri(),
            listen=("127.0.0.1", 0),
            state_dir=self.root / state_dir,
            poll_interval=0.25,
            reconcile_interval=1.0,
            artifact_paths=(REPLAY,),
            fetch_workers=2,
            upload_workers=1,
            shard=shard,
            replicas_per_shard=replicas,
        )

        def pipeline(s: Settings, client: SessionHostClient, metrics: SelfMetrics) -> Pipeline:
            store = open_store(s.require_store())
            state = StateDB.open(s.state_dir)
            return Pipeline(s, client, store, state, metrics, policy=FAST_POLICY, tuning=STAGGERED)

        client = SessionHostClient.connect(self.fake.base_url, Token(TOKEN), policy=FAST_POLICY)
        daemon = Daemon(settings, client=client, pipeline_factory=pipeline)
        daemon.start()
        self.daemons[(shard.index, shard.total, shard.replica)] = daemon
        return daemon

    def stop(self, key: tuple[int, int, int]) -> None:
        self.daemons.pop(key).stop(10.0)

    def stop_all(self) -> None:
        for key in list(self.daemons):
            self.stop(key)

    def exported_ids(self, daemon: Daemon) -> list[str]:
        body = httpx.get(f"{daemon.server.url}/metrics", timeout=10).text
        return _SESSION_INFO.findall(body)

    def total(self, name: str, labels: dict[str, str] | None = None) -> float:
        return sum(d.registry.get_sample_value(name, labels or {}) or 0.0 for d in self.daemons.values())


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until the fleet shows `check`; each look scrapes every daemon, so it looks every 100 ms."""
    wait_until(check, timeout=timeout, interval=0.1, message=what)


def archived_ids(store_dir: Path) -> dict[str, int]:
    """Session id → number of index entries (an instance archived twice would show two)."""
    counts: dict[str, int] = {}
    for path in (store_dir / "index").rglob("*.json"):
        entry = parse_index_entry(path.read_bytes())
        counts[entry.session_id] = counts.get(entry.session_id, 0) + 1
    return counts


def check_archives(fake: FakeService, store_dir: Path, ended: set[str]) -> None:
    """Exactly one archive per ended session, each holding the fake's very bytes."""
    counts = archived_ids(store_dir)
    assert counts == dict.fromkeys(ended, 1)
    for sid in ended:
        (manifest_path,) = (store_dir / "sessions" / sid).glob("*/manifest.json")
        manifest = parse_manifest(manifest_path.read_bytes())
        outcomes = {(i.kind, i.outcome) for i in manifest.items}
        assert outcomes == {("logs", "archived"), ("artifact", "archived")}, (sid, outcomes)
        (artifact,) = [i for i in manifest.items if i.kind == "artifact"]
        assert artifact.key is not None
        stored = (store_dir / artifact.key).read_bytes()
        assert stored == b"".join(fake.artifact_bytes(TOKEN, sid, REPLAY))


def test_three_shards_of_two_replicas_export_once_archive_once_and_survive_losses_and_a_reshard(
    fake: FakeService, tmp_path: Path
) -> None:
    fleet = Fleet(fake, tmp_path)
    live = {fake.add_session(TOKEN, id=f"match-{n}", files={REPLAY: 2000}) for n in range(24)}
    try:
        for index in range(3):
            for replica in range(2):
                fleet.start(Shard(index, 3, replica), 2, f"state-{index}-{replica}")

        # Exported once per replica group: the shards of one replica split the sessions exactly.
        def exports_match() -> bool:
            for replica in range(2):
                ids = [sid for i in range(3) for sid in fleet.exported_ids(fleet.daemons[(i, 3, replica)])]
                if sorted(ids) != sorted(live):
                    return False
            return True

        wait_for("every replica group to export every active session once", exports_match)
        assert fleet.total("archiver_shard_info", {"shard": "2", "total_shards": "3", "replica": "1"}) == 1.0

        ended: set[str] = set()
        for sid in sorted(live)[:8]:
            fake.end_session(TOKEN, sid)
            ended.add(sid)
        live -= ended
        wait_for("the first wave archived", lambda: set(archived_ids(fleet.store_dir)) == ended)
        # Both replicas of a pair ended each session: one archived it, the other recognised that.
        wait_for("the other replicas to recognise the archives",
                 lambda: fleet.total("archiver_archives_recognised_total") == len(ended))  # fmt: skip

        # One replica of each pair dies for good; sessions keep ending.
        for index in range(3):
            fleet.stop((index, 3, 1))
        wave = set(sorted(live)[:6])
        for sid in wave:
            fake.end_session(TOKEN, sid)
        live -= wave
        ended |= wave
        moved = {sid for sid in wave | live if shard_of(sid, 3) != shard_of(sid, 4)}
        assert moved & wave and moved & live  # the reshard moves in-flight and running sessions
        # Reshard mid-run, without waiting for that wave: 3 → 4 shards, the old state dirs kept.
        for index in range(3):
            fleet.stop((index, 3, 0))
        for index in range(4):
            fleet.start(Shard(index, 4, 0), 1, f"state-{index}-0")
        late = {fake.add_session(TOKEN, id=f"late-{n}", files={REPLAY: 1000}) for n in range(6)}
        live |= late
        wait_for(
            "the 4 shards to export every active session once",
            lambda: sorted(sid for d in fleet.daemons.values() for sid in fleet.exported_ids(d)) == sorted(live),
        )
        # The old owners handed their still-active sessions of other shards over (rows forgotten).
        for index in range(3):
            with sqlite3.connect(tmp_path / f"state-{index}-0" / "state.db") as db:
                active = [r[0] for r in db.execute("SELECT id FROM sessions WHERE state = 'active'")]
            assert active and all(shard_of(sid, 4) == index for sid in active)
        rest = set(sorted(live)[:10])
        for sid in rest:
            fake.end_session(TOKEN, sid)
        ended |= rest
        wait_for("every ended session archived", lambda: set(archived_ids(fleet.store_dir)) == ended, timeout=40)
        check_archives(fake, fleet.store_dir, ended)
        for daemon in fleet.daemons.values():
            assert daemon.pipeline is not None and daemon.pipeline.run_until_idle(20.0)
        assert fleet.total("archiver_items_total", {"kind": "artifact", "outcome": "conflict"}) == 0
        assert fleet.total("archiver_errors_total", {"where": "manifest"}) == 0
        assert not list(tmp_path.glob("state-*/conflicts/*"))
        # At most fetched twice (both replicas, or old and new owner), never more.
        assert fake.request_count("GET /artifacts") <= 2 * len(ended)
        index_counts_each_archive_once(fleet.store_dir, ended)
    finally:
        fleet.stop_all()


def index_counts_each_archive_once(store_dir: Path, ended: set[str]) -> None:
    """Shard 0's two replicas compact the archive at once, as their daemons would a day later (every
    hour and the day closed): `ls` and an engine's DDL count each archive once."""
    later = time.time() + 2 * 86400
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [
            pool.submit(compact, open_store(store_dir.as_uri()), since=later - 3 * 86400, until=later, now=later,
                        warn=print)
            for _ in range(2)
        ]  # fmt: skip
        reports = [run.result() for run in runs]
    assert all(r.skipped == 0 for r in reports) and max(r.entries for r in reports) == len(ended)
    store = open_store(store_dir.as_uri())
    assert sorted(e.session_id for e in list_sessions(store, since=later - 3 * 86400, now=later)) == sorted(ended)
    con = duckdb.connect()
    con.execute(ddl("duckdb", str(store_dir / "index")))
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions").fetchone() == (len(ended),) * 2


def test_the_fake_enforces_a_list_rate_limit_per_minute() -> None:
    """Every pod of a fleet polls the list: the fake answers 429 (the API's error body) beyond its
    limit per organisation and virtual minute, and serves lists again once the minute has passed."""
    from archiver.fake.clock import FakeClock

    with FakeService((TOKEN,), clock=FakeClock(time_scale=0)) as service:
        service.set_list_rate_limit(3)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=service.base_url, headers=headers, timeout=10) as client:
            assert [client.get("/session").status_code for _ in range(3)] == [200, 200, 200]
            refused = client.get("/session")
            assert refused.status_code == 429 and refused.json()["code"] == "TOO_MANY_REQUESTS"
            assert client.get("/session/nope").status_code == 404  # other endpoints are not limited
            service.advance(61)
            assert client.get("/session").status_code == 200
            service.set_list_rate_limit(None)
            assert [client.get("/session").status_code for _ in range(5)] == [200] * 5


def test_a_replica_that_finds_its_partners_archive_before_fetching_fetches_nothing(
    fake: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Replica B saw the session alive and sees it end, but replica A archived it first: B records it
    archived from the store's manifest, with no describe-to-fetch traffic and no second index entry."""
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    sid = fake.add_session(TOKEN, id="pair-match", files={REPLAY: 3000})
    a = harness_factory(fake, store, state_dir=tmp_path / "a", replicas_per_shard=2, artifact_paths=(REPLAY,))
    b = harness_factory(fake, store, state_dir=tmp_path / "b", replicas_per_shard=2, artifact_paths=(REPLAY,),
                        reconcile=False)  # fmt: skip
    a.poll()
    b.poll()
    fake.end_session(TOKEN, sid)
    a.poll()
    assert a.pipeline.run_until_idle(20)
    fetched = fake.request_count("GET /artifacts"), fake.request_count("GET /logs")
    b.poll()
    assert b.pipeline.run_until_idle(20)
    row = b.state.latest(sid)
    assert row is not None and row.state == "archived"
    assert row.manifest_key == keys.manifest_key("", sid, a.instance(sid))
    assert (fake.request_count("GET /artifacts"), fake.request_count("GET /logs")) == fetched
    assert b.registry.get_sample_value("archiver_archives_recognised_total") == 1.0
    assert b.registry.get_sample_value("archiver_last_archive_success_timestamp_seconds")
    assert archived_ids(tmp_path / "store") == {sid: 1}


def test_a_manifest_with_other_evidence_is_still_a_conflict(
    fake: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Recognition is not blind: an archiver whose items differ (another artifact path) from the
    manifest already in the store gets the conflict it always got, and recognises nothing."""
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    sid = fake.add_session(TOKEN, id="odd-match", files={REPLAY: 3000})
    a = harness_factory(fake, store, state_dir=tmp_path / "a", artifact_paths=(REPLAY,))
    b = harness_factory(fake, store, state_dir=tmp_path / "b", artifact_paths=(REPLAY, MISSING), reconcile=False)
    a.poll()
    b.poll()
    fake.end_session(TOKEN, sid)
    a.poll()
    assert a.pipeline.run_until_idle(20)
    b.poll()
    assert b.pipeline.run_until_idle(20)
    assert b.registry.get_sample_value("archiver_errors_total", {"where": "manifest"}) == 1.0
    assert not b.registry.get_sample_value("archiver_archives_recognised_total")
    manifest = parse_manifest((tmp_path / "store" / keys.manifest_key("", sid, a.instance(sid))).read_bytes())
    assert {i.path for i in manifest.items} == {None, REPLAY}  # A's archive stands


def test_a_healthy_pair_fetches_each_session_once(
    fake: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Both replicas see the end in the same poll; replica 1 waits out its head start, finds replica
    0's manifest and fetches nothing: the pair costs the upstream one fetch per item."""
    # The upstream's clock stands still: replica 1's head start cannot run out however slowly
    # replica 0 archives on a loaded machine, so only the manifest can release replica 1's items.
    fake.clock.time_scale = 0
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    ids = [fake.add_session(TOKEN, id=f"pair-{n}", files={REPLAY: 2000}) for n in range(3)]
    pair = [
        harness_factory(fake, store, state_dir=tmp_path / f"r{r}", replicas_per_shard=2, artifact_paths=(REPLAY,),
                        shard=Shard(0, 1, r), tuning=dataclasses.replace(FAST, replica_stagger=3.0))
        for r in range(2)
    ]  # fmt: skip
    for h in pair:
        h.poll()
    for sid in ids:
        fake.end_session(TOKEN, sid)
    for h in pair:
        h.poll()
    for h in pair:
        assert h.pipeline.run_until_idle(30)
    assert fake.request_count("GET /artifacts") == len(ids)
    assert pair[1].registry.get_sample_value("archiver_archives_recognised_total") == len(ids)
    assert archived_ids(tmp_path / "store") == dict.fromkeys(ids, 1)


@pytest.mark.parametrize(
    ("where", "writer", "adopted"),
    [
        ("dir", "archiver", True),
        ("dir", "other-log", False),
        ("s3", "archiver", True),
        ("s3", "other-log", False),
        ("s3", "no-checksum", False),
    ],
)
def test_a_log_another_archiver_compressed_otherwise_is_the_same_evidence(
    fake: FakeService,
    tmp_path: Path,
    harness_factory: Callable[..., Harness],
    request: pytest.FixtureRequest,
    where: str,
    writer: str,
    adopted: bool,
) -> None:
    """An archiver of another version (or zlib build) stored the session's log first, in other gzip
    bytes: the same uncompressed log is recorded as archived with the stored object's size and
    sha256, nothing kept aside. A log whose content differs, or one written without the checksum
    the manifest would then claim (S3), stays a conflict, our bytes kept."""
    if where == "dir":
        (tmp_path / "store").mkdir()
        store: ObjectStore = FileStore(tmp_path / "store")
    else:
        store = request.getfixturevalue("s3_store")
    sid = fake.add_session(TOKEN, id="mixed-versions", files={REPLAY: 3000})
    h = harness_factory(fake, store, state_dir=tmp_path / "b", artifact_paths=(REPLAY,), start=False)
    h.poll()
    fake.end_session(TOKEN, sid)
    h.poll()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    served = httpx.get(f"{fake.base_url}/query/log", params={"matchKey": sid}, headers=headers, timeout=10).content
    assert served.count(b"\n") > 10
    theirs = gzip.compress(served + (b"one more line\n" if writer == "other-log" else b""), compresslevel=9, mtime=0)
    key = keys.logs_key(store.prefix, sid, "txt", h.instance(sid))
    if writer == "no-checksum":
        bucket, _, _prefix = store.url.removeprefix("s3://").partition("/")
        store.client.put_object(Bucket=bucket, Key=key, Body=theirs)  # type: ignore[attr-defined]
    else:
        store.put_bytes(key, theirs, content_type="application/gzip")

    h.pipeline.recover()
    h.pipeline.start(reconcile=False)
    assert h.pipeline.run_until_idle(20)

    assert h.object_bytes(key) == theirs  # never overwritten
    row = h.state.latest(sid)
    assert row is not None and row.manifest_key is not None
    (logs,) = [i for i in parse_manifest(h.object_bytes(row.manifest_key)).items if i.kind == "logs"]
    kept = list((tmp_path / "b" / "conflicts").glob("*"))
    if adopted:
        assert h.items_total("logs", "archived") == 1 and h.items_total("logs", "conflict") == 0
        assert (logs.outcome, logs.size, logs.sha256) == ("archived", len(theirs), hashlib.sha256(theirs).hexdigest())
        assert kept == []
    else:
        assert h.items_total("logs", "conflict") == 1
        assert logs.outcome == "conflict"
        assert [gzip.decompress(p.read_bytes()) for p in kept] == [served]
