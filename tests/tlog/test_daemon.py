"""The daemon's log stage: every committed archive becomes one leaf, crashes repaired, inconsistency stops it."""

from __future__ import annotations

import gc
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.log_stage import LogStage, writer_name
from archiver.archive.pipeline import Pipeline
from archiver.archive.state import SCHEMA_VERSION, StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.config.sharding import Shard
from archiver.errors import LogVerificationError
from archiver.fake import FakeService
from archiver.layout import keys
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import ObjectStore, make_s3_client, open_store
from archiver.tlog import merkle
from archiver.tlog.backfill import backfill
from archiver.tlog.keyfile import write_keypair
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import LogReader, TileLog, read_object, writers
from archiver.tlog.note import Signer
from archiver.tlog.witness import Witness
from archiver.upstream.api import SessionHostClient
from tests.fixtures_fake import TEST_TOKEN
from tests.fixtures_pipeline import FAST, FAST_POLICY
from tests.fixtures_s3 import SeaweedServer
from tests.support import ARTIFACT_PATHS, open_connections_to, put_session, wait_until

SIGNER = Signer("archiver.test/log", hashlib.sha256(b"daemon test key").digest())


def _leaf(i: int) -> bytes:
    return Leaf.of(hashlib.sha256(b"m%d" % i).hexdigest(), f"s{i}", None, 1_790_000_000 + i).encode()


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[StateDB, ObjectStore, CollectorRegistry]]:
    root = tmp_path / "store"
    root.mkdir()
    state = StateDB.open(tmp_path / "state")
    yield state, open_store(root.as_uri()), CollectorRegistry()
    state.close()


def _stage(state: StateDB, store: ObjectStore, metrics: SelfMetrics | CollectorRegistry) -> LogStage:
    if isinstance(metrics, CollectorRegistry):
        metrics = SelfMetrics(metrics)
    return LogStage(state, store, SIGNER, "shard-0-replica-0", metrics, lambda: 1_800_000_000.0, interval=1)


def test_queued_archives_are_appended_once_and_the_queue_emptied(
    parts: tuple[StateDB, ObjectStore, CollectorRegistry],
) -> None:
    state, store, registry = parts
    for i in range(5):
        state.add_log_pending(f"k{i}", _leaf(i), now=float(i))
    stage = _stage(state, store, registry)
    assert stage.run_once() == 5
    assert stage.run_once() == 0
    assert state.log_pending_count() == 0
    head = TileLog(store, "shard-0-replica-0", SIGNER).head(SIGNER.verifier)
    assert head is not None and head.checkpoint.size == 5
    assert head.note == state.log_checkpoint("shard-0-replica-0")
    assert head.checkpoint.root == merkle.root_of([merkle.leaf_hash(_leaf(i)) for i in range(5)])
    assert registry.get_sample_value("archiver_log_leaves_total") == 5
    assert registry.get_sample_value("archiver_log_size") == 5
    assert registry.get_sample_value("archiver_log_pending") == 0
    assert registry.get_sample_value("archiver_log_consistency_ok") == 1


def test_a_crash_after_the_checkpoint_before_the_queue_commit_logs_nothing_twice(
    parts: tuple[StateDB, ObjectStore, CollectorRegistry],
) -> None:
    state, store, registry = parts
    for i in range(3):
        state.add_log_pending(f"k{i}", _leaf(i), now=float(i))
    _stage(state, store, registry).run_once()
    for i in range(3, 6):
        state.add_log_pending(f"k{i}", _leaf(i), now=float(i))
    # The process appended k3, k4 and signed, then died before its state DB commit.
    crashed = TileLog(store, "shard-0-replica-0", SIGNER)
    crashed.open()
    crashed.append([_leaf(3), _leaf(4)])
    restarted = _stage(state, store, CollectorRegistry())
    restarted.open()
    assert state.log_pending(10) == [("k5", _leaf(5))]
    assert restarted.run_once() == 1
    stored = TileLog(store, "shard-0-replica-0", SIGNER)
    stored.open()
    assert [e for _, e in stored.entries(0, 6, 6)] == [_leaf(i) for i in range(6)]


def test_a_rolled_back_log_stops_the_stage_and_sets_the_gauge(
    parts: tuple[StateDB, ObjectStore, CollectorRegistry],
) -> None:
    state, store, registry = parts
    state.add_log_pending("k0", _leaf(0), now=0.0)
    metrics = SelfMetrics(registry)
    stage = _stage(state, store, metrics)
    stage.run_once()
    old = read_object(store, keys.log_prefix("", "shard-0-replica-0") + "checkpoint")
    state.add_log_pending("k1", _leaf(1), now=1.0)
    stage.run_once()
    # Someone with write access puts the older checkpoint back (hiding leaf 1).
    store.replace_bytes(keys.log_prefix("", "shard-0-replica-0") + "checkpoint", old, content_type="text/plain")
    restarted = _stage(state, store, metrics)
    with pytest.raises(LogVerificationError, match="rolled back"):
        restarted.open()
    assert registry.get_sample_value("archiver_log_consistency_ok") == 0
    state.add_log_pending("k2", _leaf(2), now=2.0)
    assert restarted.run_once() == 0  # nothing is appended to a log that failed its check


def test_the_daemon_logs_every_archive_it_commits(fake_service: FakeService, tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    store = open_store(root.as_uri())
    signer = write_keypair("archiver.test/log", tmp_path / "log.key", tmp_path / "log.pub")
    settings = Settings(
        state_dir=tmp_path / "state",
        artifact_paths=ARTIFACT_PATHS,
        fetch_workers=2,
        tlog_key_file=tmp_path / "log.key",
        tlog_interval=0.05,
    )
    client = SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN), policy=FAST_POLICY)
    state = StateDB.open(settings.state_dir)
    pipeline = Pipeline(
        settings, client, store, state, SelfMetrics(CollectorRegistry()), clock=fake_service.clock.now,
        policy=FAST_POLICY, tuning=FAST,
    )  # fmt: skip
    pipeline.recover()
    pipeline.start()
    try:
        sids = [fake_service.add_session(TEST_TOKEN) for _ in range(3)]
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        for sid in sids:
            fake_service.end_session(TEST_TOKEN, sid)
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        assert pipeline.run_until_idle(30)
        log = TileLog(store, writer_name(Shard()), signer)
        head = wait_until(
            lambda: (h := log.head(signer.verifier)) is not None and h.checkpoint.size == 3 and h,
            message="three leaves in the log",
        )
        assert head
        leaves = [Leaf.decode(e) for _, e in log.entries(0, 3, 3)]
        assert sorted(leaf.session for leaf in leaves) == sorted(sids)
        for leaf in leaves:
            manifest = read_object(store, keys.manifest_key("", leaf.session, leaf.instance))
            assert hashlib.sha256(manifest).hexdigest() == leaf.manifest_sha256
        # The queue is emptied after the checkpoint and the locators are stored.
        wait_until(lambda: state.log_pending_count() == 0, message="the log queue emptied")
    finally:
        pipeline.stop(10.0)
        client.close()
        state.close()


def test_a_witness_keeps_each_checkpoint_and_catches_a_rollback_the_state_db_forgot(
    parts: tuple[StateDB, ObjectStore, CollectorRegistry], tmp_path: Path
) -> None:
    state, store, registry = parts
    (tmp_path / "witness").mkdir()
    witness = Witness(open_store((tmp_path / "witness").as_uri()))
    metrics = SelfMetrics(registry)

    def stage(db: StateDB) -> LogStage:
        return LogStage(db, store, SIGNER, "shard-0-replica-0", metrics, lambda: 1.8e9, interval=1, witness=witness)

    state.add_log_pending("k0", _leaf(0), now=0.0)
    stage(state).run_once()
    old = read_object(store, keys.log_prefix("", "shard-0-replica-0") + "checkpoint")
    state.add_log_pending("k1", _leaf(1), now=1.0)
    stage(state).run_once()
    latest = witness.latest("shard-0-replica-0", SIGNER.verifier)
    assert latest is not None and latest.size == 2
    # The log is rolled back to 1 leaf (its checkpoint, and the tiles and history of size 2 deleted)
    # and the pod starts on a fresh state DB: only the witness still knows the log had 2 leaves.
    base = Path(store.url.removeprefix("file://")) / keys.log_prefix("", "shard-0-replica-0")
    for path in ("tile/0/000.p/2", "tile/entries/000.p/2", f"checkpoints/{2:020d}"):
        (base / path).unlink()
    store.replace_bytes(keys.log_prefix("", "shard-0-replica-0") + "checkpoint", old, content_type="text/plain")
    fresh = StateDB.open(tmp_path / "fresh-state")
    try:
        with pytest.raises(LogVerificationError, match="rolled back"):
            stage(fresh).open()
        assert registry.get_sample_value("archiver_log_consistency_ok") == 0
    finally:
        fresh.close()


def test_a_schema_3_state_db_is_migrated_with_an_empty_log_queue(tmp_path: Path) -> None:
    import sqlite3

    state = StateDB.open(tmp_path / "state")
    state.close()
    with sqlite3.connect(tmp_path / "state" / "state.db") as db:  # as an archiver before the log left it
        db.execute("DROP TABLE log_pending")
        db.execute("DROP TABLE log_state")
        db.execute("DROP TABLE list_mark")  # schema 5's
        db.execute("PRAGMA user_version = 3")
    migrated = StateDB.open(tmp_path / "state")
    try:
        assert migrated.log_pending_count() == 0 and migrated.log_checkpoint("shard-0-replica-0") is None
        migrated.add_log_pending("k", _leaf(0), now=1.0)
        assert migrated.log_pending(5) == [("k", _leaf(0))]
    finally:
        migrated.close()
    with sqlite3.connect(tmp_path / "state" / "state.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_stopping_the_pipeline_closes_the_witness_store_it_opened(
    fake_service: FakeService, tmp_path: Path, seaweed_server: SeaweedServer
) -> None:
    # SeaweedFS keeps HTTP connections alive (moto's server closes each one): an open client shows.
    endpoint, port = seaweed_server.endpoint, seaweed_server.s3
    bucket = f"witness-{uuid.uuid4().hex[:16]}"
    creator = make_s3_client(endpoint_url=endpoint)
    creator.create_bucket(Bucket=bucket)
    creator.close()
    # Other tests of this process may still hold connections to the shared server: the dead clients'
    # are collected first, and what is left is counted as the floor ours come on top of.
    gc.collect()
    before = open_connections_to(port)
    root = tmp_path / "store"
    root.mkdir()
    write_keypair("archiver.test/log", tmp_path / "log.key", tmp_path / "log.pub")
    settings = Settings(
        state_dir=tmp_path / "state",
        artifact_paths=ARTIFACT_PATHS,
        tlog_key_file=tmp_path / "log.key",
        tlog_interval=0.05,
        tlog_witness_store=f"s3://{bucket}/witness",
        s3_endpoint_url=endpoint,
    )
    client = SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN), policy=FAST_POLICY)
    state = StateDB.open(settings.state_dir)
    pipeline = Pipeline(
        settings, client, open_store(root.as_uri()), state, SelfMetrics(CollectorRegistry()),
        clock=fake_service.clock.now, policy=FAST_POLICY, tuning=FAST,
    )  # fmt: skip
    assert pipeline.log_stage is not None and pipeline.log_stage.witness is not None
    witness = pipeline.log_stage.witness
    state.add_log_pending("k0", _leaf(0), now=0.0)
    pipeline.recover()
    pipeline.start()
    try:
        # The queue empties after the checkpoint was copied to the witness.
        wait_until(lambda: state.log_pending_count() == 0, message="the queued leaf checkpointed and witnessed")
        assert witness.store.list_keys(keys.witness_prefix(witness.store.prefix, "shard-0-replica-0"))
        assert open_connections_to(port) >= before + 1  # the witness store's client keeps its connection
    finally:
        assert pipeline.stop(10.0)
        client.close()
        state.close()
    assert open_connections_to(port) <= before


def _leaf_counts(store: ObjectStore) -> dict[str, int]:
    """How many leaves of all the store's logs name each manifest SHA-256."""
    counts: dict[str, int] = {}
    for name in writers(store):
        reader = LogReader(store, name)
        head = reader.head(SIGNER.verifier)
        size = head.checkpoint.size if head is not None else 0
        for _, entry in reader.entries(0, size, size):
            sha = Leaf.decode(entry).manifest_sha256
            counts[sha] = counts.get(sha, 0) + 1
    return counts


def test_a_backfill_leaves_an_archive_a_daemon_queued_but_not_yet_checkpointed_to_the_daemon(
    parts: tuple[StateDB, ObjectStore, CollectorRegistry],
) -> None:
    state, store, registry = parts
    now = 1_790_100_000.0
    old = put_session(store, "before-the-log", ended_at=now - 86_400)
    new = put_session(store, "just-archived", ended_at=now - 90)  # archived 60 s ago
    shas = {}
    for m in (old, new):
        shas[m.session_id] = hashlib.sha256(read_object(store, keys.manifest_key("", m.session_id, None))).hexdigest()
    # The daemon that made the new archive queued its leaf; its next checkpoint is seconds away.
    state.add_log_pending(
        "k-new", Leaf.of(shas["just-archived"], new.session_id, None, new.archived_at).encode(), now=now
    )
    report = backfill(store, SIGNER, "backfill", lambda: now)
    assert (report.appended, report.too_recent) == (1, 1)
    assert _stage(state, store, registry).run_once() == 1
    # Each archive is exactly one leaf: the old one the backfill's, the new one the daemon's.
    assert _leaf_counts(store) == {shas["before-the-log"]: 1, shas["just-archived"]: 1}
    # Once older than the horizon, what the daemon logged is still skipped: a rerun appends nothing.
    again = backfill(store, SIGNER, "backfill", lambda: now + 7200)
    assert (again.appended, again.already_logged, again.too_recent) == (0, 2, 0)
