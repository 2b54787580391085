"""The upload path's per-object work: what a create-once write already proves is not asked again,
claims commit without a sync, the look for a due manifest is skipped while none can have become due,
and upload workers are sized to the store (issue 14)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import auto_upload_workers
from archiver.archive.spool import Spool
from archiver.archive.stage import ANY, CONFIRM, FETCH, UPLOAD, StageParts, Tuning, Wakeups
from archiver.archive.state import ItemRow, StateDB, StoredOutcome
from archiver.archive.upload import Stored, Uploader
from archiver.archive.upload_stage import UploadStage
from archiver.errors import ConfigError, StoreUnavailableError
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import FileStore, ObjectStore
from archiver.store.base import MemoryJournal, PutOutcome
from tests.support import committed_statuses, ended, settings_from, uploading, wait_until


def _spooled(tmp_path: Path, store: ObjectStore, name: str, data: bytes) -> ItemRow:
    spool = tmp_path / f"{name}.part"
    spool.write_bytes(data)
    return ItemRow(
        id=1, session_key=f"1:{name}", session_id=name, instance="", kind="artifact", path="/srv/x",
        status="uploading", outcome=None, attempts=0, last_error=None, deadline=0.0, source="GET /x",
        key=f"{store.prefix}{name}/x.bin", spool_path=str(spool), size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), content_type="application/octet-stream", fetched_at=0.0,
    )  # fmt: skip


def test_a_created_object_needs_no_head_but_an_unenforced_store_still_reads_it_back(
    s3_store: ObjectStore, tmp_path: Path
) -> None:
    """A PUT the server accepted under If-None-Match created exactly our bytes: no HEAD follows it.
    Where the server ignores If-None-Match, the HEAD stays (it tells ours from a concurrent write)."""
    uploader = Uploader(s3_store, MemoryJournal())
    s3_store.requests_made.reset()
    item = _spooled(tmp_path, s3_store, "created", b"replay bytes " * 1000)
    assert uploader.upload(item) == Stored(PutOutcome.CREATED)
    assert s3_store.requests_made.snapshot() == {"PutObject": 1}
    assert b"".join(s3_store.iter_bytes(item.key or "")) == b"replay bytes " * 1000

    s3_store.conditional_writes = False
    s3_store.requests_made.reset()
    other = _spooled(tmp_path, s3_store, "unenforced", b"other bytes")
    assert uploader.upload(other) == Stored(PutOutcome.CREATED)
    # HEAD before the PUT (the fallback), and the verification HEAD after it.
    assert s3_store.requests_made.snapshot() == {"HeadObject": 2, "PutObject": 1}


def test_an_object_already_there_is_still_verified_by_head(s3_store: ObjectStore, tmp_path: Path) -> None:
    uploader = Uploader(s3_store, MemoryJournal())
    item = _spooled(tmp_path, s3_store, "twice", b"same bytes")
    uploader.upload(item)
    s3_store.requests_made.reset()
    assert uploader.upload(item) == Stored(PutOutcome.ALREADY_PRESENT)
    assert s3_store.requests_made["HeadObject"] >= 1


def test_a_claim_commits_without_sync_and_leaves_the_connection_synchronous_full(tmp_path: Path) -> None:
    """`write(durable=False)` is for changes recovery undoes anyway; every other commit stays FULL."""
    state = StateDB.open(tmp_path)
    with state.write(durable=False) as db:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL inside
        db.execute("UPDATE items SET status = status")
    with state.write() as db:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    with pytest.raises(sqlite3.OperationalError), state.write(durable=False) as db:
        db.execute("SELECT nonsense FROM nowhere")
    with state.write() as db:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # restored after a rollback too
    state.close()


def test_upload_workers_default_to_auto_sized_by_the_store(tmp_path: Path) -> None:
    assert settings_from([]).upload_workers == 0
    assert settings_from(["--upload-workers", "auto"]).upload_workers == 0
    assert settings_from([], {"ARCHIVER_UPLOAD_WORKERS": "6"}).upload_workers == 6
    assert auto_upload_workers("s3://bucket/prefix/") == 4
    assert auto_upload_workers(FileStore(tmp_path).url) == 2
    with pytest.raises(ConfigError, match="upload-workers"):
        settings_from(["--upload-workers", "0"])


def test_a_notification_wakes_only_the_workers_it_is_aimed_at() -> None:
    """An uploaded item wakes the upload workers (finalization may be due), not the fetch or confirm
    workers, whose every needless wake-up costs a state DB transaction; `notify()` still wakes all."""
    wake = Wakeups(idle_wait=30.0)
    before = {group: wake.snapshot(group) for group in (CONFIRM, FETCH, UPLOAD, ANY)}
    wake.notify(UPLOAD)
    after = {group: wake.snapshot(group) for group in (CONFIRM, FETCH, UPLOAD, ANY)}
    assert [group for group in before if after[group] != before[group]] == [UPLOAD, ANY]
    wake.notify()
    assert all(wake.snapshot(group) == after[group] + 1 for group in after)

    woken = threading.Event()
    parked = wake.snapshot(FETCH)

    def fetch_worker() -> None:
        wake.wait(parked, 30.0, FETCH)
        woken.set()

    worker = threading.Thread(target=fetch_worker, daemon=True)
    worker.start()
    wake.notify(UPLOAD, CONFIRM)
    assert not woken.wait(0.2)  # still parked: nothing it could act on happened
    wake.notify(FETCH)
    assert woken.wait(10.0)
    worker.join(10.0)


def test_the_finalize_claim_with_nothing_due_does_not_wait_for_the_write_lock(tmp_path: Path) -> None:
    """Upload workers ask for a due manifest before every item: with none due, the answer comes from
    the reader connection, even while another worker holds the write transaction."""
    state = StateDB.open(tmp_path)
    answers: list[object] = []
    with state.write():
        asker = threading.Thread(target=lambda: answers.append(state.claim_finalize(0.0, 60.0)), daemon=True)
        asker.start()
        asker.join(10.0)
        assert answers == [None]
    state.close()


class _Monotonic:
    """The upload stage's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _upload_stage(
    tmp_path: Path,
    mono: Callable[[], float],
    store: ObjectStore | None = None,
    registry: CollectorRegistry | None = None,
) -> tuple[UploadStage, StateDB, FileStore]:
    state = StateDB.open(tmp_path / "state")
    (tmp_path / "store").mkdir(exist_ok=True)
    files = FileStore(tmp_path / "store")
    store = store or files
    tuning = Tuning(idle_wait=30.0, upload_claim_batch=4, upload_backoff_initial=30.0)
    parts = StageParts(
        state, SelfMetrics(registry or CollectorRegistry()), tuning, Wakeups(tuning.idle_wait, mono), lambda: 50.0,
        mono, lambda: None,
    )  # fmt: skip
    spool = Spool(tmp_path / "state" / "spool")
    return UploadStage(store, Uploader(store, state.journal), spool, tmp_path / "conflicts", parts), state, files


def _uploaded(state: StateDB, tmp_path: Path, sid: str) -> None:
    """Every item of `sid` uploaded and its outcome committed (as the group commit does): `finalizing`."""
    items = uploading(state, Spool(tmp_path / "state" / "spool"), sid)
    state.finish_uploads([StoredOutcome(i.id, i.instance, i.spool_path or "") for i in items], now=50.0)
    row = state.latest(sid)
    assert row is not None and row.state == "finalizing"


def _manifests(store: FileStore) -> list[str]:
    return [key for key in store.list_keys(store.prefix) if key.endswith(".json") and "manifest" in key]


def _finalized_at_the_next_step(stage: UploadStage, state: StateDB, store: FileStore, sid: str) -> None:
    """The stage's next step writes the manifest of `sid`, the only one in the store."""
    assert stage.work_once() is None
    row = state.latest(sid)
    assert row is not None and row.state == "archived" and _manifests(store) == [row.manifest_key]
    state.close()


def test_a_session_this_process_made_due_is_finalized_at_the_next_step_though_the_last_look_found_none(
    tmp_path: Path,
) -> None:
    mono = _Monotonic()
    stage, state, store = _upload_stage(tmp_path, mono)
    assert stage.work_once() == 30.0  # nothing to do: it looked, found no manifest due, and waits
    _uploaded(state, tmp_path, "sess-00001")  # the clock has not moved: only the commit tells
    _finalized_at_the_next_step(stage, state, store, "sess-00001")


def test_a_session_made_due_behind_the_workers_back_is_finalized_once_idle_wait_has_passed(tmp_path: Path) -> None:
    """Another connection's commit does not move this process's finalize generation: the look stays
    skipped, which costs latency (up to `idle_wait`), never the manifest."""
    mono = _Monotonic()
    stage, state, store = _upload_stage(tmp_path, mono)
    assert stage.work_once() == 30.0
    other = StateDB.open(tmp_path / "state")
    _uploaded(other, tmp_path, "sess-00002")
    other.close()
    mono.now += 29.0
    assert stage.work_once() == pytest.approx(1.0)  # skipped: the last look still holds for 1 s
    assert _manifests(store) == []
    mono.now += 1.0
    _finalized_at_the_next_step(stage, state, store, "sess-00002")


def test_a_session_whose_finalize_gate_passes_is_finalized_then_without_any_commit(tmp_path: Path) -> None:
    """A worker leased the session and died (nothing is committed when a lease runs out): the skip
    lasts only until the lease's end, which the idle worker also waits for instead of `idle_wait`."""
    mono = _Monotonic()
    stage, state, store = _upload_stage(tmp_path, mono)
    _uploaded(state, tmp_path, "sess-00003")
    leased = state.claim_finalize(mono(), lease=10.0)  # the worker that dies with it
    assert leased is not None
    assert stage.work_once() == pytest.approx(10.0)
    mono.now += 9.5
    assert stage.work_once() == pytest.approx(0.5)
    assert _manifests(store) == []
    mono.now += 0.5
    _finalized_at_the_next_step(stage, state, store, "sess-00003")


class _StoreThat(FileStore):
    """A real directory store that fails every write (`failing`), or asks the workers to stop once it
    has stored a first object (`stop`)."""

    def __init__(self, root: Path, *, failing: bool = False, stop: threading.Event | None = None) -> None:
        super().__init__(root)
        self.failing = failing
        self.stop = stop

    def put_file(self, key: str, path: Path, **kwargs: Any) -> Any:
        if self.failing:
            raise StoreUnavailableError("injected: the store is unavailable")
        result = super().put_file(key, path, **kwargs)
        if self.stop is not None:
            self.stop.set()
        return result


def _four_spooled(state: StateDB, spool: Spool) -> list[int]:
    """One ended session of four items (logs and three artifacts), every one fetched into the spool."""
    ended(state, "sess-00004", 900.0, ("/a", "/b", "/c"))
    ids = []
    while (item := state.claim_fetch(0.0)) is not None:
        path = spool.final_path(item.id)
        data = b"spooled %d" % item.id
        path.write_bytes(data)
        state.mark_spooled(
            item.id, spool_path=str(path), size=len(data), sha256=hashlib.sha256(data).hexdigest(),
            content_type="application/octet-stream", source="GET /x", key=f"k/{item.id}", fetched_at=3.0,
        )  # fmt: skip
        ids.append(item.id)
    return ids


def test_a_store_failure_hands_the_items_claimed_with_the_failed_one_back_to_spooled(tmp_path: Path) -> None:
    """A running worker claims four items at once; the store fails on the first: that one is put back
    with its error, the three it never attempted go back untouched, and the stage pauses."""
    (tmp_path / "store").mkdir()
    registry = CollectorRegistry()
    stage, state, _ = _upload_stage(tmp_path, time.monotonic, _StoreThat(tmp_path / "store", failing=True), registry)
    ids = _four_spooled(state, stage.spool)
    worker = threading.Thread(target=stage.run, daemon=True)
    worker.start()
    # Nothing announces a store failure: look again shortly.
    wait_until(
        lambda: registry.get_sample_value("archiver_errors_total", {"where": "store"}),
        timeout=30.0,
        interval=0.02,
        pause=stage.wake.stop.wait,
    )
    assert stage._paused_for() > 0
    assert committed_statuses(tmp_path / "state") == dict.fromkeys(ids, "spooled")
    with state.read() as db:
        errors = [r[0] for r in db.execute("SELECT last_error FROM items ORDER BY id")]
    assert errors == ["injected: the store is unavailable", None, None, None]
    stage.wake.stop.set()
    stage.wake.notify()
    worker.join(30.0)
    assert not worker.is_alive()
    state.close()


def test_a_stopping_worker_hands_back_what_it_claimed_and_did_not_attempt_and_nothing_is_lost(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    stop = threading.Event()
    stage, state, files = _upload_stage(tmp_path, time.monotonic, _StoreThat(tmp_path / "store", stop=stop))
    stage.wake.stop = stop  # the store's first write stops the worker, with three items still in hand
    ids = _four_spooled(state, stage.spool)
    stage.run()
    statuses = committed_statuses(tmp_path / "state")
    assert sorted(statuses.values()) == ["done", "spooled", "spooled", "spooled"]
    stage.store.stop = None  # type: ignore[attr-defined]
    while stage.work_once() is None:  # the next worker (one step at a time) takes them, and the manifest
        pass
    assert committed_statuses(tmp_path / "state") == dict.fromkeys(ids, "done")
    row = state.latest("sess-00004")
    assert row is not None and row.state == "archived" and row.manifest_key in _manifests(files)
    assert sorted(files.list_keys("k/")) == sorted(f"k/{i}" for i in ids)
    state.close()
