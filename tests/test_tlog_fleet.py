"""Two shards of two replicas (in-process daemons) with the transparency log, through restarts: every
archive is a leaf of exactly one log, each log holds exactly its writer's archives, and every log
stays consistent with the checkpoints seen before each restart."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver.app.daemon import Daemon
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
from tests.support import wait_until

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

        archives = _manifests(fleet.store_dir)
        leaves = _leaves(signer, fleet.store_dir)
        assert set(leaves) <= {f"shard-{s.index}-replica-{s.replica}" for s in PODS}
        every = [leaf.manifest_sha256 for log in leaves.values() for leaf in log]
        # Exactly as many leaves as archives: each archive in exactly one log, no duplicate leaf.
        assert sorted(every) == sorted(archives) and len(archives) == len(ended) == 24
        for writer, log in leaves.items():
            shard = int(writer.split("-")[1])
            assert all(shard_of(leaf.session, 2) == shard for leaf in log), writer
        report = audit(open_store(fleet.store_dir.as_uri()), signer.verifier, kept=kept, objects=True)
        assert report.findings == [] and report.archives == 24 and report.leaves == 24
        assert len({cp.origin for cp in kept}) == len(leaves)
    finally:
        fleet.stop_all()
