"""The live capture store: appends, checkpoints, and recovery after a kill -9 (a real one, in a child process)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from archiver.errors import StateError
from archiver.live.policy import Finish
from archiver.live.resume import Kept
from archiver.live.store import DB_NAME, DIR_NAME, FOLLOWING, CaptureStore

KEY = "1700000000000:session/with odd id"


def _lines(n: int, start: int = 0) -> list[bytes]:
    return [f'{{"streamType":1,"line":"line {i}"}}'.encode() for i in range(start, start + n)]


def _commit(store: CaptureStore) -> None:
    store.checkpoint(store.pending())


def test_appended_lines_are_kept_with_their_chain_and_read_back_after_a_reopen(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    segment = store.begin(KEY, "session/with odd id", 1_700_000_000_000, 0)
    store.set_shape(segment, "ndjson")
    assert store.append(segment, _lines(3)) == sum(len(x) + 1 for x in _lines(3))
    store.append(segment, _lines(2, start=3))
    _commit(store)
    store.release(segment)
    store.close()

    again = CaptureStore(tmp_path)
    (resumed,) = again.following()
    assert (resumed.key, resumed.index, resumed.shape, resumed.state) == (KEY, 0, "ndjson", FOLLOWING)
    assert resumed.kept == Kept().after(_lines(5))
    (row,) = again.segments(KEY)
    assert b"".join(again.read(row)) == b"".join(x + b"\n" for x in _lines(5))
    assert "session" not in row.path.name  # files are named by a digest of the key, never by the id
    again.release(resumed)
    again.close()


def test_recovery_keeps_complete_lines_written_after_the_checkpoint_and_cuts_a_torn_one(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    segment = store.begin(KEY, "s", 1, 0)
    store.append(segment, _lines(2))
    _commit(store)
    store.append(segment, _lines(3, start=2))  # written, not checkpointed: the process dies here
    assert segment.fd is not None
    os.write(segment.fd, b'{"streamType":1,"li')  # and a write it never finished
    store.release(segment)

    recovered = CaptureStore(tmp_path)
    (row,) = recovered.segments(KEY)
    assert row.kept == Kept().after(_lines(5)) and row.state == FOLLOWING
    assert row.path.read_bytes() == b"".join(x + b"\n" for x in _lines(5))


def test_a_file_shorter_than_its_checkpoint_is_reread_and_a_finished_one_then_says_gap(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    following = store.begin(KEY, "s", 1, 0)
    finished = store.begin("2:other", "other", 2, 0)
    store.append(following, _lines(4))
    store.append(finished, _lines(4))
    store.finish(finished, Finish.COMPLETE)
    _commit(store)
    store.release(following)
    for path in (following.path, finished.path):  # a filesystem that lost the last two lines
        path.write_bytes(b"".join(x + b"\n" for x in _lines(2)) + b"partial")

    recovered = CaptureStore(tmp_path)
    assert recovered.segments(KEY)[0].kept == Kept().after(_lines(2))
    assert recovered.segments(KEY)[0].state == FOLLOWING
    (other,) = recovered.segments("2:other")
    assert (other.kept, other.state) == (Kept().after(_lines(2)), Finish.GAP)


def test_a_capture_begun_after_the_last_checkpoint_is_dropped_and_a_missing_file_starts_afresh(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    kept = store.begin(KEY, "s", 1, 0)
    store.append(kept, _lines(2))
    _commit(store)
    unrecorded = store.begin("3:new", "new", 3, 0)
    store.append(unrecorded, _lines(1))
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
    store.append(first, _lines(3))
    _commit(store)
    store.finish(first, Finish.DIVERGED)
    second = store.begin(KEY, "s", 1, 1)
    store.append(second, _lines(4, start=10))
    assert second.fd is not None
    os.write(second.fd, b'{"streamType":1,"li')
    store.release(second)
    empty = store.begin(KEY, "s", 1, 2)  # begun, nothing written yet: nothing to keep
    store.release(empty)

    recovered = CaptureStore(tmp_path)
    old, new = recovered.segments(KEY)
    assert (old.index, old.state, old.kept) == (0, Finish.DIVERGED, Kept().after(_lines(3)))
    assert (new.index, new.state, new.shape) == (1, FOLLOWING, "ndjson")
    assert new.kept == Kept().after(_lines(4, start=10))
    assert new.path.read_bytes() == b"".join(x + b"\n" for x in _lines(4, start=10))  # the torn line cut
    assert not empty.path.exists()
    (resumed,) = recovered.following()
    assert (resumed.index, resumed.kept) == (1, new.kept)
    recovered.release(resumed)


def test_finish_and_remove_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    first = store.begin(KEY, "s", 1, 0)
    store.append(first, _lines(1))
    store.finish(first, Finish.DIVERGED)
    second = store.begin(KEY, "s", 1, 1)
    store.append(second, _lines(2))
    store.finish(second, Finish.COMPLETE)
    _commit(store)
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


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from archiver.live.store import CaptureStore

    store = CaptureStore(Path(sys.argv[1]))
    segment = store.begin("1:s", "s", 1, 0)
    for i in range(1_000_000):
        store.append(segment, [b"line %d " % i + b"x" * (i % 50)])
        if i % 37 == 0:
            store.checkpoint(store.pending())
        if i == 2000:
            print("ready", flush=True)
    """
)


def test_a_kill_9_at_any_moment_leaves_a_capture_that_is_exactly_a_prefix_of_what_was_written(
    tmp_path: Path,
) -> None:
    """A child appends numbered lines and checkpoints every 37; SIGKILL hits it mid-flight. The
    recovered capture holds lines 0..n-1 exactly (n at least the last checkpoint's), and its chain
    is the chain of those lines."""
    for round_ in range(3):
        state = tmp_path / f"r{round_}"
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(state)], stdout=subprocess.PIPE, text=True)
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
        store.append(segment, _lines(1))
        if key != "3:running":
            store.finish(segment, Finish.COMPLETE)
    _commit(store)
    now[0] = 500.0
    late = store.begin("4:late", "late", 4, 0)
    store.finish(late, Finish.GAP)
    _commit(store)
    assert store.prune(200.0, keep=frozenset({"2:kept"})) == 1
    assert store.segments("1:done") == [] and not store.path_of("1:done", 0).exists()
    assert [len(store.segments(k)) for k in ("2:kept", "3:running", "4:late")] == [1, 1, 1]
