"""Live capture end to end against the fake service over loopback: exact captures through cuts, faults,
the cap, a stop and a kill -9, logs gone at termination, and replays that differ from what was kept."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.state.rows import session_key
from archiver.config.credentials import Token
from archiver.fake import FakeClock, FakeService
from archiver.fake.logs import render_ndjson, render_text
from archiver.live.engine import LiveCapture
from archiver.live.followset import SessionRef
from archiver.live.loop import streams_room
from archiver.live.policy import Finish, Tuning
from archiver.live.segment import FOLLOWING, Segment, sealed_path
from archiver.live.store import DIR_NAME, CaptureStore
from archiver.live.table import DB_NAME
from archiver.metrics.live import LiveMetrics
from archiver.upstream.api import SessionHostClient
from tests.fixtures_fake import TEST_TOKEN
from tests.support import LIVE_FAST, wait_until

FAST = LIVE_FAST
#: Virtual seconds per real second: a session writes a line every 2 virtual seconds, 10 a second here.
SCALE = 20.0


class Poller:
    """The daemon's part, reduced: list the active sessions and hand them to live capture, on a thread."""

    def __init__(self, svc: FakeService, engine: LiveCapture, every: float = 0.1) -> None:
        self._client = SessionHostClient.connect(svc.base_url, Token(TEST_TOKEN))
        self._engine = engine
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            sessions = self._client.list_sessions().sessions
            keys = [session_key(s.id, s.created_ms) for s in sessions]
            with self._engine.paused():
                self._engine.update(keys)
            self._stop.wait(self._every)


def ref_of(svc: FakeService, sid: str) -> SessionRef:
    created_ms = int(svc.session(TEST_TOKEN, sid).created * 1000.0)  # as the fake lists it
    return SessionRef(session_key(sid, created_ms), sid, created_ms)


def captured(store: CaptureStore, key: str) -> list[tuple[str, bytes]]:
    """(state, bytes) of every segment of a session instance."""
    return [(row.state, b"".join(store.read(row))) for row in store.segments(key)]


def finished(store: CaptureStore, key: str) -> bool:
    rows = store.segments(key)
    return bool(rows) and rows[-1].state != FOLLOWING


def follow_to_its_end(svc: FakeService, engine: LiveCapture) -> tuple[str, SessionRef]:
    """A new session, followed until it wrote a few lines, then ended and no longer listed: its
    capture finished."""
    sid = svc.add_session(TEST_TOKEN)
    ref = ref_of(svc, sid)
    engine.update([ref.key])
    wait_until(lambda: engine.stats().lines >= 4, message="following")
    svc.end_session(TEST_TOKEN, sid)
    engine.update([])
    wait_until(lambda: finished(engine.store, ref.key), message="capture finished")
    return sid, ref


@pytest.fixture
def svc() -> Iterator[FakeService]:
    with FakeService((TEST_TOKEN,), clock=FakeClock(1_700_000_000, time_scale=SCALE), log_lines=30) as service:
        yield service


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., LiveCapture]]:
    engines: list[LiveCapture] = []

    def make(svc: FakeService, *, max_streams: int = 100, tuning: Tuning = FAST, state: Path = tmp_path,
             captures: CaptureStore | None = None) -> LiveCapture:  # fmt: skip
        captures = captures if captures is not None else CaptureStore(state)
        engine = LiveCapture(svc.base_url, Token(TEST_TOKEN), captures, max_streams=max_streams, tuning=tuning, seed=1)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def test_each_followed_session_is_captured_exactly_and_complete_when_it_ends_normally_or_by_crash(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    engine = make_engine(svc)
    sids = [svc.add_session(TEST_TOKEN, lifetime=20.0, crashed=i == 1) for i in range(3)]
    refs = [ref_of(svc, sid) for sid in sids]
    with Poller(svc, engine):
        for ref in refs:
            wait_until(lambda r=ref: finished(engine.store, r.key), message=f"capture of {ref.session_id} finished")
    for sid, ref in zip(sids, refs, strict=True):
        assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]
    assert "core dumped" in svc.log_lines(TEST_TOKEN, sids[1])[-1][1]
    stats = engine.stats()
    assert stats.lines == sum(len(svc.log_lines(TEST_TOKEN, s)) for s in sids)
    assert stats.finished["complete"] == 3 and stats.followed == 0 and stats.draining == 0


def test_streams_cut_mid_line_once_per_session_and_logs_gone_at_termination_still_give_exact_captures(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    """The done-when conditions of the live half: every stream is cut once mid-line, the after-end
    endpoints answer 404, and each capture still holds every line once, in order."""
    svc.set_quirks(logs_gone_at_termination=True)
    svc.set_fault("GET /logs", kind="cut", after=700, per_session=1, follow_only=True)
    engine = make_engine(svc)
    sids = [svc.add_session(TEST_TOKEN, lifetime=40.0, crashed=i % 2 == 0) for i in range(4)]
    refs = [ref_of(svc, sid) for sid in sids]
    with Poller(svc, engine):
        for ref in refs:
            wait_until(lambda r=ref: finished(engine.store, r.key), message="captures finished")
    for sid, ref in zip(sids, refs, strict=True):
        assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]
    assert svc.faults_fired("GET /logs") == {"cut": 4}
    assert engine.stats().ends["cut"] == 4


def test_the_cap_follows_the_oldest_first_counts_the_rest_and_a_late_follow_still_gets_every_line(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    engine = make_engine(svc, max_streams=2)
    old = [svc.add_session(TEST_TOKEN, id=f"old-{i}") for i in range(2)]
    svc.advance(1.0)
    young = [svc.add_session(TEST_TOKEN, id=f"young-{i}", lifetime=60.0) for i in range(2)]
    with Poller(svc, engine):
        wait_until(lambda: engine.stats().unfollowed == 2 and engine.stats().followed == 2, message="cap applied")
        assert all(engine.following(ref_of(svc, s).key) for s in old)
        assert not any(engine.following(ref_of(svc, s).key) for s in young)
        svc.advance(10.0)  # the young ones write lines nobody follows yet
        for sid in old:
            svc.end_session(TEST_TOKEN, sid)
        for sid in young:
            wait_until(lambda s=sid: finished(engine.store, ref_of(svc, s).key), message="young followed to the end")
    for sid in [*old, *young]:
        whole = render_ndjson(svc.log_lines(TEST_TOKEN, sid))
        assert captured(engine.store, ref_of(svc, sid).key) == [("complete", whole)]


def _follow_a_while_then_stop(svc: FakeService, make_engine: Callable[..., LiveCapture]) -> tuple[str, SessionRef]:
    """A session with its logs gone at termination, followed until some lines are kept, then the
    engine stopped (its capture stays `following`, to be resumed)."""
    svc.set_quirks(logs_gone_at_termination=True)
    first = make_engine(svc)
    sid = svc.add_session(TEST_TOKEN)
    with Poller(svc, first):
        wait_until(lambda: first.stats().lines >= 6, message="some lines captured")
    first.stop()
    return sid, ref_of(svc, sid)


def test_a_stopped_and_restarted_capture_resumes_from_its_checkpoint_without_a_line_twice(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path
) -> None:
    sid, ref = _follow_a_while_then_stop(svc, make_engine)
    svc.advance(10.0)  # lines written while nobody follows
    second = make_engine(svc, state=tmp_path)
    with Poller(svc, second):
        wait_until(lambda: second.stats().lines >= 1, message="resumed and appending")
        svc.end_session(TEST_TOKEN, sid)
        wait_until(lambda: finished(second.store, ref.key), message="capture finished")
    assert captured(second.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]


def test_a_stop_syncs_the_seals_still_waiting_for_their_upload(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `--follow-logs-seal-sync-delay`, a finished capture's seal waits unsynced, shown by
    `archiver_live_seals_unsynced`; a stop does not leave it so (the next start may follow a
    machine crash)."""
    engine = make_engine(svc, captures=CaptureStore(tmp_path, seal_sync_delay=3600.0))
    _, ref = follow_to_its_end(svc, engine)
    wait_until(lambda: engine.store.segments(ref.key)[-1].sealed is not None, message="sealed")
    registry = CollectorRegistry()
    metrics = LiveMetrics(registry)
    metrics.report(engine.stats)
    assert registry.get_sample_value("archiver_live_seals_unsynced") == 1
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(os.fstat(fd).st_ino), real(fd))[1])
    engine.stop()
    metrics.report(engine.stats)
    assert registry.get_sample_value("archiver_live_seals_unsynced") == 0
    assert synced == [sealed_path(engine.store.segments(ref.key)[-1]).stat().st_ino]


_CHILD = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from archiver.config.credentials import Token
    from archiver.live.engine import LiveCapture
    from archiver.live.policy import Tuning
    from archiver.live.store import CaptureStore

    url, state, key = sys.argv[1:4]
    engine = LiveCapture(url, Token("test-token"), CaptureStore(Path(state)), max_streams=10,
                         tuning=Tuning(checkpoint_interval=0.3, progress_interval=0.3))
    engine.start()
    engine.update([key])
    while True:
        print(engine.stats().lines, flush=True)
        threading.Event().wait(0.05)
    """
)


def test_a_kill_9_while_sessions_run_loses_and_duplicates_nothing(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path
) -> None:
    """The engine runs in a child process; SIGKILL hits it while its session writes lines (some
    after the last checkpoint); the next start resumes from what the files hold, and with the
    logs gone at termination the capture is still the session's exact log."""
    svc.set_quirks(logs_gone_at_termination=True)
    sid = svc.add_session(TEST_TOKEN)
    ref = ref_of(svc, sid)
    args = [svc.base_url, str(tmp_path), ref.key]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None

    def checkpointed() -> int:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{tmp_path / DIR_NAME / DB_NAME}?mode=ro", uri=True)) as db:
                found = db.execute("SELECT lines FROM segments").fetchone()
        except sqlite3.OperationalError:  # not created yet
            return 0
        return int(found[0]) if found else 0

    # Killed once a checkpoint holds a dozen lines and more lines than that were written since.
    while (held := checkpointed()) < 12 or int(child.stdout.readline() or "-1") <= held:
        assert child.poll() is None, "the child engine died"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    svc.advance(6.0)
    engine = make_engine(svc)
    with Poller(svc, engine):
        wait_until(lambda: engine.stats().lines >= 1, message="resumed")
        svc.end_session(TEST_TOKEN, sid)
        wait_until(lambda: finished(engine.store, ref.key), message="capture finished")
    assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]


def test_a_session_that_ends_while_nobody_follows_and_whose_logs_are_gone_is_a_known_gap(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path
) -> None:
    sid, ref = _follow_a_while_then_stop(svc, make_engine)
    svc.end_session(TEST_TOKEN, sid)  # while the daemon is down
    second = make_engine(svc, state=tmp_path)
    with Poller(svc, second):
        wait_until(lambda: finished(second.store, ref.key), message="drained")
    ((state, body),) = captured(second.store, ref.key)
    whole = render_ndjson(svc.log_lines(TEST_TOKEN, sid))
    assert state == "gap" and body and whole.startswith(body) and body != whole


def test_a_replay_that_does_not_start_with_the_kept_lines_is_kept_beside_them_never_merged(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path
) -> None:
    """A capture holding lines the service no longer replays (a rotated log): the old segment is
    kept as it was (diverged), the new one holds the replay from its first line."""
    sid = svc.add_session(TEST_TOKEN)
    ref = ref_of(svc, sid)
    seeded = CaptureStore(tmp_path)
    segment = seeded.begin(ref.key, sid, ref.created_ms, 0)
    seeded.set_shape(segment, "ndjson")
    rotated = [b'{"streamType": 1, "line": "from before the rotation"}', b'{"streamType": 1, "line": "x"}']
    seeded.append(segment, rotated)
    seeded.checkpoint(seeded.pending())
    seeded.release(segment)
    seeded.close()
    engine = make_engine(svc, state=tmp_path)
    with Poller(svc, engine):
        wait_until(lambda: len(engine.store.segments(ref.key)) == 2, message="a second segment")
        svc.end_session(TEST_TOKEN, sid)
        wait_until(lambda: finished(engine.store, ref.key), message="capture finished")
    assert captured(engine.store, ref.key) == [
        ("diverged", b"".join(x + b"\n" for x in rotated)),
        ("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid))),
    ]
    assert engine.stats().finished[Finish.DIVERGED] == 1


def test_plain_text_logs_keepalives_and_upstream_errors_are_taken_in_stride(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    """A service that only speaks text, sends blank keep-alive lines, and answers some follow
    requests 503, 429 or resets them: the capture is the text log, exactly."""
    svc.set_quirks(logs_text_only=True, logs_keepalive=True)
    svc.set_fault("GET /logs", status=503, count=2)
    engine = make_engine(svc)
    sids = [svc.add_session(TEST_TOKEN, lifetime=30.0) for _ in range(2)]
    with Poller(svc, engine):
        wait_until(lambda: engine.stats().ends["server_error"] == 2, message="503s answered")
        svc.set_fault("GET /logs", status=429, retry_after=0, count=1)
        wait_until(lambda: engine.stats().ends["throttled"] == 1, message="429 answered")
        for sid in sids:
            wait_until(lambda s=sid: finished(engine.store, ref_of(svc, s).key), message="captures finished")
    for sid in sids:
        (row,) = engine.store.segments(ref_of(svc, sid).key)
        assert row.shape == "text" and row.state == "complete"
        assert b"".join(engine.store.read(row)) == render_text(svc.log_lines(TEST_TOKEN, sid))


def test_a_silent_stream_is_reopened_after_the_stall_timeout_without_duplicating_lines(
    make_engine: Callable[..., LiveCapture],
) -> None:
    with FakeService((TEST_TOKEN,), clock=FakeClock(1_700_000_000, time_scale=SCALE), log_lines=2) as quiet:
        engine = make_engine(quiet, tuning=dataclasses.replace(FAST, stall_timeout=0.4))
        sid = quiet.add_session(TEST_TOKEN)
        ref = ref_of(quiet, sid)
        with Poller(quiet, engine):
            wait_until(lambda: engine.stats().ends["stalled"] >= 2, message="stalls")
            quiet.end_session(TEST_TOKEN, sid)
            wait_until(lambda: finished(engine.store, ref.key), message="capture finished")
        assert captured(engine.store, ref.key) == [("complete", render_ndjson(quiet.log_lines(TEST_TOKEN, sid)))]


def test_while_paused_the_loop_takes_no_line_and_catches_up_after(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    """The poll's pause: lines the service writes meanwhile wait in the kernel, none is taken,
    and every one arrives once the pause ends."""
    engine = make_engine(svc)
    sid = svc.add_session(TEST_TOKEN)
    ref = ref_of(svc, sid)
    engine.update([ref.key])
    wait_until(lambda: engine.stats().lines >= 6, message="following")
    with engine.paused():
        taken = engine.stats().lines
        written = len(svc.log_lines(TEST_TOKEN, sid))
        wait_until(lambda: len(svc.log_lines(TEST_TOKEN, sid)) >= written + 5, message="the service wrote more")
        assert engine.stats().lines == taken
    wait_until(lambda: engine.stats().lines >= written + 5, message="caught up")
    svc.end_session(TEST_TOKEN, sid)
    engine.update([])
    wait_until(lambda: finished(engine.store, ref.key), message="capture finished")
    assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]


def test_a_session_listed_again_after_its_capture_completed_stays_complete_and_is_not_doubled(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    """A flapping list: the session comes back after its end was captured; with its logs gone the
    reopen answers 404, and the capture is still the complete log, once."""
    svc.set_quirks(logs_gone_at_termination=True)
    engine = make_engine(svc)
    sid, ref = follow_to_its_end(svc, engine)
    engine.update([ref.key])  # listed again
    wait_until(lambda: engine.stats().ends["gone"] >= 1, message="the reopen answered 404")
    engine.update([])
    wait_until(lambda: finished(engine.store, ref.key), message="finished again")
    assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]


class _Watched(CaptureStore):
    """A real store that, as a segment finishes, asks the engine whether its session is followed:
    the fetch stage may ask at that very moment, from its own thread."""

    engine: LiveCapture | None = None
    answers: list[bool]

    def finish(self, segment: Segment, state: Finish) -> None:
        assert self.engine is not None
        self.answers.append(self.engine.following(segment.key))
        super().finish(segment, state)


def test_a_capture_counts_as_followed_at_every_step_of_its_finish_until_the_checkpoint(
    svc: FakeService, make_engine: Callable[..., LiveCapture], tmp_path: Path
) -> None:
    """Between the follow's release and its finish's checkpoint nothing may read the capture as
    final (a fetch would take the last checkpoint, without the last lines, marked gap)."""
    store = _Watched(tmp_path)
    store.answers = []
    engine = store.engine = make_engine(svc, captures=store)
    _, ref = follow_to_its_end(svc, engine)
    wait_until(lambda: not engine.following(ref.key), message="its finish checkpointed")
    assert store.answers == [True]


def test_starting_caps_the_follows_to_the_open_file_limit_with_a_warning_and_never_raises_it(
    svc: FakeService, make_engine: Callable[..., LiveCapture], caplog: pytest.LogCaptureFixture
) -> None:
    """Raising the limit reaches the whole process: the entry point's (`app.process.apply`), never
    live capture's, which only follows what the limit leaves room for."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limits[0] == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit to cap at")
    engine = make_engine(svc, max_streams=limits[0])
    assert engine.max_streams == streams_room(limits[0], limits[0]) < limits[0]
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limits
    assert f"leaves room for {engine.max_streams} follow streams, not {limits[0]}" in caplog.text


def test_a_stream_that_gives_no_answer_is_reopened_after_the_first_byte_timeout_long_before_the_stall(
    svc: FakeService, make_engine: Callable[..., LiveCapture]
) -> None:
    """The service takes the connection and says nothing (a swamped server): the follow is reopened
    after the first-byte timeout, not the stall timeout (30 s here), and the capture is exact; the
    time from the session's listing to its first line is in the first-byte histogram."""
    svc.set_fault("GET /logs", latency=20.0, count=1)  # the first follow request hangs for 20 s
    engine = make_engine(svc, tuning=dataclasses.replace(FAST, first_byte_timeout=0.5))
    sid = svc.add_session(TEST_TOKEN, lifetime=30.0)
    ref = ref_of(svc, sid)
    with Poller(svc, engine):
        wait_until(lambda: engine.stats().ends["silent"] == 1, timeout=10, message="the silent stream reopened")
        wait_until(lambda: finished(engine.store, ref.key), timeout=10, message="capture finished")
    assert captured(engine.store, ref.key) == [("complete", render_ndjson(svc.log_lines(TEST_TOKEN, sid)))]
    stats = engine.stats()
    assert stats.ends["stalled"] == 0
    assert sum(stats.first_byte_counts) == 1
    assert 0.5 <= stats.first_byte_sum < 10.0
