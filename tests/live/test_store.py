"""The live capture store: appends, checkpoints, and recovery after a kill -9 (a real one, in a child process)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from archiver.errors import StateError
from archiver.live.checkpoints import SEAL_LOOK, Checkpoints
from archiver.live.follow import Counters
from archiver.live.policy import Finish, Tuning
from archiver.live.resume import Kept
from archiver.live.segment import FOLLOWING, sealed_path
from archiver.live.store import DIR_NAME, CaptureStore
from archiver.live.table import DB_NAME
from archiver.store.gzipstream import gzip_blocks
from tests.support import CAPTURE_WRITER, capture_lines, checkpoint, sealed_capture

KEY = "1700000000000:session/with odd id"


def test_appended_lines_are_kept_with_their_chain_and_read_back_after_a_reopen(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    segment = store.begin(KEY, "session/with odd id", 1_700_000_000_000, 0)
    store.set_shape(segment, "ndjson")
    assert store.append(segment, capture_lines(3)) == sum(len(x) + 1 for x in capture_lines(3))
    store.append(segment, capture_lines(2, start=3))
    checkpoint(store)
    store.release(segment)
    store.close()

    again = CaptureStore(tmp_path)
    (resumed,) = again.following()
    assert (resumed.key, resumed.index, resumed.shape, resumed.state) == (KEY, 0, "ndjson", FOLLOWING)
    assert resumed.kept == Kept().after(capture_lines(5))
    (row,) = again.segments(KEY)
    assert b"".join(again.read(row)) == b"".join(x + b"\n" for x in capture_lines(5))
    assert "session" not in row.path.name  # files are named by a digest of the key, never by the id
    again.release(resumed)
    again.close()


def test_recovery_keeps_complete_lines_written_after_the_checkpoint_and_cuts_a_torn_one(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    segment = store.begin(KEY, "s", 1, 0)
    store.append(segment, capture_lines(2))
    checkpoint(store)
    store.append(segment, capture_lines(3, start=2))  # written, not checkpointed: the process dies here
    assert segment.fd is not None
    os.write(segment.fd, b'{"streamType":1,"li')  # and a write it never finished
    store.release(segment)

    recovered = CaptureStore(tmp_path)
    (row,) = recovered.segments(KEY)
    assert row.kept == Kept().after(capture_lines(5)) and row.state == FOLLOWING
    assert row.path.read_bytes() == b"".join(x + b"\n" for x in capture_lines(5))


def test_a_file_shorter_than_its_checkpoint_is_reread_and_a_finished_one_then_says_gap(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    following = store.begin(KEY, "s", 1, 0)
    finished = store.begin("2:other", "other", 2, 0)
    store.append(following, capture_lines(4))
    store.append(finished, capture_lines(4))
    store.finish(finished, Finish.COMPLETE)
    checkpoint(store)
    store.release(following)
    for path in (following.path, finished.path):  # a filesystem that lost the last two lines
        path.write_bytes(b"".join(x + b"\n" for x in capture_lines(2)) + b"partial")

    recovered = CaptureStore(tmp_path)
    assert recovered.segments(KEY)[0].kept == Kept().after(capture_lines(2))
    assert recovered.segments(KEY)[0].state == FOLLOWING
    (other,) = recovered.segments("2:other")
    assert (other.kept, other.state) == (Kept().after(capture_lines(2)), Finish.GAP)


def test_a_capture_begun_after_the_last_checkpoint_is_dropped_and_a_missing_file_starts_afresh(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    kept = store.begin(KEY, "s", 1, 0)
    store.append(kept, capture_lines(2))
    checkpoint(store)
    unrecorded = store.begin("3:new", "new", 3, 0)
    store.append(unrecorded, capture_lines(1))
    store.release(kept)
    store.release(unrecorded)
    kept.path.unlink()

    recovered = CaptureStore(tmp_path)
    assert not unrecorded.path.exists() and recovered.segments("3:new") == []
    (row,) = recovered.segments(KEY)
    assert row.kept == Kept() and row.path.read_bytes() == b""


def test_a_segment_begun_after_the_last_checkpoint_is_kept_and_the_one_before_it_ends_as_diverged(
    tmp_path: Path,
) -> None:
    """A replay differed, the engine began segment 1 and wrote to it; the process died before the
    next checkpoint (mid-write). Segment 1's lines are kept, its row rebuilt from the file."""
    store = CaptureStore(tmp_path)
    first = store.begin(KEY, "s", 1, 0)
    store.set_shape(first, "ndjson")
    store.append(first, capture_lines(3))
    checkpoint(store)
    store.finish(first, Finish.DIVERGED)
    second = store.begin(KEY, "s", 1, 1)
    store.append(second, capture_lines(4, start=10))
    assert second.fd is not None
    os.write(second.fd, b'{"streamType":1,"li')
    store.release(second)
    empty = store.begin(KEY, "s", 1, 2)  # begun, nothing written yet: nothing to keep
    store.release(empty)

    recovered = CaptureStore(tmp_path)
    old, new = recovered.segments(KEY)
    assert (old.index, old.state, old.kept) == (0, Finish.DIVERGED, Kept().after(capture_lines(3)))
    assert (new.index, new.state, new.shape) == (1, FOLLOWING, "ndjson")
    assert new.kept == Kept().after(capture_lines(4, start=10))
    assert new.path.read_bytes() == b"".join(x + b"\n" for x in capture_lines(4, start=10))  # the torn line cut
    assert not empty.path.exists()
    (resumed,) = recovered.following()
    assert (resumed.index, resumed.kept) == (1, new.kept)
    recovered.release(resumed)


def test_finish_and_remove_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    first = store.begin(KEY, "s", 1, 0)
    store.append(first, capture_lines(1))
    store.finish(first, Finish.DIVERGED)
    second = store.begin(KEY, "s", 1, 1)
    store.append(second, capture_lines(2))
    store.finish(second, Finish.COMPLETE)
    checkpoint(store)
    assert [(r.index, r.state) for r in store.segments(KEY)] == [(0, "diverged"), (1, "complete")]
    assert store.following() == []
    assert store.latest(KEY) is not None and store.latest(KEY).index == 1  # type: ignore[union-attr]
    store.remove(KEY)
    assert store.segments(KEY) == [] and not first.path.exists() and not second.path.exists()
    store.close()
    with sqlite3.connect(tmp_path / DIR_NAME / DB_NAME) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StateError, match="newer archiver"):
        CaptureStore(tmp_path)


def test_a_kill_9_at_any_moment_leaves_a_capture_that_is_exactly_a_prefix_of_what_was_written(
    tmp_path: Path,
) -> None:
    """A child appends numbered lines and checkpoints every 37; SIGKILL hits it mid-flight. The
    recovered capture holds lines 0..n-1 exactly (n at least the last checkpoint's), and its chain
    is the chain of those lines."""
    for round_ in range(3):
        state = tmp_path / f"r{round_}"
        child = subprocess.Popen([sys.executable, "-c", CAPTURE_WRITER, str(state)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        recovered = CaptureStore(state)
        (row,) = recovered.segments("1:s")
        expected = [b"line %d " % i + b"x" * (i % 50) for i in range(row.kept.lines)]
        assert row.kept.lines > 2000
        assert row.kept == Kept().after(expected)
        assert row.path.read_bytes() == b"".join(x + b"\n" for x in expected)
        recovered.close()


def test_prune_removes_only_long_finished_captures_nobody_holds(tmp_path: Path) -> None:
    now = [100.0]
    store = CaptureStore(tmp_path, clock=lambda: now[0])
    for key in ("1:done", "2:kept", "3:running"):
        segment = store.begin(key, key[2:], int(key[0]), 0)
        store.append(segment, capture_lines(1))
        if key != "3:running":
            store.finish(segment, Finish.COMPLETE)
    checkpoint(store)
    now[0] = 500.0
    late = store.begin("4:late", "late", 4, 0)
    store.finish(late, Finish.GAP)
    checkpoint(store)
    assert store.prune(200.0, keep=frozenset({"2:kept"})) == 1
    assert store.segments("1:done") == [] and not store.path_of("1:done", 0).exists()
    assert [len(store.segments(k)) for k in ("2:kept", "3:running", "4:late")] == [1, 1, 1]


def _synced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files `os.fdatasync` is called on from now on (each call still syncs)."""
    synced: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return synced


def test_a_finished_segment_is_sealed_as_its_stored_log_and_a_running_one_is_never_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: a checkpoint syncs the seals of segments that finished and nothing of running ones;
    a seal is the gzip the archive stores (the same bytes a fetch would compress), named by its rows."""
    store = CaptureStore(tmp_path)
    running = store.begin(KEY, "s", 1, 0)
    done = store.begin("2:done", "done", 2, 0)
    store.append(running, capture_lines(5))
    store.append(done, capture_lines(7))
    store.finish(done, Finish.COMPLETE)
    synced = _synced_paths(monkeypatch)
    checkpoint(store)

    (row,) = store.segments("2:done")
    assert row.sealed is not None and store.segments(KEY)[0].sealed is None
    seal = sealed_path(row)
    assert synced == [str(seal)]  # written beside, renamed into place, synced before its row commits
    body = seal.read_bytes()
    assert (len(body), hashlib.sha256(body).hexdigest()) == (row.sealed.size, row.sealed.sha256)
    assert gzip.decompress(body) == b"".join(x + b"\n" for x in capture_lines(7))
    assert body == b"".join(gzip_blocks(store.read(row)))
    store.append(running, capture_lines(2, start=5))
    checkpoint(store)
    assert synced == [str(seal)]  # the running segment's new lines: recorded, not synced


def test_a_delayed_seal_is_synced_only_if_a_name_outlives_its_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, `--follow-logs-seal-sync-delay`: a seal's row commits at once, its data is synced
    when the delay is up, and only if a name is left then (a spool's hard link counts); one whose
    names all went sooner (its upload done) is never synced; closing syncs what is left."""
    now = [0.0]
    store = CaptureStore(tmp_path, seal_sync_delay=20.0, clock=lambda: now[0])
    synced: list[int] = []  # the inodes synced: a seal's own name may be gone by then
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    uploaded, late, closing = (store.begin(f"{n}:s{n}", f"s{n}", n, 0) for n in (1, 2, 3))
    for segment in (uploaded, late):
        store.append(segment, capture_lines(3))
        store.finish(segment, Finish.COMPLETE)
    checkpoint(store)
    (first,), (second,) = store.segments("1:s1"), store.segments("2:s2")
    assert first.sealed is not None and second.sealed is not None  # recorded, though not synced
    assert synced == [] and store.seals_unsynced() == 2
    spooled = tmp_path / "spooled"
    os.link(sealed_path(second), spooled)  # as the spool adopts a seal
    store.remove("1:s1")
    store.remove("2:s2")  # its capture is removed once spooled: the spool's name is its last
    now[0] = 10.0
    checkpoint(store)
    assert synced == [] and store.seals_unsynced() == 1  # the first has no name left: let go unsynced
    store.append(closing, capture_lines(2))
    store.finish(closing, Finish.GAP)
    checkpoint(store)
    now[0] = 20.0
    checkpoint(store)
    assert synced == [spooled.stat().st_ino] and spooled.read_bytes().startswith(b"\x1f\x8b")
    assert store.seals_unsynced() == 1  # the third is due at 30
    (third,) = store.segments("3:s3")
    store.close()
    assert synced == [spooled.stat().st_ino, sealed_path(third).stat().st_ino]


def test_a_failed_sync_lets_its_seal_go_rather_than_retry_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux reports a writeback error once per open file: a second fdatasync on the same
    descriptor would claim a success. A failed one fails that checkpoint (counted, retried) and its
    seal is not held any more; the next checkpoint goes on."""
    now = [0.0]
    store = CaptureStore(tmp_path, seal_sync_delay=20.0, clock=lambda: now[0])
    sealed_capture(store, KEY, 2)
    failures = []

    def failing(fd: int) -> None:
        failures.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    now[0] = 20.0
    with pytest.raises(OSError):
        checkpoint(store)
    assert len(failures) == 1 and store.seals_unsynced() == 0
    checkpoint(store)
    assert len(failures) == 1
    store.close()


def test_seals_a_kill_9_left_unsynced_wait_again_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process that held a seal for its delay died: the next open holds it again, as if just
    made, and syncs it when due (the kernel kept its pages; a machine crash would not)."""
    now = [0.0]
    sealed_capture(CaptureStore(tmp_path, seal_sync_delay=20.0), KEY, 3)  # never closed: as a `kill -9` leaves it
    again = CaptureStore(tmp_path, seal_sync_delay=20.0, clock=lambda: now[0])
    (row,) = again.segments(KEY)
    assert again.seals_unsynced() == 1
    synced = _synced_paths(monkeypatch)
    now[0] = 20.0
    checkpoint(again)
    assert synced == [str(sealed_path(row))] and again.seals_unsynced() == 0
    again.close()


def test_a_seal_past_the_room_for_held_seals_is_synced_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each held seal keeps a file open: past the room the open-file limit leaves, a seal is
    synced before its row commits, as without a delay."""
    store = CaptureStore(tmp_path, seal_sync_delay=20.0, seals_room=1, clock=lambda: 0.0)
    synced = _synced_paths(monkeypatch)
    held, past = (store.begin(f"{n}:s{n}", f"s{n}", n, 0) for n in (1, 2))
    for segment in (held, past):
        store.append(segment, capture_lines(2))
        store.finish(segment, Finish.COMPLETE)
    checkpoint(store)
    (first,), (second,) = store.segments("1:s1"), store.segments("2:s2")
    assert synced == [str(sealed_path(second))] and store.seals_unsynced() == 1
    store.close()
    assert synced == [str(sealed_path(second)), str(sealed_path(first))]


def test_the_checkpoint_job_settles_delayed_seals_when_nothing_else_changed(tmp_path: Path) -> None:
    """Seals still waiting keep the checkpoint job running with no segment changed, so each is
    synced (or let go) when due, not at the next unrelated change."""
    now = [0.0]
    store = CaptureStore(tmp_path, seal_sync_delay=5.0, clock=lambda: now[0])
    sealed_capture(store, KEY, 2)
    gate = threading.Event()
    gate.set()
    job = Checkpoints(store, Tuning(), gate, Counters())
    assert store.seals_unsynced() == 1
    assert asyncio.run(job.once()) == [] and store.seals_unsynced() == 1  # not due yet
    now[0] = 5.0
    asyncio.run(job.once())
    assert store.seals_unsynced() == 0 and asyncio.run(job.once()) is None  # settled: nothing left to do
    job.shutdown()
    store.close()


def test_while_seals_wait_the_checkpoint_job_looks_every_second_not_every_interval(tmp_path: Path) -> None:
    """A seal due in 0.2 s is synced about then, though checkpoints are a minute apart: the job
    looks every `SEAL_LOOK` while any seal waits."""
    store = CaptureStore(tmp_path, seal_sync_delay=0.2)
    sealed_capture(store, KEY, 2)
    gate = threading.Event()
    gate.set()
    job = Checkpoints(store, Tuning(checkpoint_interval=60.0), gate, Counters())

    async def run_until_settled() -> None:
        task = asyncio.create_task(job.run(lambda rows: None))
        deadline = asyncio.get_running_loop().time() + 10 * SEAL_LOOK
        while store.seals_unsynced() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run_until_settled())
    assert store.seals_unsynced() == 0
    job.shutdown()
    store.close()


def test_a_seal_lost_unsynced_with_its_lines_file_gone_reopens_as_an_empty_gap(tmp_path: Path) -> None:
    """A machine crash before a delayed seal's data was synced leaves it empty (its name was), its
    lines file already deleted: the store opens, the segment says `gap` with no lines, no seal left."""
    store = CaptureStore(tmp_path, seal_sync_delay=20.0)
    segment = sealed_capture(store, KEY, 3)
    (row,) = store.segments(KEY)
    assert row.sealed is not None and not segment.path.exists()
    sealed_path(row).write_bytes(b"")  # what the disk held of it after the crash

    recovered = CaptureStore(tmp_path)
    (lost,) = recovered.segments(KEY)
    assert (lost.state, lost.kept, lost.sealed) == (Finish.GAP, Kept(), None)
    assert b"".join(recovered.read(lost)) == b""
    assert list((tmp_path / DIR_NAME).glob("*.gz")) == []
    recovered.close()


def test_a_removed_capture_is_gone_at_once_and_its_rows_leave_with_the_next_checkpoint(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    first = sealed_capture(store, KEY, 3)
    (row,) = store.segments(KEY)
    seal = sealed_path(row)
    store.remove(KEY)

    def rows_in_db() -> int:
        with sqlite3.connect(tmp_path / DIR_NAME / DB_NAME) as db:
            return int(db.execute("SELECT count(*) FROM segments WHERE key = ?", (KEY,)).fetchone()[0])

    assert store.segments(KEY) == [] and store.latest(KEY) is None
    assert not first.path.exists() and not seal.exists()
    assert rows_in_db() == 1 and store.removals_pending()  # no commit of its own
    again = store.begin(KEY, "s", 1, 0)  # the session listed again after its archive
    store.append(again, capture_lines(1, start=9))
    checkpoint(store)
    assert not store.removals_pending()
    (fresh,) = store.segments(KEY)
    assert (fresh.kept, fresh.state, fresh.sealed) == (Kept().after(capture_lines(1, start=9)), FOLLOWING, None)
    store.release(again)
    store.close()


def test_a_crash_between_a_removal_and_its_checkpoint_leaves_no_trace_after_recovery(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    segment = sealed_capture(store, KEY, 3)
    store.remove(KEY)  # the process dies before the next checkpoint: the row is still in the DB

    recovered = CaptureStore(tmp_path)
    assert recovered.segments(KEY) == [] and not segment.path.exists()
    assert list((tmp_path / DIR_NAME).glob("*.log")) == [] and list((tmp_path / DIR_NAME).glob("*.gz")) == []
    recovered.close()
    with sqlite3.connect(tmp_path / DIR_NAME / DB_NAME) as db:
        assert db.execute("SELECT count(*) FROM segments").fetchone()[0] == 0


def test_a_sealed_segment_keeps_only_its_seal_which_serves_reads_and_a_reopen(tmp_path: Path) -> None:
    """Once its seal is recorded, a finished segment's lines file goes (mostly before the kernel
    wrote it); reads come from the seal, and a session listed again continues from it."""
    store = CaptureStore(tmp_path)
    sealed_capture(store, KEY, 4)
    (row,) = store.segments(KEY)
    assert row.sealed is not None and not row.path.exists() and sealed_path(row).exists()
    assert b"".join(store.read(row)) == b"".join(x + b"\n" for x in capture_lines(4))
    store.close()

    again = CaptureStore(tmp_path)  # nothing to recover: the seal holds the lines
    (same,) = again.segments(KEY)
    assert (same.kept, same.state, same.sealed) == (row.kept, Finish.COMPLETE, row.sealed)
    resumed = again.reopen(same)
    again.append(resumed, capture_lines(2, start=4))
    again.finish(resumed, Finish.COMPLETE)
    checkpoint(again)
    (longer,) = again.segments(KEY)
    assert b"".join(again.read(longer)) == b"".join(x + b"\n" for x in capture_lines(6))
    assert longer.kept == Kept().after(capture_lines(6)) and longer.sealed not in (None, row.sealed)


def test_a_reopen_from_a_copy_taken_before_its_seal_continues_from_the_seal(tmp_path: Path) -> None:
    """The loop reopens a finished segment from its own copy (no seal named) while the checkpoint
    that sealed it and deleted its lines file has already run: the lines come back from the seal."""
    store = CaptureStore(tmp_path)
    segment = sealed_capture(store, KEY, 3)
    assert not segment.path.exists()  # sealed, its lines file gone
    resumed = store.reopen(segment.row())  # the loop's copy: `sealed` is None
    store.append(resumed, capture_lines(2, start=3))
    store.finish(resumed, Finish.COMPLETE)
    checkpoint(store)
    (row,) = store.segments(KEY)
    assert b"".join(store.read(row)) == b"".join(x + b"\n" for x in capture_lines(5))
    assert list((tmp_path / DIR_NAME).glob("*.partial")) == []
    store.close()


def test_recovery_seals_an_older_store_s_finished_segments_and_a_seal_whose_lines_remain(tmp_path: Path) -> None:
    """A schema-1 store (no seals, every lines file kept) is migrated and its finished segments are
    sealed; a seal lost while its lines file remained is made again, byte for byte."""
    store = CaptureStore(tmp_path)
    sealed_capture(store, KEY, 4, Finish.GAP)
    (row,) = store.segments(KEY)
    store.close()
    seal = sealed_path(row)
    first = seal.read_bytes()
    lines = b"".join(x + b"\n" for x in capture_lines(4))
    row.path.write_bytes(lines)  # as a schema-1 store left it
    with sqlite3.connect(tmp_path / DIR_NAME / DB_NAME) as db:
        db.execute("ALTER TABLE segments DROP COLUMN sealed_size")
        db.execute("ALTER TABLE segments DROP COLUMN sealed_sha256")
        db.execute("PRAGMA user_version = 1")
    seal.unlink()
    old = CaptureStore(tmp_path)
    (migrated,) = old.segments(KEY)
    assert (migrated.state, migrated.sealed) == (Finish.GAP, row.sealed) and seal.read_bytes() == first
    old.close()

    row.path.write_bytes(lines)  # a crash after the seal's row committed, before its lines file went
    seal.unlink()  # and a seal lost with it
    again = CaptureStore(tmp_path)
    (remade,) = again.segments(KEY)
    assert remade.sealed == row.sealed and seal.read_bytes() == first
    again.close()


def test_a_running_segment_that_only_gains_lines_is_recorded_at_most_every_progress_interval(tmp_path: Path) -> None:
    """Issue 35: thousands of running sessions no longer rewrite their rows at every checkpoint; a
    new segment, a shape and a finish are recorded at the next one, and recovery scans the rest."""
    now = [0.0]
    store = CaptureStore(tmp_path, clock=lambda: now[0])
    segment = store.begin(KEY, "s", 1, 0)
    store.append(segment, capture_lines(2))
    assert [r.kept.lines for r in store.pending(60.0)] == [2]  # a new segment: at once
    store.append(segment, capture_lines(3, start=2))
    now[0] = 59.0
    assert store.pending(60.0) == []  # only lines: not yet
    store.set_shape(segment, "ndjson")
    assert [(r.kept.lines, r.shape) for r in store.pending(60.0)] == [(5, "ndjson")]  # a shape: at once
    store.append(segment, capture_lines(1, start=5))
    now[0] = 119.0
    assert [r.kept.lines for r in store.pending(60.0)] == [6]  # the interval passed
    store.append(segment, capture_lines(1, start=6))
    store.finish(segment, Finish.COMPLETE)
    assert [(r.kept.lines, r.state) for r in store.pending(60.0)] == [(7, Finish.COMPLETE)]  # a finish: at once
    assert store.pending(60.0) == []
