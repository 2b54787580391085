"""Two shards of two replicas with the transparency log, through graceful restarts (in-process
daemons) and through crashes (`archiver run` subprocesses killed with SIGKILL mid-wave and dying at
the log's crash points): every archive is a leaf of exactly one log, each log holds exactly its
writer's archives, and every log stays consistent with the checkpoints seen before each restart."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver.app.daemon import Daemon
from archiver.archive.crashpoints import ENV_VAR, EXIT_CODE
from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.config.sharding import Shard, shard_of
from archiver.fake import FakeService
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import open_store
from archiver.tlog.audit import audit
from archiver.tlog.checkpoint import Checkpoint
from archiver.tlog.keyfile import write_keypair
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import LogReader, writers
from archiver.tlog.note import Signer
from archiver.upstream.api import SessionHostClient
from tests.fixtures_pipeline import FAST, FAST_POLICY, REPLAY, TOKEN
from tests.support import ARCHIVER, free_port, wait_until

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

STAGGERED = dataclasses.replace(FAST, replica_stagger=1.0)
PODS = [Shard(index, 2, replica) for index in range(2) for replica in range(2)]


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with FakeService((TOKEN,)) as service:
        yield service


class Fleet:
    """In-process daemons sharing one fake and one directory store, each with its own state dir."""

    def __init__(self, fake: FakeService, root: Path, key: Path) -> None:
        self.fake, self.root, self.key = fake, root, key
        self.store_dir = root / "archive"
        self.store_dir.mkdir()
        self.daemons: dict[Shard, Daemon] = {}

    def start(self, shard: Shard) -> None:
        settings = Settings(
            api_url=self.fake.base_url, api_token=Token(TOKEN), store=self.store_dir.as_uri(),
            listen=("127.0.0.1", 0), state_dir=self.root / f"state-{shard.index}-{shard.replica}",
            poll_interval=0.25, reconcile_interval=1.0, artifact_paths=(REPLAY,), fetch_workers=2,
            upload_workers=1, shard=shard, replicas_per_shard=2, tlog_key_file=self.key, tlog_interval=0.2,
        )  # fmt: skip

        def pipeline(s: Settings, client: SessionHostClient, metrics: SelfMetrics) -> Pipeline:
            return Pipeline(
                s, client, open_store(s.require_store()), StateDB.open(s.state_dir), metrics,
                policy=FAST_POLICY, tuning=STAGGERED,
            )  # fmt: skip

        client = SessionHostClient.connect(self.fake.base_url, Token(TOKEN), policy=FAST_POLICY)
        daemon = Daemon(settings, client=client, pipeline_factory=pipeline)
        daemon.start()
        self.daemons[shard] = daemon

    def stop(self, shard: Shard) -> None:
        self.daemons.pop(shard).stop(10.0)

    def stop_all(self) -> None:
        for shard in list(self.daemons):
            self.stop(shard)


def _manifests(store_dir: Path) -> dict[str, tuple[str, str | None]]:
    """Manifest sha256 → (session, instance) of every archive in the store."""
    out = {}
    for path in (store_dir / "sessions").rglob("manifest.json"):
        instance = path.parent.name
        out[hashlib.sha256(path.read_bytes()).hexdigest()] = (path.parent.parent.name, instance)
    return out


def _leaves(signer: Signer, store_dir: Path) -> dict[str, list[Leaf]]:
    store = open_store(store_dir.as_uri())
    out = {}
    for writer in writers(store):
        reader = LogReader(store, writer)
        head = reader.head(signer.verifier)
        if head is None:
            continue  # its first batch's tiles are written, its checkpoint not yet
        size = head.checkpoint.size
        out[writer] = [Leaf.decode(entry) for _, entry in reader.entries(0, size, size)]
    return out


def _all_logged(signer: Signer, store_dir: Path, count: int) -> bool:
    archives = _manifests(store_dir)
    logged = {leaf.manifest_sha256 for leaves in _leaves(signer, store_dir).values() for leaf in leaves}
    return len(archives) == count and set(archives) <= logged


def _assert_each_archive_logged_once(
    signer: Signer, store_dir: Path, kept: list[Checkpoint], sessions: int
) -> dict[str, list[Leaf]]:
    """The `sessions` archives are each a leaf of exactly one log, their shard's writer's, and every
    log is consistent with every checkpoint `kept` (seen before a kill or a restart); the leaves."""
    archives = _manifests(store_dir)
    leaves = _leaves(signer, store_dir)
    every = [leaf.manifest_sha256 for log in leaves.values() for leaf in log]
    # Exactly as many leaves as archives: each archive in exactly one log, no duplicate leaf.
    assert sorted(every) == sorted(archives) and len(archives) == sessions
    for writer, log in leaves.items():
        shard = int(writer.split("-")[1])
        assert all(shard_of(leaf.session, 2) == shard for leaf in log), writer
    report = audit(open_store(store_dir.as_uri()), signer.verifier, kept=kept, objects=True)
    assert report.findings == [] and report.archives == sessions and report.leaves == sessions
    return leaves


def _heads(signer: Signer, store_dir: Path) -> list[Checkpoint]:
    store = open_store(store_dir.as_uri())
    heads = [LogReader(store, w).head(signer.verifier) for w in writers(store)]
    return [h.checkpoint for h in heads if h is not None]


def test_two_shards_of_two_replicas_log_every_archive_once_and_stay_consistent_across_restarts(
    fake: FakeService, tmp_path: Path
) -> None:
    signer = write_keypair("archiver.test/fleet", tmp_path / "log.key", tmp_path / "log.pub")
    fleet = Fleet(fake, tmp_path, tmp_path / "log.key")
    live = sorted(fake.add_session(TOKEN, id=f"match-{n}", files={REPLAY: 1500}) for n in range(24))
    kept: list[Checkpoint] = []
    try:
        for shard in PODS:
            fleet.start(shard)
        ended: list[str] = []
        for wave in range(3):
            batch, live = live[:8], live[8:]
            wait_until(lambda: all(d.pipeline is not None for d in fleet.daemons.values()), message="pipelines")
            for sid in batch:
                fake.end_session(TOKEN, sid)
            ended += batch
            wait_until(
                functools.partial(_all_logged, signer, fleet.store_dir, len(ended)),
                timeout=60, interval=0.2, message=f"wave {wave} archived and logged",
            )  # fmt: skip
            kept += _heads(signer, fleet.store_dir)
            # Restart every pod (a rolling restart): each reopens its log against its state DB.
            for shard in PODS:
                fleet.stop(shard)
                fleet.start(shard)
        fleet.stop_all()

        assert len(ended) == 24
        leaves = _assert_each_archive_logged_once(signer, fleet.store_dir, kept, len(ended))
        assert set(leaves) <= {f"shard-{s.index}-replica-{s.replica}" for s in PODS}
        assert len({cp.origin for cp in kept}) == len(leaves)
    finally:
        fleet.stop_all()


class Pods:
    """The same fleet as `archiver run` subprocesses (pod ordinal o = shard o // 2, replica o % 2),
    which the test kills with SIGKILL or arms with a crash point (`ARCHIVER_CRASH_AT`)."""

    def __init__(self, fake: FakeService, root: Path, key: Path) -> None:
        self.fake, self.root, self.key = fake, root, key
        self.store_dir = root / "archive"
        self.store_dir.mkdir()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.runs = 0
        #: Exit statuses of the runs that ended before the test stopped them (crash points: 137).
        self.crashed: list[int] = []

    def start(self, ordinal: int, crash_at: str | None = None) -> None:
        self.runs += 1
        # A retention this short leaves no time for replica 1's head start: both replicas of a shard
        # race for every session, and the create-once manifest write decides which one logs it.
        args = [
            ARCHIVER, "run", "--api-url", self.fake.base_url, "--store", self.store_dir.as_uri(),
            "--state-dir", str(self.root / f"state-{ordinal}"), "--shard", "auto", "--total-shards", "2",
            "--replicas-per-shard", "2", "--web.listen-address", f"127.0.0.1:{free_port()}",
            "--poll-interval", "0.25s", "--reconcile-interval", "1s", "--artifact-path", REPLAY,
            "--fetch-workers", "2", "--upload-workers", "1", "--retention", "3m", "--deadline-margin", "10s",
            "--tlog-key-file", str(self.key), "--tlog-interval", "0.5s", "--log.level", "warn",
        ]  # fmt: skip
        env = {**os.environ, "ARCHIVER_API_TOKEN": TOKEN, "POD_NAME": f"archiver-{ordinal}"}
        env.pop(ENV_VAR, None)
        if crash_at is not None:
            env[ENV_VAR] = crash_at
        with (self.root / f"pod-{ordinal}-run-{self.runs}.log").open("wb") as log:
            self.procs[ordinal] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def kill(self, ordinal: int) -> None:
        """SIGKILL, then start it again at once (a crashed pod the StatefulSet restarts)."""
        proc = self.procs[ordinal]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.start(ordinal)

    def revive(self) -> None:
        """Start again every pod that died on its own (its crash point)."""
        for ordinal, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.crashed.append(proc.returncode)
                self.start(ordinal)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _manifest_count(store_dir: Path) -> int:
    return sum(1 for _ in (store_dir / "sessions").rglob("manifest.json")) if (store_dir / "sessions").exists() else 0


def test_two_shards_of_two_replicas_log_every_archive_once_through_sigkills_and_crashes(
    fake: FakeService, tmp_path: Path
) -> None:
    signer = write_keypair("archiver.test/fleet", tmp_path / "log.key", tmp_path / "log.pub")
    pods = Pods(fake, tmp_path, tmp_path / "log.key")
    live = sorted(fake.add_session(TOKEN, id=f"match-{n}", files={REPLAY: 1500}) for n in range(24))
    kept: list[Checkpoint] = []
    # The first run of each pod dies at one of the log's crash boundaries when it gets there: after a
    # manifest (before the archived mark and its queued leaf), after a batch's tiles (before the
    # checkpoint), after the checkpoint (before the queue commit).
    first_crash = ["after_manifest", "after_log_tiles", "after_log_checkpoint", "after_manifest:2"]
    # Then SIGKILLs while a wave is being archived: two pods, then the whole fleet.
    kills = [[], [0, 3], [0, 1, 2, 3]]
    unlogged: list[int] = []
    try:
        for ordinal, point in enumerate(first_crash):
            pods.start(ordinal, point)
        ended: list[str] = []
        for wave in range(3):
            batch, live = live[:8], live[8:]
            before = _manifest_count(pods.store_dir)
            for sid in batch:
                fake.end_session(TOKEN, sid)
            ended += batch
            if kills[wave]:
                # Mid-work: some of the wave's archives are made, and not yet all of them logged.
                def under_way(before: int = before) -> bool:
                    pods.revive()
                    return _manifest_count(pods.store_dir) > before

                wait_until(under_way, timeout=60, interval=0.05, message=f"wave {wave} under way")
                kept += _heads(signer, pods.store_dir)
                # Archives made but in no checkpoint yet: their leaves are queued in the pods' state DBs.
                unlogged.append(
                    _manifest_count(pods.store_dir) - sum(map(len, _leaves(signer, pods.store_dir).values()))
                )
                for ordinal in kills[wave]:
                    pods.kill(ordinal)

            def done(count: int = len(ended)) -> bool:
                pods.revive()
                return _all_logged(signer, pods.store_dir, count)

            wait_until(done, timeout=60, interval=0.2, message=f"wave {wave} archived and logged")
            kept += _heads(signer, pods.store_dir)
        pods.stop_all()

        assert len(ended) == 24
        _assert_each_archive_logged_once(signer, pods.store_dir, kept, len(ended))
        # Nothing is left queued, and the crashes did happen (a crash point exits as kill -9 does).
        for ordinal in range(4):
            state = StateDB.open(tmp_path / f"state-{ordinal}")
            try:
                assert state.log_pending_count() == 0, ordinal
            finally:
                state.close()
        assert pods.crashed and set(pods.crashed) == {EXIT_CODE}
        assert any(n > 0 for n in unlogged), f"no kill landed before a checkpoint: {unlogged}"
    finally:
        pods.stop_all()
