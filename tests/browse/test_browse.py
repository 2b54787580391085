"""The evidence browser over HTTP against real stores (a directory, the moto S3 server) holding real archives.

Archives are written with ``tests.support.put_session`` (objects, manifest, index entry, the
way archiver/upload.py stores them); the pages are fetched from a real ``BrowseServer`` with httpx.
"""

from __future__ import annotations

import hashlib
import html
import io
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
from markupsafe import escape
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.browse.urls import session_path
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.layout import keys
from archiver.layout.manifest import manifest_to_bytes, parse_manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retrieval import retrieve
from archiver.store import ObjectStore, open_store
from archiver.textsafe import printable
from archiver.upstream.api import SessionHostClient, Token
from archiver.web.webconfig import load_web_config
from tests import fixtures_retrieval
from tests.fixtures_fake import TEST_TOKEN
from tests.fixtures_http import TLSFiles
from tests.fixtures_pipeline import FAST, FAST_POLICY
from tests.support import ARTIFACT_PATHS, HOSTILE_IDS, HOUR, Browsers, put_session

NOW = time.time()
XSS_ID = '<script>alert("id")</script>'
XSS_LABEL = "<img src=x onerror=alert(1)>"


# The stores of the retrieval tests (pytest finds fixtures by module name).
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store


@pytest.fixture
def browse(store: ObjectStore) -> Iterator[Callable[..., httpx.Client]]:
    """``browse(page_size=..., web_config=...)``: a started server over ``store`` and an httpx client for it."""
    browsers = Browsers()

    def start(page_size: int = 50, log_page_lines: int = 500, **client_args: Any) -> httpx.Client:
        web_config = client_args.pop("web_config", None)
        return browsers.start(
            store, web_config=web_config, client_args=client_args,
            page_size=page_size, log_page_lines=log_page_lines, clock=lambda: NOW,
        )  # fmt: skip

    yield start
    browsers.close()


def _session_ids(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<a class="session" href="[^"]*">([^<]*)</a>', page)]


def _next(page: str) -> str | None:
    found = re.search(r'<a id="older" href="([^"]*)"', page)
    return html.unescape(found.group(1)) if found else None


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_list_pages_through_every_session_newest_first_without_repeats(
    store: ObjectStore, browse: Callable[..., httpx.Client], page_size: int
) -> None:
    """Keyset pages cover each session once, newest first: ties, and ends exactly on window boundaries, included."""
    hour = (NOW // HOUR) * HOUR
    ends = {f"s-{i:03d}": NOW - 60 - i * 1900 for i in range(23)}  # spread over ~12 index hours
    ends["s-tie"] = ends["s-005"]
    ends.update({"s-edge-1": hour, "s-edge-2": hour, "s-edge-3": hour - HOUR, "s-edge-4": hour - 3 * HOUR})
    for sid, ended_at in ends.items():
        put_session(store, sid, ended_at=ended_at)
    expected = sorted(ends, key=lambda sid: (-ends[sid], sid))
    client = browse(page_size=page_size)
    seen: list[str] = []
    url: str | None = "/sessions"
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200
        ids = _session_ids(response.text)
        assert len(ids) <= page_size
        seen += ids
        url = _next(response.text)
    assert seen == expected


def test_the_list_filters_like_archiver_ls(store: ObjectStore, browse: Callable[..., httpx.Client]) -> None:
    """Image (NAME or NAME:TAG), location, label and time range narrow the list; a bad value is a 400 saying why."""
    put_session(store, "old", ended_at=NOW - 30 * HOUR)
    put_session(store, "eu", ended_at=NOW - HOUR, location="eu-west-1", labels={"mode": "ranked"})
    put_session(store, "us", ended_at=NOW - 2 * HOUR, location="us-east-1", tag="2.0.0")
    client = browse()
    assert _session_ids(client.get("/sessions").text) == ["eu", "us"]
    assert _session_ids(client.get("/sessions", params={"since": "2d"}).text) == ["eu", "us", "old"]
    assert _session_ids(client.get("/sessions", params={"location": "us-east-1"}).text) == ["us"]
    assert _session_ids(client.get("/sessions", params={"image": "demo-game:2.0.0"}).text) == ["us"]
    assert _session_ids(client.get("/sessions", params={"label": "mode=ranked"}).text) == ["eu"]
    assert _session_ids(client.get("/sessions", params={"since": "2d", "until": "20h"}).text) == ["old"]
    bad = client.get("/sessions", params={"label": "no-equals-sign"})
    assert bad.status_code == 400 and "KEY=VALUE" in bad.text
    # A lone surrogate typed into a filter is echoed back harmlessly, not a server error.
    assert client.get("/sessions?image=%ED%A0%80").status_code == 200


@pytest.mark.parametrize("sid", [XSS_ID, *HOSTILE_IDS], ids=repr)
def test_hostile_ids_and_labels_render_as_text_with_working_links(
    file_store: ObjectStore, sid: str, tmp_path: Path
) -> None:
    """A session id or label full of markup, path tricks or control characters shows as escaped text on every page."""
    put_session(file_store, sid, ended_at=NOW - 60, labels={"note": XSS_LABEL}, logs=b"<script>alert(2)</script>\n")
    with BrowseServer(("127.0.0.1", 0), BrowseApp(file_store, clock=lambda: NOW)) as server:
        client = httpx.Client(base_url=server.url)
        listing = client.get("/sessions")
        assert listing.status_code == 200
        assert _session_ids(listing.text) == [printable(sid)]
        page = client.get(session_path(sid))
        assert page.status_code == 200
        logs = client.get(session_path(sid, suffix="/logs"))
        assert logs.status_code == 200
        for body in (listing.text, page.text, logs.text):
            assert "<script" not in body and "<img" not in body
            assert "\x1b" not in body and "\u202e" not in body
        assert str(escape(printable(sid))) in page.text
        assert str(escape(XSS_LABEL)) in page.text
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in logs.text
        assert "script-src" not in listing.headers["content-security-policy"]  # no script may run at all
        download = client.get(session_path(sid, suffix="/items/0"))
        disposition = download.headers["content-disposition"]
        assert download.status_code == 200
        assert disposition.isascii() and re.fullmatch(
            r"attachment; filename=\"[A-Za-z0-9._-]+\"; filename\*=UTF-8''[A-Za-z0-9._-]+", disposition
        )


def test_the_session_page_shows_the_facts_of_archiver_show_and_every_item(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    """Manifest facts, each item's outcome, size and sha256, and a download link per stored object."""
    m = put_session(store, "match-1", ended_at=NOW - 60, artifacts={"/srv/replays/match.replay": b"R" * 2048})
    page = browse().get("/sessions/match-1")
    assert page.status_code == 200
    shown = io.StringIO()
    retrieve.show_session(store, "match-1", shown)
    facts = shown.getvalue().split("\n\n")[0].splitlines()  # "Name   value" rows of `archiver show`
    assert len(facts) >= 12
    for row in facts:
        name, value = re.split(r"\s{2,}", row, maxsplit=1)
        assert f"<th>{name}</th>" in page.text
        assert str(escape(value)) in page.text, row
    assert "2.0 KiB" in page.text
    for item in m.items:
        assert item.sha256 is not None and item.sha256 in page.text
    assert page.text.count('class="download"') == 2


def test_a_download_streams_the_stored_object_whose_sha256_is_the_manifests(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    """The artifact's bytes arrive as stored, octet-stream (never rendered), with a safe attachment name."""
    data = bytes(range(256)) * 4096 + b"tail"
    m = put_session(store, "match/2", ended_at=NOW - 60, artifacts={"/srv/replays/match.replay": data})
    item = next(i for i in m.items if i.kind == "artifact")
    digest = hashlib.sha256()
    with browse().stream("GET", session_path("match/2", suffix="/items/1")) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-length"] == str(len(data))
        assert response.headers["content-disposition"].startswith('attachment; filename="match_2F2-srv-replays-')
        for chunk in response.iter_bytes():
            digest.update(chunk)
    assert digest.hexdigest() == item.sha256


def test_the_log_viewer_pages_filters_by_stream_and_searches(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    """NDJSON logs: stream filter keeps one stream, search is case-insensitive, pages follow each other."""
    lines = b"".join(
        b'{"stream": "%s", "line": "line %d %s"}\n' % (b"stderr" if i % 3 == 0 else b"stdout", i, b"Boom" * (i == 7))
        for i in range(25)
    )
    put_session(store, "ndjson", ended_at=NOW - 60, logs=lines, log_ext="jsonl")
    client = browse(log_page_lines=10)
    first = client.get("/sessions/ndjson/logs")
    assert "line 0" in first.text and "line 9" in first.text and "line 10" not in first.text
    later = client.get(html.unescape(re.search(r'<a id="next" href="([^"]*)"', first.text).group(1)))  # type: ignore[union-attr]
    assert "line 10" in later.text and "line 19" in later.text and "line 9 " not in later.text
    stderr = client.get("/sessions/ndjson/logs", params={"stream": "stderr"})
    shown = re.findall(r"line (\d+)", stderr.text)
    assert shown and all(int(n) % 3 == 0 for n in shown)
    found = client.get("/sessions/ndjson/logs", params={"q": "boom"})
    assert re.findall(r"line (\d+)", found.text) == ["7"]
    assert "stored bytes match" in found.text


def test_a_reused_id_lists_its_archives_and_each_page_reads_its_own(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    """Two archives of one id: the page shows the newest and links the other by instance."""
    old, new = keys.instance_name((NOW - 5 * HOUR) * 1000), keys.instance_name((NOW - HOUR) * 1000)
    put_session(store, "reused", ended_at=NOW - 4 * HOUR, instance=old, created=NOW - 5 * HOUR, location="old-loc")
    put_session(store, "reused", ended_at=NOW - 30, instance=new, created=NOW - HOUR, location="new-loc")
    client = browse()
    page = client.get("/sessions/reused")
    assert "new-loc" in page.text and f"?instance={old}" in page.text
    assert "old-loc" in client.get("/sessions/reused", params={"instance": old}).text


def test_a_manifest_pointing_elsewhere_is_refused_not_followed(
    file_store: ObjectStore,
) -> None:
    """A tampered manifest whose item key leaves the session's prefix gives a 502 page, never those bytes."""
    put_session(file_store, "victim", ended_at=NOW - 60, artifacts={"/a": b"secret-of-victim"})
    m = put_session(file_store, "evil", ended_at=NOW - 60, artifacts={"/a": b"x"})
    victim_key = keys.artifact_key(file_store.prefix, "victim", "/a")
    doc = manifest_to_bytes(m).replace(keys.artifact_key(file_store.prefix, "evil", "/a").encode(), victim_key.encode())
    tampered = parse_manifest(doc)
    root = Path(file_store.url.removeprefix("file://"))
    (root / keys.manifest_key(file_store.prefix, "evil")).write_bytes(manifest_to_bytes(tampered))
    with BrowseServer(("127.0.0.1", 0), BrowseApp(file_store, clock=lambda: NOW)) as server:
        response = httpx.get(server.url + "/sessions/evil/items/1")
    assert response.status_code == 502
    assert "secret-of-victim" not in response.text and "unexpected key" in response.text


def test_unknown_sessions_are_404_and_writes_are_refused(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    client = browse()
    assert client.get("/sessions/never-archived").status_code == 404
    assert client.get("/sessions/x/items/0").status_code == 404
    assert client.post("/sessions", content=b"x").status_code == 405
    assert client.get("/").headers["location"] == "/sessions"


def test_tls_and_basic_auth_from_the_web_config_guard_every_page(
    store: ObjectStore, browse: Callable[..., httpx.Client], tmp_path: Path, self_signed_cert: TLSFiles
) -> None:
    """The exporter-toolkit web config of /metrics: HTTPS only, and no page without the bcrypt-checked password."""
    put_session(store, "guarded", ended_at=NOW - 60)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {self_signed_cert.cert}\n  key_file: {self_signed_cert.key}\n"
        f"basic_auth_users:\n  support: '{hashed}'\n"
    )
    client = browse(web_config=load_web_config(config), verify=ssl.create_default_context(cafile=self_signed_cert.cert))
    assert str(client.base_url).startswith("https://")
    for path in ("/sessions", "/sessions/guarded", "/sessions/guarded/items/0", "/sessions/guarded/logs"):
        assert client.get(path).status_code == 401
        assert client.get(path, auth=("support", "wrong")).status_code == 401
        assert client.get(path, auth=("support", "s3cret")).status_code == 200


def test_archiver_browse_serves_a_store_and_prints_its_url(tmp_path: Path) -> None:
    """`archiver browse --store … --web.listen-address 127.0.0.1:0` prints the URL of the list, which serves it."""
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    put_session(store, "cli-session", ended_at=time.time() - 60)
    listen = ["--web.listen-address", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "archiver.cli", "browse", "--store", root.as_uri(), *listen],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = re.search(r"(http://\S+/sessions)", line)
        assert url, line
        assert "cli-session" in httpx.get(url.group(1), timeout=10).text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_client_leaving_mid_download_leaves_the_server_serving(
    store: ObjectStore, browse: Callable[..., httpx.Client]
) -> None:
    """An abandoned 8 MiB download and a HEAD (headers only) do not disturb the next request."""
    put_session(store, "big", ended_at=NOW - 60, artifacts={"/srv/replays/big.replay": b"\x00" * (8 << 20)})
    client = browse()
    head = client.head("/sessions/big/items/1")
    assert head.status_code == 200 and head.headers["content-length"] == str(8 << 20) and head.content == b""
    with httpx.Client(base_url=client.base_url) as leaving, leaving.stream("GET", "/sessions/big/items/1") as r:
        next(r.iter_raw())
    assert client.get("/sessions/big").status_code == 200


def test_a_session_archived_by_the_real_pipeline_reads_back_without_its_env_values(
    fake_service: FakeService, store: ObjectStore, tmp_path: Path
) -> None:
    """Poll, end, fetch, upload by the real pipeline; every page and download works, and no env value shows."""
    secret = "hunter2-DB-PASSWORD-never-shown"
    settings = Settings(state_dir=tmp_path / "state", artifact_paths=ARTIFACT_PATHS, fetch_workers=2)
    client = SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN), policy=FAST_POLICY)
    state = StateDB.open(settings.state_dir)
    metrics = SelfMetrics(CollectorRegistry())
    clock = fake_service.clock.now
    pipeline = Pipeline(settings, client, store, state, metrics, clock=clock, policy=FAST_POLICY, tuning=FAST)
    pipeline.recover()
    pipeline.start()
    try:
        sid = fake_service.add_session(TEST_TOKEN, labels={"mode": "ranked"}, env={"DB_PASSWORD": secret})
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        fake_service.end_session(TEST_TOKEN, sid)
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        assert pipeline.run_until_idle(30), "the pipeline did not archive the session in time"
    finally:
        pipeline.stop(10.0)
        client.close()
        state.close()
    # The fake service runs on its own clock: the browser's "now" is that clock, as the archive's times are.
    server = BrowseServer(("127.0.0.1", 0), BrowseApp(store, clock=fake_service.clock.now))
    server.start()
    web = httpx.Client(base_url=server.url, timeout=30)
    try:
        _read_back_without(web, sid, secret)
    finally:
        web.close()
        server.stop()


def _read_back_without(web: httpx.Client, sid: str, secret: str) -> None:
    listing = web.get("/sessions")
    assert sid in _session_ids(listing.text)
    page = web.get(session_path(sid))
    logs = web.get(session_path(sid, suffix="/logs"))
    assert page.status_code == logs.status_code == 200
    assert "stored bytes match" in logs.text
    downloads = re.findall(r'<a class="download" href="([^"]*)"', page.text)
    assert downloads
    for body in (listing.text, page.text, logs.text, *(web.get(html.unescape(u)).text for u in downloads)):
        assert secret not in body and "DB_PASSWORD" not in body
