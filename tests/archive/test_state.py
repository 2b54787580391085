"""The state DB: schema and durability settings, end detection from list polls, item claims, the journal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline, Tuning
from archiver.archive.spool import Spool
from archiver.archive.state import DB_NAME, SCHEMA_VERSION, StateDB
from archiver.config.settings import Settings
from archiver.errors import StateError
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import FileStore
from archiver.vocabulary import ItemStatus, Outcome
from tests.support import committed_statuses, ended, listed_key, listed_session, uploading


def _pipeline(tmp_path: Path, **tuning: float) -> Pipeline:
    settings = Settings(state_dir=tmp_path / "state")
    (tmp_path / "store").mkdir(exist_ok=True)
    state = StateDB.open(settings.state_dir)
    # observe_poll never talks to the upstream: the client is not needed for detection.
    return Pipeline(
        settings,
        None,  # type: ignore[arg-type]
        FileStore(tmp_path / "store"),
        state,
        SelfMetrics(CollectorRegistry()),
        tuning=Tuning(**tuning),  # type: ignore[arg-type]
    )


def test_new_db_uses_wal_full_sync_and_a_versioned_schema(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    conn = sqlite3.connect(tmp_path / DB_NAME)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with state.write() as db:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    state.close()
    StateDB.open(tmp_path).close()  # reopening an existing DB keeps it


def test_a_db_from_a_newer_archiver_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    StateDB.open(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StateError, match="newer archiver"):
        StateDB.open(tmp_path)


def test_readonly_open_of_a_missing_db_says_so(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no state DB"):
        StateDB.open_readonly(tmp_path)


def test_a_session_missing_from_a_successful_poll_becomes_a_candidate(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    p.observe_poll([listed_session(1), listed_session(2)], 100.0)
    p.observe_poll([listed_session(1)], 110.0)
    gone = p.state.latest("sess-00002")
    assert gone is not None and gone.state == "candidate"
    assert gone.last_seen_active == 100.0 and gone.first_seen_ended == 110.0
    assert p.state.latest("sess-00001").state == "active"  # type: ignore[union-attr]


def test_a_failed_poll_never_ends_a_session(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    p.observe_poll([listed_session(1)], 100.0)
    p.observe_poll(None, 110.0)
    p.observe_poll(None, 120.0)
    assert p.state.latest("sess-00001").state == "active"  # type: ignore[union-attr]


def test_a_candidate_listed_again_is_active_again(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    p.observe_poll([listed_session(1)], 100.0)
    p.observe_poll([], 110.0)
    p.observe_poll([listed_session(1)], 120.0)
    row = p.state.latest("sess-00001")
    assert row is not None and row.state == "active" and row.first_seen_ended is None
    assert row.last_seen_active == 120.0


def test_sessions_active_before_a_restart_and_absent_after_it_are_candidates(tmp_path: Path) -> None:
    first = _pipeline(tmp_path)
    first.observe_poll([listed_session(1), listed_session(2)], 100.0)
    first.state.close()
    second = _pipeline(tmp_path)
    second.recover()
    second.observe_poll([listed_session(1)], 5000.0)
    row = second.state.latest("sess-00002")
    # Its last_seen_active is the persisted one (never later than the truth): the safe deadline.
    assert row is not None and row.state == "candidate" and row.last_seen_active == 100.0
    assert second.state.latest("sess-00001").state == "active"  # type: ignore[union-attr]


def test_last_seen_is_persisted_as_one_list_mark_at_most_every_interval(tmp_path: Path) -> None:
    first = _pipeline(tmp_path, last_seen_persist_interval=30.0)
    for now in (100.0, 110.0, 131.0, 140.0):  # the mark moves at 100 and 131 only
        first.observe_poll([listed_session(1), listed_session(2)], now)
    # In this process, disappearing writes the exact in-memory value, not the persisted mark.
    first.observe_poll([listed_session(2)], 150.0)
    assert first.state.latest("sess-00001").last_seen_active == 140.0  # type: ignore[union-attr]
    first.state.close()
    second = _pipeline(tmp_path, last_seen_persist_interval=30.0)
    second.recover()
    second.observe_poll([], 5000.0)
    # After a restart, the mark: sess-00002 was listed at 131 (the row itself still says 100).
    row = second.state.latest("sess-00002")
    assert row is not None and row.state == "candidate" and row.last_seen_active == 131.0


def test_persisting_last_seen_writes_one_row_whatever_the_number_of_running_sessions(tmp_path: Path) -> None:
    p = _pipeline(tmp_path, last_seen_persist_interval=30.0)
    fleet = [listed_session(i) for i in range(5_000)]
    p.observe_poll(fleet, 100.0)
    with p.state.write() as db:
        before = db.total_changes
    p.observe_poll(fleet, 131.0)  # persists last seen
    with p.state.write() as db:
        assert db.total_changes - before == 1


def test_a_schema_4_state_db_gets_the_list_mark_and_its_active_rows_keep_their_last_seen(tmp_path: Path) -> None:
    first = _pipeline(tmp_path)
    first.observe_poll([listed_session(1)], 100.0)
    first.state.close()
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as conn:  # as schema 4 left it
        conn.execute("DROP TABLE list_mark")
        conn.execute("PRAGMA user_version = 4")
    second = _pipeline(tmp_path)
    second.recover()
    second.observe_poll([], 5000.0)
    row = second.state.latest("sess-00001")
    assert row is not None and row.state == "candidate" and row.last_seen_active == 100.0
    second.state.close()
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6


def test_a_schema_5_state_db_loses_its_redundant_index_and_still_finds_a_session_s_items(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a",))
    with state.write() as db:  # as schema 5 left it
        db.execute("CREATE INDEX items_by_session ON items(session_key)")
        db.execute("PRAGMA user_version = 5")
    state.close()
    state = StateDB.open(tmp_path)
    key = listed_key("sess-00001")
    assert [i.path for i in state.items_of(key)] == ["", "/a"]  # the logs first
    with sqlite3.connect(tmp_path / DB_NAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
        assert not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'items_by_session'").fetchall()
        plan = " ".join(
            r[3] for r in conn.execute("EXPLAIN QUERY PLAN SELECT id FROM items WHERE session_key = ?", (key,))
        )
        assert "INDEX sqlite_autoindex_items_1 (session_key=?)" in plan
    state.close()


def test_changed_metadata_is_written_and_player_churn_is_not(tmp_path: Path) -> None:
    p = _pipeline(tmp_path, last_seen_persist_interval=1e9)
    p.observe_poll([listed_session(1)], 100.0)
    p.observe_poll([listed_session(1, players=7)], 110.0)
    p.observe_poll([listed_session(1, label="ranked")], 120.0)
    row = p.state.latest("sess-00001")
    assert row is not None and row.labels == {"mode": "ranked"} and row.last_seen_active == 120.0


def test_a_steady_state_poll_of_10k_sessions_writes_nothing_for_player_churn(tmp_path: Path) -> None:
    """Steady-state polls write only what changed; the time budget lives in benchmarks/state.py."""
    p = _pipeline(tmp_path)
    p.observe_poll([listed_session(i) for i in range(10_000)], 100.0)
    with p.state.write() as db:
        before = db.total_changes
    for k in range(3):
        p.observe_poll([listed_session(i, players=k) for i in range(10_000)], 101.0 + k)
    with p.state.write() as db:
        assert db.total_changes == before


def _spool_all(state: StateDB) -> None:
    """Claim and spool every item waiting for its fetch."""
    while (item := state.claim_fetch(0.0)) is not None:
        state.mark_spooled(
            item.id, spool_path=f"/spool/{item.id}", size=1, sha256="0" * 64, content_type="t", source="s",
            key=f"k/{item.id}", fetched_at=3.0,
        )  # fmt: skip


def test_fetch_claims_go_earliest_deadline_first_and_respect_retry_gates(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0)
    ended(state, "sess-00002", 500.0)
    ended(state, "sess-00003", 700.0)
    first = state.claim_fetch(0.0)
    assert first is not None and first.session_id == "sess-00002" and first.attempts == 1
    state.retry_item(first.id, status="pending_fetch", not_before=50.0, error="boom")
    assert state.claim_fetch(10.0).session_id == "sess-00003"  # type: ignore[union-attr]
    assert state.claim_fetch(10.0).session_id == "sess-00001"  # type: ignore[union-attr]
    assert state.claim_fetch(10.0) is None
    again = state.claim_fetch(60.0)
    assert again is not None and again.id == first.id and again.attempts == 2


def test_upload_claims_go_earliest_deadline_first_with_a_sessions_items_together_and_respect_retry_gates(
    tmp_path: Path,
) -> None:
    """Deadline order is the status index's own, so a claim sorts nothing (issue 14)."""
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a",))
    ended(state, "sess-00002", 500.0, ("/a",))
    _spool_all(state)
    first = state.claim_upload(0.0)
    assert first is not None and first.session_id == "sess-00002" and first.status == "uploading"
    state.retry_item(first.id, status="spooled", not_before=50.0, error="store down")
    claimed = [state.claim_upload(10.0) for _ in range(3)]
    assert [c.session_id if c else None for c in claimed] == ["sess-00002", "sess-00001", "sess-00001"]
    assert state.claim_upload(10.0) is None
    again = state.claim_upload(60.0)
    assert again is not None and again.id == first.id
    state.close()


def test_the_next_gate_after_now_skips_open_gates_so_an_idle_worker_waits_for_a_closed_one(tmp_path: Path) -> None:
    """A spooled item whose gate is open but which another worker holds must not make an idle
    upload worker wake at once, again and again: with ``after``, only the gates still closed count."""
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a", "/b"))
    _spool_all(state)
    held = state.claim_upload(10.0)
    retried = state.claim_upload(10.0)
    assert held is not None and retried is not None
    state.retry_item(held.id, status="spooled", not_before=5.0, error="store down", instance=held.instance)
    state.retry_item(retried.id, status="spooled", not_before=50.0, error="store down", instance=retried.instance)
    assert state.next_gate(ItemStatus.SPOOLED) == 0.0  # the third item's: never closed
    assert state.next_gate(ItemStatus.SPOOLED, after=10.0) == 50.0  # open ones (0, 5) skipped
    assert state.next_gate(ItemStatus.SPOOLED, after=60.0) is None
    state.close()


def test_restart_puts_in_flight_items_back(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a", "/b"))
    fetching = state.claim_fetch(0.0)
    second = state.claim_fetch(0.0)
    assert fetching is not None and second is not None
    state.mark_spooled(
        second.id,
        spool_path="/x",
        size=1,
        sha256="0" * 64,
        content_type="t",
        source="s",
        key="k",
        fetched_at=3,
    )
    claimed = state.claim_upload(0.0)
    assert claimed is not None and state.claim_upload(0.0) is None
    state.close()
    state = StateDB.open(tmp_path)  # a restart: fetch claims are rows, upload claims were memory
    assert state.reset_in_flight() == (1, 0)
    statuses = sorted(i.status for i in state.items_of(listed_key("sess-00001")))
    assert statuses == ["pending_fetch", "pending_fetch", "spooled"]
    again = state.claim_upload(0.0)
    assert again is not None and again.id == claimed.id
    state.close()


def test_an_uploading_row_an_older_archiver_left_is_spooled_again_at_start(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    (item,) = uploading(state, Spool(tmp_path / "spool"), "sess-00001")
    with state.write() as db:
        db.execute("UPDATE items SET status = 'uploading' WHERE id = ?", (item.id,))
    state.close()
    state = StateDB.open(tmp_path)
    assert state.reset_in_flight() == (0, 1)
    assert [i.status for i in state.items_of(item.session_key)] == ["spooled"]
    state.close()


def test_an_upload_claim_is_this_process_s_and_leaves_the_row_spooled(tmp_path: Path) -> None:
    """Issue 35: claiming an upload writes nothing (the WAL does not grow); two claims never take
    one item; an outcome committed lets the claim go, and a claim handed back frees the item."""
    state = StateDB.open(tmp_path)
    first, second = uploading(state, Spool(tmp_path / "spool"), "sess-00001", ("/a",))
    state.release_uploads([second])
    wal = (tmp_path / "state.db-wal").stat().st_size
    again = state.claim_upload(0.0)
    assert again is not None and again.id == second.id and state.claim_upload(0.0) is None
    assert (tmp_path / "state.db-wal").stat().st_size == wal
    assert committed_statuses(tmp_path) == {first.id: "spooled", second.id: "spooled"}
    assert state.finish_item(first.id, "archived", now=5.0, instance=first.instance) is False
    assert state.finish_item(first.id, "archived", now=6.0, instance=first.instance) is False  # once
    assert state.claim_upload(0.0) is None
    assert committed_statuses(tmp_path) == {first.id: "done", second.id: "spooled"}
    state.close()


def test_the_last_item_finishing_fixes_archived_at_for_the_manifest(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a",))
    a, b = state.claim_fetch(0.0), state.claim_fetch(0.0)
    assert a is not None and b is not None
    assert state.finish_item(a.id, "source_gone", now=10.0, error="404") is False
    assert state.finish_item(b.id, "too_large", now=11.0, error="big") is True
    row = state.latest("sess-00001")
    assert row is not None and row.state == "finalizing" and row.archived_at == 11.0
    assert state.mark_archived(listed_key("sess-00001"), "sessions/sess-00001/manifest.json")
    assert state.outcome_counts() == {("logs", "source_gone"): 1, ("artifact", "too_large"): 1}


def test_a_worker_still_holding_an_item_of_a_reopened_session_cannot_finish_its_successor(tmp_path: Path) -> None:
    """A re-open drops the session's unfinished items and its real end creates new ones, which SQLite
    gives the very same ids: the stale worker's outcome must not land on them."""
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0)
    stale = state.claim_fetch(0.0)
    assert stale is not None
    ended(state, "sess-00001", 900.0)  # listed again (re-opened), then really ended
    (fresh,) = state.items_of(listed_key("sess-00001"))
    assert fresh.id == stale.id and fresh.status == "pending_fetch" and fresh.instance != stale.instance
    assert state.finish_item(stale.id, Outcome.ARCHIVED, now=10.0, instance=stale.instance) is False
    claimed = state.claim_fetch(0.0)
    assert claimed is not None and claimed.id == stale.id
    assert state.finish_item(stale.id, Outcome.ARCHIVED, now=10.0, instance=stale.instance) is False
    (after,) = state.items_of(listed_key("sess-00001"))
    assert after.status == "fetching" and after.outcome is None
    assert state.finish_item(claimed.id, Outcome.SOURCE_GONE, now=11.0, instance=claimed.instance) is True


def test_the_multipart_journal_survives_a_reopen(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path)
    state.journal.start("k/obj", "upload-1", sha256="a" * 64, part_size=8 << 20)
    state.journal.part_done("k/obj", 1, '"etag-1"')
    state.journal.part_done("k/obj", 2, '"etag-2"')
    state.close()
    reopened = StateDB.open(tmp_path)
    entry = reopened.journal.get("k/obj")
    assert entry is not None and entry.upload_id == "upload-1" and entry.part_size == 8 << 20
    assert dict(entry.parts) == {1: '"etag-1"', 2: '"etag-2"'}
    assert reopened.journal.upload_ids() == {"upload-1"}
    reopened.journal.start("k/obj", "upload-2", sha256="b" * 64, part_size=8 << 20)
    assert dict(reopened.journal.get("k/obj").parts) == {}  # type: ignore[union-attr]
    reopened.journal.finish("k/obj")
    assert reopened.journal.get("k/obj") is None and reopened.journal.upload_ids() == set()


def test_a_late_retry_never_undoes_an_item_that_already_reached_its_outcome(tmp_path: Path) -> None:
    """An error raised after an item's final write (gauges, metrics) sends the worker to its retry
    path; that must leave the committed outcome alone."""
    state = StateDB.open(tmp_path)
    ended(state, "sess-00001", 900.0, ("/a",))
    a, b = state.claim_fetch(0.0), state.claim_fetch(0.0)
    assert a is not None and b is not None
    state.finish_item(a.id, "source_gone", now=10.0, error="404")
    state.retry_item(a.id, status="pending_fetch", not_before=0.0, error="late failure")
    state.retry_item(b.id, status="pending_fetch", not_before=0.0, error="in flight")
    statuses = {i.id: (i.status, i.outcome) for i in state.items_of(listed_key("sess-00001"))}
    assert statuses[a.id] == ("done", "source_gone")
    assert statuses[b.id] == ("pending_fetch", None)
