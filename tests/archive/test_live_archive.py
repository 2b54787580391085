"""What gets archived of live captures (the pipeline against the fake, a directory store): the logs read after
the end as before, a capture beside them only where it differs, the capture alone when the service kept no
logs, each item saying its source and how complete it is; and retrieval (show, logs, grep, the browser's
search) reads either the same way."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import html
import io
import json
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from archiver.archive.fetcher import LIVE_WAIT_MARGIN
from archiver.archive.state.rows import session_key
from archiver.archive.state.schema import DB_NAME as STATE_DB_NAME
from archiver.browse.app import BrowseApp
from archiver.config.credentials import Token
from archiver.fake import FakeClock, FakeService
from archiver.fake.logs import render_ndjson, render_text
from archiver.layout import keys
from archiver.layout.manifest import Manifest, ManifestItem, parse_manifest
from archiver.live.engine import LiveCapture
from archiver.live.policy import Finish
from archiver.live.segment import SegmentRow
from archiver.live.store import DIR_NAME, CaptureStore
from archiver.live.table import DB_NAME
from archiver.retrieval.grep import Matcher, grep_sessions
from archiver.retrieval.query import list_sessions
from archiver.retrieval.reading import print_logs
from archiver.retrieval.render import show_session
from archiver.retrieval.verify import verify
from archiver.store import ObjectStore
from tests import fixtures_retrieval
from tests.fixtures_pipeline import TOKEN, Harness
from tests.support import LIVE_FAST, wait_until

store = fixtures_retrieval.file_store


def _live(fake: FakeService, tmp_path: Path, *, drain: float = LIVE_FAST.drain_timeout,
          captures: CaptureStore | None = None) -> LiveCapture:  # fmt: skip
    """Live capture for the harness's state dir (started with the pipeline); ``drain``: how long a
    session that left the list is followed."""
    captures = captures if captures is not None else CaptureStore(tmp_path / "state")
    tuning = dataclasses.replace(LIVE_FAST, drain_timeout=drain)
    return LiveCapture(fake.base_url, Token(TOKEN), captures, max_streams=10, tuning=tuning)


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with FakeService((TOKEN,), clock=FakeClock(1_700_000_000, time_scale=20.0), log_lines=20) as service:
        yield service


@pytest.fixture
def long_fake() -> Iterator[FakeService]:
    """Sessions that write a line every 2 virtual seconds for hours: their logs grow all through a test."""
    with FakeService((TOKEN,), clock=FakeClock(1_700_000_000, time_scale=20.0), log_lines=10_000) as service:
        yield service


def _key(fake: FakeService, sid: str) -> str:
    return session_key(sid, int(fake.session(TOKEN, sid).created * 1000))


def _archive(h: Harness, sids: list[str]) -> dict[str, Manifest]:
    """Poll until every session of `sids` has its manifest; their manifests."""
    prefix = h.store.prefix

    def manifests() -> dict[str, Manifest] | None:
        h.poll()
        found = {}
        for sid in sids:
            row = h.state.latest(sid)
            if row is None or row.state != "archived":
                return None
            found[sid] = parse_manifest(h.object_bytes(keys.manifest_key(prefix, sid, row.instance)))
        return found

    return wait_until(manifests, timeout=40.0, message="archived")


def _logs(h: Harness, manifest: Manifest) -> list[tuple[ManifestItem, bytes]]:
    return [
        (item, gzip.decompress(h.object_bytes(item.key)))
        for item in manifest.items
        if item.kind == "logs" and item.key is not None
    ]


def _grep(store: ObjectStore, pattern: str, *, now: float) -> list[tuple[str | None, str]]:
    """`archiver grep PATTERN --format json` over the last day's archives: each hit's item and line."""
    out = io.StringIO()
    report = grep_sessions(store, list_sessions(store, now=now), Matcher(pattern), out, fmt="json")
    assert report.problems == []
    return [(hit.get("source"), hit["line"]) for hit in map(json.loads, out.getvalue().splitlines())]


def _seed(state_dir: Path, key: str, lines: list[bytes], state: Finish, shape: str = "ndjson") -> None:
    """A capture a daemon left behind (live capture since turned off): one finished segment."""
    captures = CaptureStore(state_dir)
    segment = captures.begin(key, key.partition(":")[2], int(key.partition(":")[0]), 0)
    captures.set_shape(segment, shape)
    captures.append(segment, lines)
    captures.finish(segment, state)
    captures.checkpoint(captures.pending())
    captures.close()


def test_without_the_quirk_the_after_end_body_is_archived_as_before_and_the_capture_adds_nothing(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """Live capture on, logs kept after the end: one logs item per session, the after-end body, no
    `capture` field, no `logs.live-*` object; and the captures are gone from the state dir."""
    live = _live(fake, tmp_path)
    h = harness_factory(fake, store, live=live, artifact_paths=())
    sids = [fake.add_session(TOKEN, lifetime=20.0, crashed=i == 1) for i in range(2)]
    wait_until(lambda: (h.poll(), live.stats().lines >= 8)[1], message="following")
    for sid, manifest in _archive(h, sids).items():
        ((item, body),) = _logs(h, manifest)
        assert item.capture is None and item.source.startswith("GET /query/log")
        assert body == render_text(fake.log_lines(TOKEN, sid))
    assert not [k for k in store.list_keys(store.prefix) if ".live-" in k]
    assert live.stats().finished[Finish.COMPLETE] == 2
    h.pipeline.gauges()  # what the daemon reports after every poll: archiver_live_*
    sample = h.registry.get_sample_value
    assert sample("archiver_live_lines_total") == live.stats().lines > 0
    assert sample("archiver_live_bytes_total") == live.stats().bytes
    assert sample("archiver_live_captures_total", {"state": "complete"}) == 2
    assert sample("archiver_live_followed_sessions") == 0
    h.pipeline.gauges()  # a second report adds nothing that did not grow
    assert sample("archiver_live_lines_total") == live.stats().lines
    wait_until(lambda: not any(CaptureStore(tmp_path / "state").segments(_key(fake, s)) for s in sids))


def test_with_logs_gone_at_termination_the_live_capture_is_the_archived_log_marked_complete(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    fake.set_quirks(logs_gone_at_termination=True)
    live = _live(fake, tmp_path)
    h = harness_factory(fake, store, live=live, artifact_paths=())
    sids = [fake.add_session(TOKEN, lifetime=15.0, crashed=i == 0) for i in range(2)]
    for sid, manifest in _archive(h, sids).items():
        ((item, body),) = _logs(h, manifest)
        assert item.outcome == "archived" and item.capture == "complete"
        assert item.source == f"GET /logs?id={sid}&follow=true"
        assert body == render_ndjson(fake.log_lines(TOKEN, sid))
        assert item.key == keys.logs_key(store.prefix, sid, "jsonl", manifest.instance)


def test_a_capture_that_differs_from_the_after_end_body_is_kept_beside_it_never_merged(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """A capture holding a line the service's after-end body lacks (it lost or rewrote it): both
    are archived, the capture as `logs.live-0.jsonl.gz` with its state."""
    sid = fake.add_session(TOKEN)
    seen_text = "a line the service no longer has"
    seen = [b'{"streamType": 1, "line": "%s"}' % seen_text.encode()]
    _seed(tmp_path / "state", _key(fake, sid), seen, Finish.COMPLETE)
    h = harness_factory(fake, store, artifact_paths=())
    h.poll()
    fake.end_session(TOKEN, sid)
    manifest = _archive(h, [sid])[sid]
    (main, main_body), (beside, beside_body) = _logs(h, manifest)
    assert main.capture is None and main_body == render_text(fake.log_lines(TOKEN, sid))
    assert beside.capture == "complete" and beside.key == keys.live_logs_key(
        store.prefix, sid, "jsonl", 0, manifest.instance
    )
    assert beside_body == seen[0] + b"\n"
    # `archiver logs` reads the logs read after the end; --capture the capture kept beside them.
    out = io.StringIO()
    print_logs(store, sid, out, capture=True)
    assert out.getvalue() == "a line the service no longer has\n"
    # The browser labels the capture and views it the same way.
    app = BrowseApp(store, clock=fake.clock.now)
    page = b"".join(app.handle(f"/sessions/{sid}").body).decode()
    assert "live capture: complete" in page and "capture=1" in page
    view = b"".join(app.handle(f"/sessions/{sid}/logs?capture=1").body).decode()
    assert "a line the service no longer has" in view
    assert "a line the service no longer has" not in b"".join(app.handle(f"/sessions/{sid}/logs").body).decode()
    # `archiver show` lists both items.
    shown = io.StringIO()
    show_session(store, sid, shown)
    assert "(session logs)\n" in shown.getvalue() and "(session logs, live capture, complete)\n" in shown.getvalue()
    # `archiver grep` searches both, each hit naming its item: every line once, the capture's last.
    after_end = [line for _, line in fake.log_lines(TOKEN, sid)]
    assert _grep(store, ".", now=fake.clock.now()) == [*(("logs", line) for line in after_end), ("capture", seen_text)]
    # The browser's search finds the line only the capture holds and links it to the capture's view, at its line.
    search = html.unescape(b"".join(app.handle("/search?q=no+longer+has").body).decode())
    (link,) = re.findall(r'class="hit-line" href="([^"]*)"', search)
    assert link == f"/sessions/{sid}/logs?instance={manifest.instance}&capture=1#L1"
    target = b"".join(app.handle(link.partition("#")[0]).body).decode()
    assert re.search(rf'id="L1" href="#L1">\s*1</a> <span class="stdout">{seen_text}</span>', target)


def test_a_capture_the_after_end_body_already_holds_is_not_archived_twice(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    sid = fake.add_session(TOKEN)
    fake.advance(10)
    prefix_lines = render_ndjson(fake.log_lines(TOKEN, sid)[:5]).splitlines()
    _seed(tmp_path / "state", _key(fake, sid), prefix_lines, Finish.GAP)
    h = harness_factory(fake, store, artifact_paths=())
    h.poll()
    fake.end_session(TOKEN, sid)
    ((item, body),) = _logs(h, _archive(h, [sid])[sid])
    assert item.capture is None and body == render_text(fake.log_lines(TOKEN, sid))
    # Searched once: each line found once, as before live capture (no item named).
    assert _grep(store, ".", now=fake.clock.now()) == [(None, line) for _, line in fake.log_lines(TOKEN, sid)]


def test_a_known_gap_is_archived_as_such_and_retrieval_reads_a_capture_like_any_log(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """Logs gone after the end and a capture that never saw the end: the capture is the log,
    marked `gap`; `archiver logs`, `show` and `verify` read it as they read any log."""
    fake.set_quirks(logs_gone_at_termination=True)
    sid = fake.add_session(TOKEN)
    fake.advance(10)
    kept = fake.log_lines(TOKEN, sid)[:6]
    _seed(tmp_path / "state", _key(fake, sid), [line.encode() for _, line in kept], Finish.GAP, shape="text")
    h = harness_factory(fake, store, artifact_paths=())
    h.poll()
    fake.end_session(TOKEN, sid)
    manifest = _archive(h, [sid])[sid]
    ((item, body),) = _logs(h, manifest)
    assert item.capture == "gap" and body == render_text(kept)
    out = io.StringIO()
    assert print_logs(store, sid, out) == len(kept)
    assert out.getvalue().splitlines() == [line for _, line in kept]
    shown = io.StringIO()
    show_session(store, sid, shown)
    assert "live capture, gap" in shown.getvalue()
    report = verify(store, session_ids=[sid], now=fake.clock.now(), workers=1)
    assert report.ok and report.objects >= 1, [p.line() for p in report.problems]


def _logs_item_deadline(h: Harness, key: str) -> float:
    (item,) = [i for i in h.state.items_of(key) if i.kind == "logs"]
    return item.deadline


def _checkpointed(captures: CaptureStore, key: str) -> int:
    """Lines the capture's checkpoint records."""
    return sum(row.kept.lines for row in captures.segments(key))


def test_logs_whose_after_end_read_keeps_failing_are_archived_from_the_capture_at_the_deadline(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """`/query/log` and `/logs` answer 503 until the deadline: the complete capture is the logs
    (its source and state as always), not an expired item."""
    sid = fake.add_session(TOKEN)
    fake.advance(10)
    lines = render_ndjson(fake.log_lines(TOKEN, sid)).splitlines()
    _seed(tmp_path / "state", _key(fake, sid), lines, Finish.COMPLETE)
    h = harness_factory(fake, store, artifact_paths=())
    h.poll()
    fake.clock.time_scale = 0  # only `advance` moves the clock: the deadline comes when the test says
    fake.set_fault("GET /query/log", status=503)
    fake.set_fault("GET /logs", status=503)
    fake.end_session(TOKEN, sid)
    h.poll()
    wait_until(lambda: fake.faults_fired("GET /query/log").get("503", 0) >= 2, message="the read after the end fails")
    fake.advance(_logs_item_deadline(h, _key(fake, sid)) - fake.clock.now() + 1.0)
    ((item, body),) = _logs(h, _archive(h, [sid])[sid])
    assert (item.outcome, item.capture, item.source) == ("archived", "complete", f"GET /logs?id={sid}&follow=true")
    assert body == b"".join(line + b"\n" for line in lines)


def test_a_session_listed_again_after_its_archive_is_captured_whole_for_its_second_archive(
    long_fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """Taken for ended (two 404s) while it runs, archived, its capture removed; listed again within
    the hour, it is re-opened (`-r1`) and followed afresh: its real end's archive holds every line."""
    long_fake.set_quirks(logs_gone_at_termination=True)
    live = _live(long_fake, tmp_path, drain=1.0)
    h = harness_factory(long_fake, store, live=live, artifact_paths=())
    sid = long_fake.add_session(TOKEN, id="listed-again")
    key = _key(long_fake, sid)
    wait_until(lambda: (h.poll(), live.stats().lines >= 5)[1], message="following")
    long_fake.hide_from_list(TOKEN, sid, polls=1)
    long_fake.set_fault("GET /session/{id}", status=404, count=2)
    h.poll()  # not listed: taken for ended, archived while its follow drains (no poll meanwhile)
    wait_until(lambda: h.state.latest(sid).state == "archived", timeout=40, message="the first archive")  # type: ignore[union-attr]
    first = h.instance(sid)
    wait_until(lambda: not live.store.segments(key), message="the first archive removed the capture")
    h.poll()  # listed again: re-opened, followed again
    again = live.stats().lines
    wait_until(lambda: (h.poll(), live.stats().lines >= again + 5)[1], message="following again")
    long_fake.end_session(TOKEN, sid)
    manifest = _archive(h, [sid])[sid]
    assert manifest.instance == f"{first}-r1"
    ((item, body),) = _logs(h, manifest)
    assert item.capture == "complete" and body == render_ndjson(long_fake.log_lines(TOKEN, sid))


def test_a_quarantined_session_stays_followed_and_its_capture_is_whole(
    long_fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """An entry the poll quarantines is still running: its follow goes on past the drain timeout."""
    long_fake.set_quirks(logs_gone_at_termination=True)
    live = _live(long_fake, tmp_path, drain=0.5)
    h = harness_factory(long_fake, store, live=live, artifact_paths=())
    sid = long_fake.add_session(TOKEN)
    wait_until(lambda: (h.poll(), live.stats().lines >= 3)[1], message="following")
    long_fake.hide_from_list(TOKEN, sid, polls=1_000_000)
    long_fake.inject_list_entries(TOKEN, [{"id": sid, "image": "i", "location": "l", "created": -1}])
    h.poll()
    assert h.client.list_sessions().invalid[0].session_id == sid  # quarantined, not gone
    taken = live.stats().lines
    wait_until(lambda: (h.poll(), live.stats().lines >= taken + 30)[1], message="followed while quarantined")
    assert (live.stats().followed, live.stats().draining) == (1, 0)
    long_fake.end_session(TOKEN, sid)
    long_fake.clear_list_entries(TOKEN)
    ((item, body),) = _logs(h, _archive(h, [sid])[sid])
    assert item.capture == "complete" and body == render_ndjson(long_fake.log_lines(TOKEN, sid))


class _BuggyCaptures(CaptureStore):
    """A real store whose `pending` raises once ``broken`` is set: a bug that kills the live loop."""

    broken = False

    def pending(self, progress_every: float = 0.0) -> list[SegmentRow]:
        if self.broken:
            raise RuntimeError("a bug in the live loop")
        return super().pending(progress_every)


def test_when_the_live_loop_dies_the_logs_are_archived_at_once_from_what_it_checkpointed(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    fake.set_quirks(logs_gone_at_termination=True)
    captures = _BuggyCaptures(tmp_path / "state")
    live = _live(fake, tmp_path, captures=captures)
    h = harness_factory(fake, store, live=live, artifact_paths=())
    sid = fake.add_session(TOKEN)
    key = _key(fake, sid)
    wait_until(lambda: (h.poll(), _checkpointed(captures, key) >= 5)[1], message="following")
    caplog.set_level(logging.ERROR, logger="archiver.live")
    captures.broken = True
    wait_until(lambda: not live.following(key), message="the live loop died")
    kept = _checkpointed(captures, key)
    fake.end_session(TOKEN, sid)
    ((item, body),) = _logs(h, _archive(h, [sid])[sid])  # not held until the deadline
    assert item.capture == "gap" and body == render_ndjson(fake.log_lines(TOKEN, sid)[:kept])
    live_errors = [
        r.getMessage() for r in caplog.records if r.name.startswith("archiver.live") and r.levelno >= logging.ERROR
    ]
    assert live_errors == ["live capture stopped on an error"]  # once, though every later checkpoint would fail
    h.pipeline.gauges()
    assert h.registry.get_sample_value("archiver_errors_total", {"where": "live"}) == 1
    assert h.registry.get_sample_value("archiver_live_followed_sessions") == 0


def test_logs_stop_waiting_for_a_capture_whose_checkpoints_keep_failing_before_their_deadline(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """Another writer holds the captures' database: the capture finishes but its checkpoint never
    commits. Within `LIVE_WAIT_MARGIN` of the deadline the logs item stops waiting for it and
    archives what the capture's checkpoint holds, as a gap."""
    fake.set_quirks(logs_gone_at_termination=True)
    live = _live(fake, tmp_path)
    h = harness_factory(fake, store, live=live, artifact_paths=())
    sid = fake.add_session(TOKEN)
    key = _key(fake, sid)
    wait_until(lambda: (h.poll(), _checkpointed(live.store, key) >= 5)[1], message="following")
    fake.clock.time_scale = 0
    with contextlib.closing(sqlite3.connect(tmp_path / "state" / DIR_NAME / DB_NAME, timeout=30.0)) as other:
        other.execute("BEGIN IMMEDIATE")
        kept = _checkpointed(live.store, key)
        fake.end_session(TOKEN, sid)
        wait_until(lambda: (h.poll(), live.stats().finished[Finish.COMPLETE] == 1)[1], message="capture finished")
        wait_until(lambda: h.state.items_of(key), message="logs item")
        assert live.following(key)  # its finish is not checkpointed: the logs item waits
        deadline = _logs_item_deadline(h, key)
        fake.advance(deadline - fake.clock.now() - LIVE_WAIT_MARGIN / 2)
        ((item, body),) = _logs(h, _archive(h, [sid])[sid])
        other.rollback()
    assert item.capture == "gap" and body == render_ndjson(fake.log_lines(TOKEN, sid)[:kept])
    assert fake.clock.now() < deadline


def test_a_logs_item_waiting_for_its_capture_makes_no_commit_and_counts_no_attempt_until_it_settles(
    fake: FakeService, store: ObjectStore, harness_factory: Callable[..., Harness], tmp_path: Path
) -> None:
    """While the capture's finish cannot be checkpointed (another writer holds its database) the
    session's logs item waits: the fetch workers pass it over, so the state DB sees no commit and
    the item no attempt. Once the checkpoint commits, the capture settles, the item is woken and
    archived from it on its first attempt."""
    fake.set_quirks(logs_gone_at_termination=True)
    live = _live(fake, tmp_path)
    h = harness_factory(fake, store, live=live, artifact_paths=())
    sid = fake.add_session(TOKEN)
    key = _key(fake, sid)
    wait_until(lambda: (h.poll(), _checkpointed(live.store, key) >= 5)[1], message="following")
    with contextlib.closing(sqlite3.connect(tmp_path / "state" / DIR_NAME / DB_NAME, timeout=30.0)) as other:
        other.execute("BEGIN IMMEDIATE")
        fake.end_session(TOKEN, sid)
        wait_until(lambda: (h.poll(), live.stats().finished[Finish.COMPLETE] == 1)[1], message="capture finished")
        wait_until(lambda: h.state.items_of(key), message="logs item")
        assert live.following(key)
        with contextlib.closing(sqlite3.connect(tmp_path / "state" / STATE_DB_NAME)) as watcher:
            before = watcher.execute("PRAGMA data_version").fetchone()[0]
            # An observation window, not a wait for an event: the old loop claimed, wrote back and
            # fsynced a waiting item every LIVE_RECHECK (2 s), and its workers wake every 0.5 s here.
            threading.Event().wait(3.0)
            after = watcher.execute("PRAGMA data_version").fetchone()[0]
        (item,) = h.state.items_of(key)
        assert (item.status, item.attempts, item.last_error) == ("pending_fetch", 0, None)
        assert after == before, "the state DB committed while the logs item waited"
        other.rollback()
    ((archived, body),) = _logs(h, _archive(h, [sid])[sid])
    assert archived.capture == "complete" and body == render_ndjson(fake.log_lines(TOKEN, sid))
    (item,) = h.state.items_of(key)
    assert item.attempts == 1
