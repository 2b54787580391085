"""End to end: the pipeline archives ended sessions from the fake service into S3 (moto) or a directory."""

from __future__ import annotations

import gzip
import json
import os
import resource
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from archiver.archive.pipeline import capture_store
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.fake.logs import render_ndjson, render_text
from archiver.layout import keys
from archiver.layout.manifest import parse_index_entry, parse_manifest
from archiver.store import FileStore, ObjectStore
from tests.fixtures_pipeline import MB, MISSING, REPLAY, TOKEN, Harness
from tests.support import sealed_capture, sha256_of, wait_until


def _end_all(h: Harness, ids: list[str]) -> None:
    h.poll()
    for sid in ids:
        h.fake.end_session(TOKEN, sid)
    h.poll()


def test_ended_sessions_are_archived_byte_for_byte_with_manifest_and_index(
    fake_service: FakeService, s3_store: ObjectStore, harness_factory: Callable[..., Harness]
) -> None:
    crashed = fake_service.add_session(
        TOKEN, id="match-crashed", crashed=True, labels={"mode": "duel"}, env={"SECRET_KEY": "hunter2"}
    )
    normal = fake_service.add_session(TOKEN, id="match-normal", players=["p1", "p2"])
    running = fake_service.add_session(TOKEN, id="match-still-running")
    h = harness_factory(fake_service, s3_store, artifact_paths=(REPLAY, MISSING, "/srv/crash/core.txt"))
    assert h.pipeline.alive()
    _end_all(h, [crashed, normal])
    assert h.pipeline.run_until_idle(30)

    prefix = s3_store.prefix
    for sid in (crashed, normal):
        manifest = parse_manifest(h.object_bytes(keys.manifest_key(prefix, sid, h.instance(sid))))
        assert manifest.session_id == sid and manifest.image == "demo-game"
        assert manifest.last_status == ("dead" if sid == crashed else "exited")
        by_path = {i.path: i for i in manifest.items}
        # The artifact is exactly what the upstream served, under its documented key.
        replay = by_path[REPLAY]
        assert replay.outcome == "archived" and replay.key == keys.artifact_key(prefix, sid, REPLAY, h.instance(sid))
        assert replay.content_type == "application/gzip"
        expected = sha256_of(fake_service.artifact_bytes(TOKEN, sid, REPLAY))
        assert replay.sha256 == expected == sha256_of(h.object_bytes(replay.key))
        assert by_path[MISSING].outcome == "source_gone" and by_path[MISSING].key is None
        # The logs, gzip-compressed but otherwise as received.
        logs = by_path[None]
        assert logs.kind == "logs" and logs.key == keys.logs_key(prefix, sid, "txt", h.instance(sid))
        body = gzip.decompress(h.object_bytes(logs.key))
        assert body == render_text(fake_service.log_lines(TOKEN, sid))
        assert logs.sha256 == sha256_of(h.object_bytes(logs.key))
        # The index entry points at the manifest, partitioned by the end time.
        assert manifest.first_seen_ended is not None and manifest.last_seen_active is not None
        assert manifest.fetch_deadline == manifest.last_seen_active + 4 * 3600 - 600
        entry = parse_index_entry(
            h.object_bytes(keys.index_key(prefix, manifest.first_seen_ended, sid, h.instance(sid)))
        )
        assert entry.manifest_key == keys.manifest_key(prefix, sid, h.instance(sid))
    crash_manifest = parse_manifest(h.object_bytes(keys.manifest_key(prefix, crashed, h.instance(crashed))))
    assert {i.path: i.outcome for i in crash_manifest.items}["/srv/crash/core.txt"] == "archived"
    assert crash_manifest.labels == {"mode": "duel"}
    assert b"hunter2" not in h.object_bytes(keys.manifest_key(prefix, crashed, h.instance(crashed)))
    normal_manifest = parse_manifest(h.object_bytes(keys.manifest_key(prefix, normal, h.instance(normal))))
    assert normal_manifest.players == ("p1", "p2")
    assert {i.path: i.outcome for i in normal_manifest.items}["/srv/crash/core.txt"] == "source_gone"
    assert not list(s3_store.list_keys(keys.session_prefix(prefix, running)))

    assert h.items_total("artifact", "archived") == 3
    assert h.items_total("artifact", "source_gone") == 3
    assert h.items_total("logs", "archived") == 2
    assert h.registry.get_sample_value("archiver_sessions_ended_total") == 2
    assert h.registry.get_sample_value("archiver_pending_items", {"stage": "fetch"}) == 0
    assert h.registry.get_sample_value("archiver_spool_bytes") == 0
    assert not os.listdir(h.settings.state_dir / "spool")

    # A second pass (restart, polls, an explicit backfill) writes nothing new.
    before_keys = sorted(s3_store.list_keys(prefix))
    writes = s3_store.requests_made["PutObject"] + s3_store.requests_made["CreateMultipartUpload"]
    h.close()
    assert not h.pipeline.alive()
    again = harness_factory(fake_service, s3_store)
    again.poll()
    again.poll()
    assert again.pipeline.backfill([crashed, normal]) == []
    assert again.pipeline.run_until_idle(10)
    assert sorted(s3_store.list_keys(prefix)) == before_keys
    assert s3_store.requests_made["PutObject"] + s3_store.requests_made["CreateMultipartUpload"] == writes


def test_query_log_shapes_and_the_logs_fallback(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    fake_service.set_quirks(query_log_shape="ndjson")
    ndjson = fake_service.add_session(TOKEN, id="ndjson")
    h = harness_factory(fake_service, store, artifact_paths=())
    _end_all(h, [ndjson])
    assert h.pipeline.run_until_idle(20)
    stored = gzip.decompress(h.object_bytes(keys.logs_key("", ndjson, "jsonl", h.instance(ndjson))))
    assert stored == render_ndjson(fake_service.log_lines(TOKEN, ndjson))

    # /query/log answering 404 (not offered for this account): the logs come from /logs instead.
    fake_service.set_fault("GET /query/log", status=404, rate=1.0)
    fallback = fake_service.add_session(TOKEN, id="fallback")
    _end_all(h, [fallback])
    assert h.pipeline.run_until_idle(20)
    manifest = parse_manifest(h.object_bytes(keys.manifest_key("", fallback, h.instance(fallback))))
    (logs,) = manifest.items
    assert logs.outcome == "archived" and logs.source == "GET /logs?id=fallback&follow=false"
    assert gzip.decompress(h.object_bytes(logs.key or "")) == render_text(fake_service.log_lines(TOKEN, fallback))


def test_a_stream_broken_mid_body_is_fetched_again_before_the_deadline(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    sid = fake_service.add_session(TOKEN, id="flaky")
    fake_service.set_fault("GET /artifacts", kind="truncate", rate=1.0, count=2)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    _end_all(h, [sid])
    assert h.pipeline.run_until_idle(20)
    key = keys.artifact_key("", sid, REPLAY, h.instance(sid))
    assert sha256_of(h.object_bytes(key)) == sha256_of(fake_service.artifact_bytes(TOKEN, sid, REPLAY))
    assert h.items_total("artifact", "archived") == 1


HOSTILE_IDS = [
    "../../etc/passwd",
    "a/b",
    ".",
    "..",
    "./x",
    ".hidden",
    "päßwörd-🎮-試合",
    "x" * 300,
    "ctl\x01\x1f\n\tid",
    "q?x=1#frag%2F",
]


def test_hostile_session_ids_stay_under_the_prefix_and_round_trip(
    fake_service: FakeService, s3_store: ObjectStore, harness_factory: Callable[..., Harness]
) -> None:
    for sid in HOSTILE_IDS:
        fake_service.add_session(TOKEN, id=sid)
    h = harness_factory(fake_service, s3_store, artifact_paths=(REPLAY,))
    _end_all(h, HOSTILE_IDS)
    assert h.pipeline.run_until_idle(30)
    prefix = s3_store.prefix
    stored = list(s3_store.list_keys(""))
    assert stored and all(k.startswith(prefix + "sessions/") or k.startswith(prefix + "index/") for k in stored)
    assert all("/../" not in k and "/./" not in k for k in stored)
    found = {parse_manifest(h.object_bytes(k)).session_id for k in stored if k.endswith("/manifest.json")}
    assert found == set(HOSTILE_IDS)
    for sid in HOSTILE_IDS:
        m = parse_manifest(h.object_bytes(keys.manifest_key(prefix, sid, h.instance(sid))))
        assert [i.outcome for i in m.items] == ["archived", "archived"]


def test_a_store_down_longer_than_the_retention_window_loses_nothing_fetched(
    fake_service_factory: Callable[..., FakeService], tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    fake = fake_service_factory((TOKEN,), retention=3600.0)
    root = tmp_path / "store"
    root.mkdir()
    store = FileStore(root)
    ids = [fake.add_session(TOKEN, id=f"outage-{n}") for n in range(3)]
    h = harness_factory(fake, store, retention=3600.0, deadline_margin=60.0)
    away = tmp_path / "store-unmounted"
    root.rename(away)  # the store goes away (an unmounted volume): writes fail as unavailable
    _end_all(h, ids)

    def spooled_everything() -> bool:
        backlog = h.pipeline.gauges()
        return backlog.pending_fetch == 0 and backlog.pending_upload == 6

    assert _wait_for(h, spooled_everything, 20)
    assert h.registry.get_sample_value("archiver_pending_items", {"stage": "upload"}) == 6
    assert (h.registry.get_sample_value("archiver_spool_bytes") or 0) > 2 * MB
    # Far past the window: the upstream has removed the sessions, the store is still down.
    fake.advance(2 * 3600.0)
    with pytest.raises(Exception, match=r"404|not find"):
        h.client.describe_session(ids[0])
    assert not h.pipeline.run_until_idle(1.0)
    away.rename(root)  # the store is back
    assert h.pipeline.run_until_idle(30)
    for sid in ids:
        m = parse_manifest(h.object_bytes(keys.manifest_key("", sid, h.instance(sid))))
        assert {i.outcome for i in m.items} == {"archived", "source_gone"}
    assert h.items_total("artifact", "expired") == 0 and h.items_total("logs", "expired") == 0
    assert h.items_total("logs", "archived") == 3
    assert (h.registry.get_sample_value("archiver_errors_total", {"where": "store"}) or 0) >= 1


def _wait_for(h: Harness, condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` whenever the pipeline reports progress, up to `timeout` seconds."""
    return wait_until(condition, timeout, interval=0.2, pause=h.pipeline.run_until_idle)


def test_a_session_discovered_after_its_window_is_expired(
    fake_service_factory: Callable[..., FakeService], tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    fake = fake_service_factory((TOKEN,), retention=3600.0)
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    sid = fake.add_session(TOKEN, id="late")
    first = harness_factory(fake, store, start=False, retention=3600.0, deadline_margin=60.0)
    first.pipeline.recover()
    first.poll()  # seen active, then the archiver is down while the session ends and is removed
    first.close()
    fake.end_session(TOKEN, sid)
    fake.advance(3 * 3600.0)
    second = harness_factory(fake, store, retention=3600.0, deadline_margin=60.0)
    second.poll()
    assert second.pipeline.run_until_idle(20)
    m = parse_manifest(second.object_bytes(keys.manifest_key("", sid, second.instance(sid))))
    assert [i.outcome for i in m.items] == ["expired", "expired", "expired"]
    assert second.items_total("logs", "expired") == 1 and second.items_total("artifact", "expired") == 2


def test_an_artifact_over_the_limit_ends_too_large_without_memory_growth(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    big = "/srv/replays/huge.replay"
    sid = fake_service.add_session(TOKEN, id="huge", files={big: 150 * MB})
    h = harness_factory(fake_service, store, artifact_paths=(big,), max_artifact_size=100 * MB)
    tracemalloc.start()
    try:
        _end_all(h, [sid])
        assert h.pipeline.run_until_idle(60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Fake and archiver share this process: both stream, so the peak stays far below the body.
    assert peak < 32 * MB, peak
    m = parse_manifest(h.object_bytes(keys.manifest_key("", sid, h.instance(sid))))
    outcomes = {i.path: i.outcome for i in m.items}
    assert outcomes[big] == "too_large"
    assert h.items_total("artifact", "too_large") == 1
    assert not os.listdir(h.settings.state_dir / "spool")
    assert not list(store.list_keys(keys.session_prefix("", sid, h.instance(sid)) + "artifacts/"))


def test_status_lists_pending_items_with_time_left(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    sid = fake_service.add_session(TOKEN, id="pending")
    fake_service.set_fault("GET /artifacts", status=503, rate=1.0)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    _end_all(h, [sid])
    assert _wait_for(h, lambda: any(p.kind == "artifact" for p in h.pipeline.status()), 10)
    assert _wait_for(h, lambda: all(p.kind == "artifact" for p in h.pipeline.status()), 10)
    (item,) = h.pipeline.status()
    assert item.session_id == sid and item.stage == "fetch" and item.path == REPLAY
    assert item.time_left is not None and 4 * 3600 - 600 - 60 < item.time_left <= 4 * 3600 - 600
    h.pipeline.gauges()  # what the daemon calls before each scrape
    assert h.registry.get_sample_value("archiver_next_fetch_deadline_timestamp_seconds") == item.deadline
    fake_service.clear_faults()
    assert h.pipeline.run_until_idle(20)
    assert h.pipeline.status() == []
    assert json.loads(h.object_bytes(keys.manifest_key("", sid, h.instance(sid))))["items"][1]["outcome"] == "archived"


def test_a_session_missing_from_one_list_but_still_running_is_not_ended(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    sid = fake_service.add_session(TOKEN, id="listed-late")
    h = harness_factory(fake_service, FileStore(tmp_path / "store"), artifact_paths=(REPLAY,))
    h.poll()
    # One list that lacks it (an eventually consistent listing): the describe says it still runs.
    others = [s for s in h.client.list_sessions().sessions if s.id != sid]
    h.pipeline.observe_poll(others, fake_service.clock.now())
    assert _wait_for(h, lambda: _alive_checked(h, sid), 10)
    h.poll()
    row = h.state.latest(sid)
    assert row is not None and row.state == "active"
    assert h.state.items_of(row.key) == []
    assert h.registry.get_sample_value("archiver_sessions_ended_total") == 0


def _alive_checked(h: Harness, sid: str) -> bool:
    """The confirmer described the candidate and found it alive (no error recorded)."""
    with h.state.read() as db:
        attempts, error = db.execute(
            "SELECT confirm_attempts, last_error FROM sessions WHERE id = ?", (sid,)
        ).fetchone()
    return bool(attempts) and error is None


def test_backfill_archives_ended_sessions_inside_the_window_only(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    ended = fake_service.add_session(TOKEN, id="never-polled")
    running = fake_service.add_session(TOKEN, id="still-running")
    fake_service.end_session(TOKEN, ended)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,), reconcile=False)  # as `archiver archive`
    assert h.pipeline.backfill([ended, running, "no-such-session"]) == [ended]
    assert h.pipeline.run_until_idle(20)
    m = parse_manifest(h.object_bytes(keys.manifest_key("", ended, h.instance(ended))))
    assert [i.outcome for i in m.items] == ["archived", "archived"]
    assert m.fetch_deadline is not None and m.fetch_deadline > fake_service.clock.now()
    assert h.pipeline.backfill([ended]) == []  # already archived: nothing new
    assert h.state.latest(running) is None and h.state.latest("no-such-session") is None


@pytest.mark.parametrize(("follows", "warned"), [(5000, True), (100, False)])
def test_a_seal_delay_the_open_file_limit_leaves_no_room_for_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, follows: int, warned: bool
) -> None:
    """5,000 follows under a soft limit of 1,024 leave no open file to hold a seal: the delay would
    silently do nothing, so the start says so in one line; 100 follows leave room, and nothing is said."""
    settings = Settings(state_dir=tmp_path, follow_logs=True, follow_logs_max=follows, follow_logs_seal_sync_delay=20.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # lowering the soft limit is always allowed
    try:
        store = capture_store(settings)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    store.close()
    said = [r.getMessage() for r in caplog.records if "--follow-logs-seal-sync-delay has no effect" in r.getMessage()]
    assert len(said) == int(warned)
    assert not said or ("open-file limit (1024)" in said[0] and "5000 follows" in said[0])


@pytest.mark.parametrize(("followed", "held"), [(True, 1), (False, 0)])
def test_only_a_live_engine_s_capture_store_holds_seals_for_their_upload(
    tmp_path: Path, followed: bool, held: int
) -> None:
    """Without a live engine (`archiver archive`, live capture turned off) no checkpoint job would
    ever settle a held seal: that store syncs each seal at once, whatever the delay says."""
    settings = Settings(state_dir=tmp_path, follow_logs=True, follow_logs_max=10, follow_logs_seal_sync_delay=20.0)
    store = capture_store(settings, followed=followed)
    sealed_capture(store, "1:s", 2)
    assert store.seals_unsynced() == held
    store.close()
