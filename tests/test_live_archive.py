"""What gets archived of live captures (the pipeline against the fake, a directory store): the logs read after
the end as before, a capture beside them only where it differs, the capture alone when the service kept no
logs, each item saying its source and how complete it is; and retrieval (show, logs, grep, the browser's
search) reads either the same way."""

from __future__ import annotations

import gzip
import html
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from archiver.archive.state.rows import session_key
from archiver.browse.app import BrowseApp
from archiver.credentials import Token
from archiver.fake import FakeClock, FakeService
from archiver.fake.logs import render_ndjson, render_text
from archiver.layout import keys
from archiver.layout.manifest import Manifest, ManifestItem, parse_manifest
from archiver.live.engine import LiveCapture
from archiver.live.policy import Finish
from archiver.live.store import CaptureStore
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


def _live(fake: FakeService, tmp_path: Path) -> LiveCapture:
    """Live capture for the harness's state dir (started with the pipeline)."""
    return LiveCapture(fake.base_url, Token(TOKEN), CaptureStore(tmp_path / "state"), max_streams=10, tuning=LIVE_FAST)


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with FakeService((TOKEN,), clock=FakeClock(1_700_000_000, time_scale=20.0), log_lines=20) as service:
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
