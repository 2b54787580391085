"""Nothing lost, for real: end detection that survives downtime, list outages, flapping, poisoned
entries, id reuse and sessions that cannot be finalized (real fake service over loopback, real stores)."""

from __future__ import annotations

import gzip
import logging
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from archiver.archive.state import SCHEMA_VERSION, StateDB, read_status
from archiver.errors import ApiError
from archiver.fake import FakeService
from archiver.fake.logs import render_text
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_manifest
from archiver.store import FileStore, ObjectStore
from tests.fixtures_pipeline import REPLAY, TOKEN, Harness
from tests.support import wait_until


def _poll(h: Harness) -> bool:
    """One poll as the daemon does it: a failed list is reported as failed (None), never as empty."""
    try:
        h.poll()
    except ApiError:
        h.pipeline.observe_poll(None, h.fake.clock.now())
        return False
    return True


def _manifests(store: ObjectStore, sid: str) -> list[Manifest]:
    """Every archive of `sid` in the store (any instance, legacy layout included)."""
    found = [k for k in store.list_keys(keys.session_prefix(store.prefix, sid)) if k.endswith("/manifest.json")]
    return [parse_manifest(b"".join(store.iter_bytes(k))) for k in sorted(found)]


def _file_store(tmp_path: Path) -> FileStore:
    (tmp_path / "store").mkdir(exist_ok=True)
    return FileStore(tmp_path / "store")


def _end_and_archive(h: Harness, sid: str, *, archives: int = 1) -> None:
    """End `sid` upstream and poll that; then wait until the store holds its `archives` archives and
    the pipeline is idle."""
    h.fake.end_session(TOKEN, sid)
    assert _poll(h)
    wait_until(lambda: len(_manifests(h.store, sid)) == archives, timeout=60)
    assert h.pipeline.run_until_idle(60)


def _archived_once_and_complete(h: Harness, sid: str) -> Manifest:
    (manifest,) = _manifests(h.store, sid)
    assert manifest.session_id == sid
    assert all(i.outcome == "archived" for i in manifest.items), manifest.items
    logs = next(i for i in manifest.items if i.kind == "logs")
    assert logs.key is not None
    stored = gzip.decompress(b"".join(h.store.iter_bytes(logs.key)))
    assert stored == render_text(h.fake.log_lines(TOKEN, sid))
    return manifest


def test_sessions_born_and_ended_while_the_daemon_was_stopped_are_archived(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    seen = fake_service.add_session(TOKEN, id="seen-then-ended")
    first = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert _poll(first)
    first.close()  # the daemon stops (deploy, crash loop, node drain) ...
    born = [fake_service.add_session(TOKEN, id=f"born-while-down-{n}") for n in range(3)]
    fake_service.advance(10.0)
    for sid in [*born, seen]:
        fake_service.end_session(TOKEN, sid)
    fake_service.advance(20.0)  # ... for 30 s, while these started and ended
    second = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert _poll(second)  # the one it knew as active is gone from the list: confirmed as usual
    assert second.pipeline.reconciled_once.wait(60)
    assert second.pipeline.run_until_idle(60)
    for sid in [*born, seen]:
        manifest = _archived_once_and_complete(second, sid)
        assert manifest.last_status == "exited"
    # The one seen alive keeps the deadline of when it was last seen, not one made up now.
    seen_manifest = _manifests(store, seen)[0]
    assert seen_manifest.last_seen_active is not None and seen_manifest.fetch_deadline is not None
    assert seen_manifest.fetch_deadline == seen_manifest.last_seen_active + 4 * 3600 - 600
    assert second.registry.get_sample_value("archiver_reconciled_sessions_total") == 3


def test_sessions_born_and_ended_during_a_list_outage_are_archived(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert h.pipeline.reconciled_once.wait(60)  # the start-up reconciliation found nothing
    assert _poll(h)
    fake_service.set_fault("GET /session", status=503, rate=1.0)
    sid = fake_service.add_session(TOKEN, id="born-during-outage")
    for _ in range(3):  # 30 s of failed polls while it starts and ends
        assert not _poll(h)
        fake_service.advance(10.0)
    fake_service.end_session(TOKEN, sid)
    assert not _poll(h)
    fake_service.clear_faults()
    assert _poll(h)  # the first good poll after the gap asks for a reconciliation
    wait_until(lambda: bool(_manifests(store, sid)), timeout=60)
    assert h.pipeline.run_until_idle(60)
    assert _archived_once_and_complete(h, sid).last_status == "exited"


def test_a_flapping_session_is_not_ended_by_a_missing_entry_and_a_proxy_404(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Missing from one valid list, then an HTML 404 and a single JSON 404 from the describe: none
    of that is evidence of an end. When it really ends it is archived once, with its final status
    and its whole log."""
    store = _file_store(tmp_path)
    sid = fake_service.add_session(TOKEN, id="flapping")
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert _poll(h)
    fake_service.hide_from_list(TOKEN, sid, polls=1)
    fake_service.set_fault("GET /session/{id}", kind="html", status=404, rate=1.0, count=1)
    assert _poll(h)  # it is missing: a candidate
    wait_until(lambda: fake_service.request_count("GET /session/{id}") >= 2, timeout=60)
    fake_service.hide_from_list(TOKEN, sid, polls=1)
    fake_service.set_fault("GET /session/{id}", status=404, rate=1.0, count=1)
    assert _poll(h)
    wait_until(lambda: fake_service.request_count("GET /session/{id}") >= 4, timeout=60)
    assert _poll(h)  # listed again
    row = h.state.latest(sid)
    assert row is not None and row.state == "active", row
    assert h.registry.get_sample_value("archiver_sessions_ended_total") == 0
    fake_service.advance(60.0)
    _end_and_archive(h, sid)
    assert _archived_once_and_complete(h, sid).last_status == "exited"
    assert h.registry.get_sample_value("archiver_sessions_ended_total") == 1


def test_a_json_404_seen_twice_apart_ends_a_session_the_upstream_removed(
    fake_service_factory: Callable[..., FakeService], tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    fake = fake_service_factory((TOKEN,), retention=3600.0)
    store = _file_store(tmp_path)
    sid = fake.add_session(TOKEN, id="removed-while-away")
    h = harness_factory(fake, store, artifact_paths=(REPLAY,), retention=3600.0, deadline_margin=60.0)
    assert _poll(h)
    fake.end_session(TOKEN, sid)
    fake.advance(2 * 3600.0)  # removed: every request for it answers the API's own 404
    assert _poll(h)
    assert h.pipeline.run_until_idle(60)
    (manifest,) = _manifests(store, sid)
    assert {i.outcome for i in manifest.items} == {"expired"}
    assert fake.request_count("GET /session/{id}") >= 2  # one 404 alone never ends a session


def test_a_session_listed_again_after_a_false_end_gets_its_real_end_archived(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Two JSON 404s (a misbehaving upstream) end a running session; when it is listed again it is
    re-opened, and its real end is archived as a second archive beside the premature one."""
    store = _file_store(tmp_path)
    sid = fake_service.add_session(TOKEN, id="false-end")
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert _poll(h)
    fake_service.hide_from_list(TOKEN, sid, polls=1)
    fake_service.set_fault("GET /session/{id}", status=404, rate=1.0, count=2)
    assert _poll(h)
    wait_until(lambda: (r := h.state.latest(sid)) is not None and r.state not in ("active", "candidate"), timeout=60)
    assert _poll(h)  # listed again: re-opened
    assert h.registry.get_sample_value("archiver_sessions_reopened_total") == 1
    fake_service.advance(60.0)
    fake_service.end_session(TOKEN, sid)
    assert _poll(h)
    wait_until(lambda: any(m.last_status == "exited" for m in _manifests(store, sid)), timeout=60)
    assert h.pipeline.run_until_idle(60)
    final = [m for m in _manifests(store, sid) if m.last_status == "exited"]
    assert len(final) == 1 and all(i.outcome == "archived" for i in final[0].items)
    row = h.state.latest(sid)
    assert row is not None and row.state == "archived" and row.instance.endswith("-r1")


def test_a_reused_session_id_gets_an_archive_per_instance(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    sid = fake_service.add_session(TOKEN, id="match-1")
    assert _poll(h)
    _end_and_archive(h, sid)
    fake_service.advance(5 * 3600.0)  # the first one is removed upstream; the caller reuses its id
    fake_service.add_session(TOKEN, id="match-1")
    assert _poll(h)
    fake_service.advance(30.0)
    _end_and_archive(h, sid, archives=2)
    first, second = sorted(_manifests(store, sid), key=lambda m: m.created)
    assert first.created < second.created
    assert all(i.outcome == "archived" for m in (first, second) for i in m.items)
    rows = h.state.sessions_by_id(sid)
    assert {r.instance for r in rows} == {
        keys.instance_name(first.created * 1000),
        keys.instance_name(second.created * 1000),
    }


def test_a_session_whose_finalization_keeps_failing_never_blocks_the_others(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Its manifest cannot be built (a value out of range in its row): it is backed off on its own,
    every other session is archived, and once its deadline passed it ends `failed`, with the
    reason kept for `archiver status` and counted."""
    store = _file_store(tmp_path)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,), retention=300.0, deadline_margin=60.0)
    bad = fake_service.add_session(TOKEN, id="aaa-poisoned")  # sorts first
    good = [fake_service.add_session(TOKEN, id=f"good-{n}") for n in range(3)]
    assert _poll(h)
    with h.state.write() as db:  # what a value out of range did before the edge checked it
        db.execute("UPDATE sessions SET created = 1e300 WHERE id = ?", (bad,))
    for sid in [bad, *good]:
        fake_service.end_session(TOKEN, sid)
    assert _poll(h)
    wait_until(lambda: all(_manifests(store, sid) for sid in good), timeout=60)
    wait_until(lambda: (r := h.state.latest(bad)) is not None and r.finalize_attempts >= 2, timeout=60)
    row = h.state.latest(bad)
    assert row is not None and row.state == "finalizing" and row.last_error  # backed off, not given up yet
    fake_service.advance(600.0)  # past its deadline
    wait_until(lambda: (r := h.state.latest(bad)) is not None and r.state == "failed", timeout=60)
    assert h.registry.get_sample_value("archiver_sessions_failed_total") == 1
    failed = h.state.failed_sessions()
    assert [r.id for r in failed] == [bad] and "ValueError" in (failed[0].last_error or "")
    assert h.state.backlog().idle
    (shown,) = read_status(h.settings.state_dir, fake_service.clock.now())  # what `archiver status` prints
    assert (shown.session_id, shown.stage) == (bad, "failed") and "ValueError" in (shown.last_error or "")


def test_archived_rows_are_pruned_and_a_pruned_session_is_never_archived_again(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,), prune_after=8 * 3600.0)
    sid = fake_service.add_session(TOKEN, id="old-match")
    assert _poll(h)
    _end_and_archive(h, sid)
    assert h.pipeline.reconcile() == 0  # still listed with all=true, already archived: nothing to do
    fake_service.advance(9 * 3600.0)
    assert h.pipeline.reconcile() == 0
    assert h.state.latest(sid) is None  # pruned: the store is the record
    assert len(_manifests(store, sid)) == 1


def test_on_first_start_skip_archives_only_what_ends_from_then_on(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    old = fake_service.add_session(TOKEN, id="ended-before-install")
    fake_service.end_session(TOKEN, old)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,), on_first_start="skip")
    assert h.pipeline.reconciled_once.wait(60)
    new = fake_service.add_session(TOKEN, id="ends-after-install")
    assert _poll(h)
    _end_and_archive(h, new)
    assert _manifests(store, old) == []
    row = h.state.latest(old)
    assert row is not None and row.state == "skipped"


_V1_SCHEMA = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, image TEXT NOT NULL, tag TEXT NOT NULL DEFAULT '',
    location TEXT NOT NULL DEFAULT '', host TEXT NOT NULL DEFAULT '', created REAL,
    labels TEXT NOT NULL DEFAULT '{}', players TEXT NOT NULL DEFAULT '[]', player_count INTEGER,
    status TEXT NOT NULL DEFAULT 'unknown', state TEXT NOT NULL, last_seen_active REAL,
    first_seen_ended REAL, fetch_deadline REAL, archived_at REAL, manifest_key TEXT,
    wake_at REAL NOT NULL DEFAULT 0, confirm_attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT);
CREATE INDEX sessions_by_state ON sessions(state, wake_at);
CREATE TABLE items (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
    kind TEXT NOT NULL, path TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, outcome TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, deadline REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0, source TEXT NOT NULL, key TEXT, spool_path TEXT, size INTEGER,
    sha256 TEXT, content_type TEXT, fetched_at REAL, UNIQUE (session_id, kind, path));
CREATE INDEX items_by_status ON items(status, deadline);
CREATE TABLE multipart_uploads (key TEXT PRIMARY KEY, upload_id TEXT NOT NULL, sha256 TEXT NOT NULL,
    part_size INTEGER NOT NULL);
CREATE TABLE multipart_parts (key TEXT NOT NULL REFERENCES multipart_uploads(key) ON DELETE CASCADE,
    number INTEGER NOT NULL, etag TEXT NOT NULL, PRIMARY KEY (key, number));
PRAGMA user_version=1;
"""


def test_a_schema_1_state_db_is_migrated_with_work_in_flight_kept_on_the_legacy_layout(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.executescript(_V1_SCHEMA)
    conn.execute(
        "INSERT INTO sessions (id, image, created, state, last_seen_active) VALUES ('running', 'g', 1700000000.5, "
        "'active', 10)"
    )
    conn.execute("INSERT INTO sessions (id, image, created, state) VALUES ('mid-way', 'g', 1700000001.25, 'ended')")
    conn.execute(
        "INSERT INTO items (session_id, kind, status, deadline, source, key) VALUES "
        "('mid-way', 'logs', 'spooled', 99, 'GET /query/log', 'sessions/mid-way/logs.txt.gz')"
    )
    conn.commit()
    conn.close()
    state = StateDB.open(tmp_path)
    assert not state.created
    running, mid_way = state.latest("running"), state.latest("mid-way")
    assert running is not None and running.key == "1700000000500:running"
    assert running.instance == keys.instance_name(1700000000500) and running.state == "active"
    assert mid_way is not None and mid_way.instance == "" and mid_way.state == "ended"
    (item,) = state.items_of(mid_way.key)
    assert item.status == "spooled" and item.instance == "" and item.key == "sessions/mid-way/logs.txt.gz"
    with state.read() as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    state.close()


def test_a_fleet_with_poisoned_entries_archives_every_good_session_within_one_poll_of_its_end(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """Entries with values out of range are left out of the poll; every other session goes on,
    and a known session whose entry turns bad is not taken for ended."""
    store = _file_store(tmp_path)
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    good = [fake_service.add_session(TOKEN, id=f"good-{n}") for n in range(4)]
    poisoned = {"id": "turns-bad", "image": "demo-game", "location": "eu-west-1", "created": 1.7e15,
                "status": "running", "playerCount": 2}  # fmt: skip
    fake_service.inject_list_entries(
        TOKEN,
        [
            {"id": "huge", "image": "g", "location": "l", "created": 1.7e12, "playerCount": 1e30},
            {"id": "quoted", "image": "g", "location": "l", "created": 1.7e12, "playerCount": "1e25"},
            {"id": "bad\ud800", "image": "g", "location": "l", "created": 1.7e12},
            {"id": "", "image": "g", "location": "l", "created": 1.7e12},
            {"id": "negative", "image": "g", "location": "l", "created": -5},
        ],
    )
    assert _poll(h)
    for n, sid in enumerate(good):
        fake_service.end_session(TOKEN, sid)
        assert _poll(h)  # the poll right after its end sees it gone
        wait_until(lambda sid=sid: bool(_manifests(store, sid)), timeout=60, message=str(n))  # type: ignore[misc]
    assert h.pipeline.run_until_idle(60)
    for sid in good:
        _archived_once_and_complete(h, sid)
    # A session we know, whose entry turns bad: still listed (by id), never ended for it.
    known = fake_service.add_session(TOKEN, id="turns-bad")
    assert _poll(h)
    fake_service.hide_from_list(TOKEN, known, polls=3)
    fake_service.inject_list_entries(TOKEN, [poisoned])
    for _ in range(3):
        assert _poll(h)
    row = h.state.latest(known)
    assert row is not None and row.state == "active"
    assert h.registry.get_sample_value("archiver_sessions_ended_total") == len(good)


def test_the_last_archive_time_is_restored_after_a_restart(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    store = _file_store(tmp_path)
    first = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    sid = fake_service.add_session(TOKEN, id="before-restart")
    assert _poll(first)
    _end_and_archive(first, sid)
    written = first.registry.get_sample_value("archiver_last_archive_success_timestamp_seconds")
    assert written
    first.close()
    second = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    assert second.registry.get_sample_value("archiver_last_archive_success_timestamp_seconds") == written


class _Body:
    """The raw body of a canned botocore response."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *_: object, **__: object) -> Iterator[bytes]:
        yield self.data

    def read(self, *_: object) -> bytes:
        return self.data


def test_a_store_without_multipart_listing_still_archives_everything(
    fake_service: FakeService,
    moto_endpoint: str,
    s3_client: Callable[..., Any],
    harness_factory: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Some S3-compatible servers answer `501 NotImplemented` to ListMultipartUploads: the sweep of
    orphaned uploads (housekeeping) is skipped with a warning, and archiving goes on."""
    from botocore.awsrequest import AWSResponse

    from archiver.store import open_store

    bucket = f"nolist-{uuid.uuid4().hex[:12]}"
    client = s3_client()
    client.create_bucket(Bucket=bucket)
    refused: list[str] = []

    def not_implemented(request: Any, **_: Any) -> AWSResponse:
        refused.append(request.url)
        body = b"<Error><Code>NotImplemented</Code><Message>A header you provided implies functionality that is not implemented</Message></Error>"  # noqa: E501
        return AWSResponse(request.url, 501, {"Content-Type": "application/xml"}, _Body(body))

    client.meta.events.register("before-send.s3.ListMultipartUploads", not_implemented)
    store = open_store(f"s3://{bucket}/archive/", s3_client=client)
    caplog.set_level(logging.WARNING, logger="archiver.pipeline")
    h = harness_factory(fake_service, store, artifact_paths=(REPLAY,))
    ids = [fake_service.add_session(TOKEN, id=f"no-list-{n}") for n in range(3)]
    assert _poll(h)
    for sid in ids:
        fake_service.end_session(TOKEN, sid)
    assert _poll(h)
    wait_until(lambda: all(_manifests(store, sid) for sid in ids), timeout=60)
    assert h.pipeline.run_until_idle(60)
    for sid in ids:
        _archived_once_and_complete(h, sid)
    assert refused, "the sweep never asked"
    assert any("skipping the sweep of orphaned multipart uploads" in r.getMessage() for r in caplog.records)
