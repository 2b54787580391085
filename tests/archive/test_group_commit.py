"""Group commit of upload outcomes (issue 14): workers hand a stored object over and go on, one
transaction records every outcome handed over meanwhile, and a spool file goes only after the commit
that no longer needs it. Crashes around the commit are in `test_crash_recovery.py` (the point
`after_outcome_commit`) and `test_state_machine.py` (rules `burst` and `commit`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from archiver.archive.outcomes import OutcomeCommitter
from archiver.archive.spool import Spool
from archiver.archive.stage import UPLOAD, Wakeups
from archiver.archive.state import StateDB, StoredOutcome
from archiver.fake import FakeService
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import FileStore
from tests.fixtures_pipeline import TOKEN, Harness
from tests.support import committed_statuses, ended, uploading, wait_until


def _committer(tmp_path: Path) -> tuple[StateDB, Spool, CollectorRegistry, Wakeups, OutcomeCommitter]:
    state = StateDB.open(tmp_path / "state")
    spool = Spool(tmp_path / "state" / "spool")
    registry = CollectorRegistry()
    wake = Wakeups(idle_wait=30.0)
    return state, spool, registry, wake, OutcomeCommitter(state, spool, SelfMetrics(registry), wake, lambda: 50.0)


def test_outcomes_handed_over_meanwhile_share_one_commit_and_their_spool_files_go_only_after_it(
    tmp_path: Path,
) -> None:
    state, spool, registry, wake, committer = _committer(tmp_path)
    items = uploading(state, spool, "sess-00001", ("/a", "/b"))
    committer.defer()  # as while the committer thread runs: the workers do not wait
    for item in items:
        committer.hand_over(item, Path(item.spool_path or ""))
    assert committer.pending() == 3
    assert set(committed_statuses(tmp_path / "state").values()) == {"spooled"}  # the claims are in memory
    assert all(Path(item.spool_path or "").is_file() for item in items)

    woken = wake.snapshot(UPLOAD)
    assert committer.commit_pending() == 3  # all three in one batch
    assert set(committed_statuses(tmp_path / "state").values()) == {"done"}
    assert not any(Path(item.spool_path or "").exists() for item in items)
    session = state.latest("sess-00001")
    assert session is not None and session.state == "finalizing" and session.archived_at == 50.0
    assert state.outcome_counts() == {("logs", "archived"): 1, ("artifact", "archived"): 2}
    assert registry.get_sample_value("archiver_items_total", {"kind": "artifact", "outcome": "archived"}) == 2
    assert wake.snapshot(UPLOAD) == woken + 1  # the upload workers are woken once, for finalization
    assert committer.commit_pending() == 0
    state.close()


def test_an_outcome_lands_only_on_an_item_still_in_flight_and_a_spool_file_a_row_needs_stays(
    tmp_path: Path,
) -> None:
    """The item put back to `spooled` meanwhile (a worker's edge) keeps its file for the next upload;
    one of another instance (a re-open) is not touched; an open item reusing a dropped item's id
    (and so its spool file name) while it fetches keeps that name; a file no row refers to any more
    may go."""
    state, spool, _, _, _ = _committer(tmp_path)
    taken, put_back = uploading(state, spool, "sess-00001", ("/a",))
    (other,) = uploading(state, spool, "sess-00002")
    state.retry_item(put_back.id, status="spooled", not_before=0.0, error="edge")
    ended(state, "sess-00003", 900.0, ())
    fetching = state.claim_fetch(0.0)
    assert fetching is not None and fetching.spool_path is None
    orphan = StoredOutcome(9999, "", str(spool.final_path(9999)))
    stale = StoredOutcome(other.id, "an-older-instance", other.spool_path or "")
    reused = StoredOutcome(fetching.id, "an-older-instance", str(spool.final_path(fetching.id)))
    applied, removable = state.finish_uploads(
        [StoredOutcome(taken.id, taken.instance, taken.spool_path or ""),
         StoredOutcome(put_back.id, put_back.instance, put_back.spool_path or ""), stale, reused, orphan],
        now=60.0,
    )  # fmt: skip
    assert applied == {taken.id}
    assert removable == [taken.spool_path, orphan.spool_path]
    assert committed_statuses(tmp_path / "state") == {
        taken.id: "done", put_back.id: "spooled", other.id: "spooled", fetching.id: "fetching",
    }  # fmt: skip
    assert state.claim_upload(0.0) == dataclasses.replace(put_back, status="uploading", last_error="edge")
    assert state.claim_upload(0.0) is None  # `other` is still claimed: a stale outcome frees nothing
    session = state.latest("sess-00001")
    assert session is not None and session.state == "ended"  # one item is still open
    state.close()


def test_the_committer_thread_commits_hand_overs_and_once_it_stops_a_worker_commits_its_own(tmp_path: Path) -> None:
    state, spool, _, wake, committer = _committer(tmp_path)
    first, second = uploading(state, spool, "sess-00001", ("/a",))
    stop = threading.Event()
    thread = threading.Thread(target=committer.run, args=(stop,), daemon=True)
    thread.start()
    generation = wake.snapshot(UPLOAD)
    committer.hand_over(first, Path(first.spool_path or ""))
    wake.wait(generation, 30.0, UPLOAD)  # the committer wakes the upload workers after its commit
    assert committed_statuses(tmp_path / "state")[first.id] == "done"
    assert not Path(first.spool_path or "").exists()

    stop.set()
    committer.wake()
    thread.join(30.0)
    assert not thread.is_alive()
    committer.hand_over(second, Path(second.spool_path or ""))  # no thread: committed before it returns
    assert committed_statuses(tmp_path / "state")[second.id] == "done"
    assert not Path(second.spool_path or "").exists()
    state.close()


def test_the_committer_gathers_only_while_another_upload_is_in_flight(tmp_path: Path) -> None:
    """An outcome waits for the others' PUTs in flight to join its commit, and no longer once none
    is in flight: the last (or a lone) upload's outcome is committed at once, not `gather` later."""
    state = StateDB.open(tmp_path / "state")
    spool = Spool(tmp_path / "state" / "spool")
    wake = Wakeups(idle_wait=30.0)
    committer = OutcomeCommitter(state, spool, SelfMetrics(CollectorRegistry()), wake, lambda: 50.0, gather=120.0)
    first, second = uploading(state, spool, "sess-00001", ("/a",))
    stop = threading.Event()
    thread = threading.Thread(target=committer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with committer.uploading():  # the second upload, still in flight
            with committer.uploading():
                committer.hand_over(first, Path(first.spool_path or ""))
            assert committer.pending() == 1  # gathering: another PUT may join its commit
            assert committed_statuses(tmp_path / "state")[first.id] == "spooled"
            committer.hand_over(second, Path(second.spool_path or ""))
        statuses = wait_until(  # far sooner than the 120 s gather: nothing is in flight any more
            lambda: (s := committed_statuses(tmp_path / "state"))[first.id] == s[second.id] == "done" and s,
            timeout=30.0,
            message="the outcomes were not committed once no upload was in flight",
        )
        assert statuses[first.id] == "done"
        assert not Path(first.spool_path or "").exists() and not Path(second.spool_path or "").exists()
    finally:
        stop.set()
        committer.wake()
        thread.join(30.0)
    state.close()


def test_with_four_workers_every_spool_file_goes_only_after_its_outcome_is_committed(
    fake_service: FakeService, tmp_path: Path, harness_factory: Callable[..., Harness]
) -> None:
    """The real pipeline (4 upload workers and the committer thread): at the moment each spool file
    is deleted, a new connection already sees its item `done`."""
    ids = [fake_service.add_session(TOKEN) for _ in range(6)]
    (tmp_path / "store").mkdir()
    h = harness_factory(fake_service, FileStore(tmp_path / "store"), start=False, upload_workers=4)
    state_dir = h.settings.state_dir
    early: list[str] = []
    removed: list[str] = []
    remove = h.pipeline.spool.remove

    def remove_if_committed(path: Path) -> None:
        status = committed_statuses(state_dir).get(int(path.name))
        if status not in (None, "done"):
            early.append(f"{path.name}: {status}")
        removed.append(path.name)
        remove(path)

    h.pipeline.spool.remove = remove_if_committed  # type: ignore[method-assign]
    h.pipeline.recover()
    h.pipeline.start()
    h.poll()
    for sid in ids:
        fake_service.end_session(TOKEN, sid)
    h.poll()
    assert h.pipeline.run_until_idle(30)
    assert early == []
    archived = sum(count for (_, outcome), count in h.state.outcome_counts().items() if outcome == "archived")
    assert archived == 12 and len(removed) == archived  # logs + the replay of each session
    assert all((row := h.state.latest(sid)) is not None and row.state == "archived" for sid in ids)
    assert not list((state_dir / "spool").iterdir())


def test_a_failed_commit_deletes_nothing_and_the_committer_thread_records_the_outcomes_once_it_can(
    tmp_path: Path,
) -> None:
    """The state DB refuses the transaction (a trigger stands in for a full disk): the outcomes stay
    queued, every spool file stays, the error is counted, and the next attempt records them."""
    state = StateDB.open(tmp_path / "state")
    spool = Spool(tmp_path / "state" / "spool")
    registry = CollectorRegistry()
    wake = Wakeups(idle_wait=30.0)
    committer = OutcomeCommitter(state, spool, SelfMetrics(registry), wake, lambda: 50.0, retry_wait=0.05)
    items = uploading(state, spool, "sess-00001", ("/a",))
    with state.write() as db:
        db.execute(
            "CREATE TRIGGER refuse_done BEFORE UPDATE OF status ON items WHEN NEW.status = 'done' "
            "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
    stop = threading.Event()
    thread = threading.Thread(target=committer.run, args=(stop,), daemon=True)
    thread.start()
    for item in items:
        committer.hand_over(item, Path(item.spool_path or ""))
    errors = {"where": "upload"}
    # Nothing notifies a failure: look again shortly.
    wait_until(lambda: registry.get_sample_value("archiver_errors_total", errors), timeout=30.0)
    assert registry.get_sample_value("archiver_errors_total", errors)
    assert set(committed_statuses(tmp_path / "state").values()) == {"spooled"}
    assert all(Path(item.spool_path or "").is_file() for item in items)

    generation = wake.snapshot(UPLOAD)
    with state.write() as db:
        db.execute("DROP TRIGGER refuse_done")
    wake.wait(generation, 30.0, UPLOAD)  # the retry commits and wakes the upload workers
    assert set(committed_statuses(tmp_path / "state").values()) == {"done"}
    assert not any(Path(item.spool_path or "").exists() for item in items)
    assert committer.pending() == 0
    stop.set()
    committer.wake()
    thread.join(30.0)
    state.close()
