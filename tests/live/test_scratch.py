"""Running captures in a scratch dir (issue 35): off the disk while they run, sealed into the state
dir when they finish, spilled there past the bound, and found again after a kill -9 or a reboot."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from archiver.errors import StateError
from archiver.live.policy import Finish
from archiver.live.resume import Kept
from archiver.live.scratch import ID_FILE
from archiver.live.segment import FOLLOWING, sealed_path
from archiver.live.store import DIR_NAME, CaptureStore
from tests.support import CAPTURE_WRITER, capture_lines, checkpoint, running_capture, sealed_capture

KEY = "1700000000000:scratch session"


def _bytes(lines: list[bytes]) -> bytes:
    return b"".join(x + b"\n" for x in lines)


def _store(tmp_path: Path, *, limit: int = 1 << 20) -> CaptureStore:
    return CaptureStore(tmp_path / "state", scratch_dir=tmp_path / "scratch", scratch_bytes=limit)


def _logs_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*.log"))


def test_a_running_capture_lives_in_the_scratch_and_only_its_seal_reaches_the_state_dir(tmp_path: Path) -> None:
    store = _store(tmp_path)
    segment = store.begin(KEY, "s", 1, 0)
    store.append(segment, capture_lines(5))
    checkpoint(store)
    live = tmp_path / "state" / DIR_NAME
    assert _logs_in(live) == [] and _logs_in(tmp_path / "scratch") == [segment.path.name]
    assert store.scratch_usage() == (len(_bytes(capture_lines(5))), 0)

    store.finish(segment, Finish.COMPLETE)
    checkpoint(store)
    (row,) = store.segments(KEY)
    assert row.sealed is not None and sealed_path(row).parent == live
    assert gzip.decompress(sealed_path(row).read_bytes()) == _bytes(capture_lines(5))
    assert _logs_in(tmp_path / "scratch") == [] and store.scratch_usage() == (0, 0)
    assert b"".join(store.read(row)) == _bytes(capture_lines(5))
    store.close()


def test_a_capture_that_would_pass_the_bound_moves_to_the_state_dir_with_every_line(tmp_path: Path) -> None:
    one = len(_bytes(capture_lines(1)))
    store = _store(tmp_path, limit=3 * one)
    big = store.begin(KEY, "s", 1, 0)
    store.append(big, capture_lines(3))
    assert store.scratch_usage() == (3 * one, 0)
    store.append(big, capture_lines(2, start=3))  # past the bound: moved first, then written
    assert big.path.parent == tmp_path / "state" / DIR_NAME and big.path.read_bytes() == _bytes(capture_lines(5))
    assert store.scratch_usage() == (0, 1) and _logs_in(tmp_path / "scratch") == []
    store.append(big, capture_lines(1, start=5))
    small = store.begin("2:other", "other", 2, 0)  # the scratch has room again: a new one goes there
    store.append(small, capture_lines(1))
    assert small.path.parent.parent == tmp_path / "scratch"
    checkpoint(store)
    (row,) = store.segments(KEY)
    assert row.kept == Kept().after(capture_lines(6)) and b"".join(store.read(row)) == _bytes(capture_lines(6))
    store.finish(big, Finish.COMPLETE)
    checkpoint(store)
    assert _logs_in(tmp_path / "state") == [] and store.segments(KEY)[0].sealed is not None
    store.close()


def test_a_full_scratch_filesystem_moves_the_capture_instead_of_failing_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tmpfs smaller than the bound answers ENOSPC (injected: one failed write to the scratch)."""
    store = _store(tmp_path)
    segment = store.begin(KEY, "s", 1, 0)
    store.append(segment, capture_lines(2))
    scratch_fd = segment.fd
    real_write = os.write

    def full_once(fd: int, data: bytes | memoryview) -> int:
        if fd == scratch_fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_once)
    store.append(segment, capture_lines(3, start=2))
    monkeypatch.undo()
    assert segment.path.parent == tmp_path / "state" / DIR_NAME
    assert segment.path.read_bytes() == _bytes(capture_lines(5)) and store.scratch_usage() == (0, 1)
    store.close()


def test_a_kill_9_keeps_the_scratch_lines_and_the_restart_resumes_from_them(tmp_path: Path) -> None:
    state, scratch = tmp_path / "state", tmp_path / "scratch"
    argv = [sys.executable, "-c", CAPTURE_WRITER, str(state), str(scratch)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    recovered = CaptureStore(state, scratch_dir=scratch)
    (row,) = recovered.segments("1:s")
    expected = [b"line %d " % i + b"x" * (i % 50) for i in range(row.kept.lines)]
    assert row.kept.lines > 2000 and row.kept == Kept().after(expected)
    assert row.path.parent.parent == scratch and row.path.read_bytes() == _bytes(expected)
    assert recovered.scratch_usage() == (len(_bytes(expected)), 0)
    recovered.close()


def test_a_reboot_that_empties_the_scratch_starts_a_running_capture_afresh(tmp_path: Path) -> None:
    store = _store(tmp_path)
    running_capture(store, KEY, 4)  # and the machine goes down: no stop, the tmpfs is gone
    shutil.rmtree(tmp_path / "scratch")

    again = _store(tmp_path)
    (row,) = again.segments(KEY)
    assert (row.state, row.kept) == (FOLLOWING, Kept())  # the session's replay brings its lines again
    (resumed,) = again.following()
    again.append(resumed, capture_lines(4))
    assert resumed.path.parent.parent == tmp_path / "scratch" and resumed.path.read_bytes() == _bytes(capture_lines(4))
    again.release(resumed)
    again.close()


def test_a_stop_moves_running_captures_out_of_the_scratch_for_a_pod_that_gets_a_new_one(tmp_path: Path) -> None:
    store = _store(tmp_path)
    segment = running_capture(store, KEY, 3)
    store.release(segment)  # the daemon stops
    store.close()
    assert _logs_in(tmp_path / "scratch") == [] and segment.path.parent == tmp_path / "state" / DIR_NAME
    assert oct(segment.path.stat().st_mode & 0o777) == "0o600"
    shutil.rmtree(tmp_path / "scratch")  # the new pod's emptyDir

    again = CaptureStore(tmp_path / "state")  # and the scratch may be turned off meanwhile
    (resumed,) = again.following()
    assert resumed.kept == Kept().after(capture_lines(3)) and resumed.path.read_bytes() == _bytes(capture_lines(3))
    assert not (tmp_path / "state" / DIR_NAME / ID_FILE).exists()
    again.release(resumed)
    again.close()


def test_captures_a_kill_9_left_in_the_scratch_refuse_an_open_without_it_in_one_line(tmp_path: Path) -> None:
    store = _store(tmp_path)
    running_capture(store, KEY, 2)  # killed here: the lines stay in the scratch
    with pytest.raises(StateError, match="set --follow-logs-scratch-dir as before") as caught:
        CaptureStore(tmp_path / "state")
    assert "\n" not in str(caught.value)
    again = _store(tmp_path)  # with the scratch: every line is there
    assert again.segments(KEY)[0].kept == Kept().after(capture_lines(2))
    again.close()


def test_a_move_cut_short_after_its_copy_was_named_keeps_the_copy_and_drops_the_scratch_twin(tmp_path: Path) -> None:
    store = _store(tmp_path)
    segment = running_capture(store, KEY, 3)
    copy = tmp_path / "state" / DIR_NAME / segment.path.name
    shutil.copyfile(segment.path, copy)  # killed after the copy was named, before the scratch file went

    again = _store(tmp_path)
    (row,) = again.segments(KEY)
    assert row.path == copy and row.kept == Kept().after(capture_lines(3)) and not segment.path.exists()
    assert again.scratch_usage() == (0, 0)
    again.close()


def test_a_sealed_capture_followed_again_is_made_again_where_the_bound_leaves_room(tmp_path: Path) -> None:
    one = len(_bytes(capture_lines(1)))
    store = _store(tmp_path, limit=2 * one)
    sealed_capture(store, KEY, 2)  # sealed: the scratch is empty again
    other = store.begin("2:other", "other", 2, 0)
    store.append(other, capture_lines(1))  # half the room taken
    (row,) = store.segments(KEY)
    reopened = store.reopen(row)  # two lines do not fit beside it: made in the state dir
    assert reopened.path.parent == tmp_path / "state" / DIR_NAME and reopened.path.read_bytes() == _bytes(
        capture_lines(2)
    )
    assert store.scratch_usage() == (one, 0)
    store.release(reopened)
    store.release(other)
    store.close()


def test_a_sealed_capture_followed_again_is_made_in_the_state_dir_when_the_tmpfs_proves_full(tmp_path: Path) -> None:
    """Within the bound, but the tmpfs answers ENOSPC (other pods' pages, a smaller sizeLimit):
    the lines file is made again in the state dir, nothing half made is left, and the scratch's
    count is given back."""
    store = _store(tmp_path)
    sealed_capture(store, KEY, 2)
    (row,) = store.segments(KEY)
    (scratch,) = (tmp_path / "scratch").iterdir()  # the state dir's own subdirectory
    full = scratch / f"{row.path.name}.partial"
    full.symlink_to("/dev/full")  # where the remade file is written first: every write is ENOSPC
    reopened = store.reopen(row)
    assert reopened.path == tmp_path / "state" / DIR_NAME / row.path.name
    assert reopened.path.read_bytes() == _bytes(capture_lines(2))
    assert store.scratch_usage() == (0, 0) and not os.path.lexists(full) and _logs_in(scratch) == []
    store.release(reopened)
    store.close()


def test_two_state_dirs_sharing_a_scratch_mount_keep_apart_and_a_moved_state_dir_finds_its_files(
    tmp_path: Path,
) -> None:
    first = CaptureStore(tmp_path / "a", scratch_dir=tmp_path / "scratch")
    second = CaptureStore(tmp_path / "b", scratch_dir=tmp_path / "scratch")
    one, two = first.begin(KEY, "s", 1, 0), second.begin(KEY, "s", 1, 0)  # the same session, two replicas
    first.append(one, capture_lines(1))
    second.append(two, capture_lines(2))
    assert one.path != two.path and one.path.read_bytes() == _bytes(capture_lines(1))
    checkpoint(first)  # killed: its lines stay in the scratch
    (tmp_path / "a").rename(tmp_path / "moved")
    moved = CaptureStore(tmp_path / "moved", scratch_dir=tmp_path / "scratch")
    (row,) = moved.segments(KEY)
    assert row.path == one.path and row.kept == Kept().after(capture_lines(1))
    moved.close()
    second.release(two)
    second.close()


def test_a_scratch_dir_that_cannot_be_made_is_a_one_line_state_error(tmp_path: Path) -> None:
    (tmp_path / "a file").write_text("")
    with pytest.raises(StateError, match=r"^live capture scratch dir .*a file: ") as caught:
        CaptureStore(tmp_path / "state", scratch_dir=tmp_path / "a file")
    assert "\n" not in str(caught.value)
