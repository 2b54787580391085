"""The evidence browser's forensic pages and its mount: search by session id, player and log text, paging
both ways, outcomes that are expected versus evidence lost, bad query strings, and serving under a
path prefix (``--web.external-url`` / ``--web.route-prefix``), over real stores and a real server.
"""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest

from archiver.browse.search import SearchRun, parse_search_query
from archiver.browse.urls import Mount, mount, session_path
from archiver.layout.manifest import ManifestItem
from archiver.retrieval import retrieve
from archiver.retrieval.reindex import index_players
from archiver.store import ObjectStore, open_store
from tests import fixtures_retrieval
from tests.support import HOUR, NOW, Browsers, put_capture, put_session, wait_until

# The stores of the retrieval tests (pytest finds fixtures by module name).
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store

PREFIX = "/tools/evidence"
PLANTED = "anticheat: speedhack detected for p-4711"


@pytest.fixture
def serve() -> Iterator[Callable[..., httpx.Client]]:
    """``serve(store, mount=..., page_size=...)``: a started browser and an httpx client for it (no redirects)."""
    browsers = Browsers()
    yield lambda archive, **app_args: browsers.start(archive, clock=lambda: NOW, **app_args)
    browsers.close()


class _Links(HTMLParser):
    """Every href and form action of a page, unescaped, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "action") and value is not None:
                self.found.append(value)


def links(page: str) -> list[str]:
    parser = _Links()
    parser.feed(page)
    return parser.found


def _ids(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<a class="session" href="[^"]*">([^<]*)</a>', page)]


def _link(page: str, element_id: str) -> str | None:
    found = re.search(rf'<a id="{element_id}" href="([^"]*)"', page)
    return html.unescape(found.group(1)) if found else None


def _hits(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<td class="line"><span class="[^"]*">(.*?)</span></td>', page)]


# --- the mount ------------------------------------------------------------------------------------


def test_the_route_prefix_is_the_external_urls_path_unless_given() -> None:
    assert mount() == Mount("", "")
    assert mount("https://tools.example.com/evidence/") == Mount("/evidence", "/evidence")
    assert mount("https://tools.example.com") == Mount("", "")
    assert mount("http://tools.example.com:8080//a//b") == Mount("/a/b", "/a/b")
    # A proxy that strips the public path: served at the root, links keep the public path.
    assert mount("https://tools.example.com/evidence", "/") == Mount("", "/evidence")
    assert mount(None, "evidence/") == Mount("/evidence", "/evidence")


@pytest.mark.parametrize(
    ("external", "prefix", "named"),
    [
        ("tools.example.com/evidence", None, "--web.external-url"),
        ("/evidence", None, "--web.external-url"),
        ("ftp://tools.example.com/", None, "--web.external-url"),
        ("https://tools.example.com/a?b=c", None, "--web.external-url"),
        ("https://tools.example.com/a/../b", None, "--web.external-url"),
        (None, "/a b", "--web.route-prefix"),
        (None, "/a/./b", "--web.route-prefix"),
    ],
)
def test_a_bad_external_url_or_route_prefix_is_refused_naming_the_flag(
    external: str | None, prefix: str | None, named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        mount(external, prefix)


def _absent(path: str) -> ManifestItem:
    """An artifact path the container did not have (the upstream's 404 inside the window)."""
    return ManifestItem(kind="artifact", source=f"GET /artifacts?path={path}", outcome="source_gone", path=path)


def _seed_forensics(archive: ObjectStore) -> None:
    """Sessions for every page: players, planted lines in text and NDJSON logs, an absent optional path."""
    for i in range(6):
        players = ("p-4711", "p-2") if i % 2 == 0 else ("p-3",)
        lines = b"".join(b"tick %d\n" % n for n in range(1, 1234)) + PLANTED.encode() + b"\nmatch over\n"
        put_session(
            archive, f"match-{i}", ended_at=NOW - 600 - i * 900, players=players, logs=lines if i == 2 else None
        )
    crash = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/crash", outcome="source_gone", path="/srv/crash"
    )
    put_session(
        archive,
        "ndjson-1",
        ended_at=NOW - 300,
        log_ext="jsonl",
        logs=b'{"stream": "stdout", "line": "boot"}\n\n{"stream": "stderr", "line": "' + PLANTED.encode() + b'"}\n',
        artifacts={"/srv/replays/match.replay": b"R" * 4096},
        extra_items=[crash],
        players=("p-4711",),
    )
    index_players(archive)


# --- under a path prefix --------------------------------------------------------------------------


def test_under_a_path_prefix_every_link_form_redirect_and_download_stays_under_it(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    """Each href and form action of every page (list, session, logs, search) starts with the prefix and answers."""
    _seed_forensics(file_store)
    client = serve(file_store, mount=mount("https://tools.example.com" + PREFIX), page_size=3)
    assert client.get("/").headers["location"] == PREFIX + "/sessions"
    assert client.get(PREFIX).headers["location"] == PREFIX + "/sessions"
    assert client.get("/sessions").status_code == 404  # outside the route prefix
    for probe in ("/healthz", "/-/healthy", "/-/ready"):
        assert client.get(PREFIX + probe).text == "ok\n"
    pages = [
        PREFIX + "/sessions",
        PREFIX + "/sessions/ndjson-1",
        PREFIX + "/sessions/ndjson-1/logs",
        PREFIX + "/search?q=speedhack&since=2d",
    ]
    seen: set[str] = set()
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        for link in links(response.text):
            assert link.startswith(PREFIX + "/") or link.startswith("#L"), (page, link)
            target = link.split("#")[0]
            if target and target not in seen:
                seen.add(target)
                answer = client.head(target) if "/items/" in target else client.get(target)
                assert answer.status_code == 200, (page, link)
    assert any("/items/" in link for link in seen) and any("before=" in link for link in seen)


def test_behind_a_proxy_that_strips_the_prefix_pages_answer_at_the_root_with_public_links(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    put_session(file_store, "stripped", ended_at=NOW - 60)
    client = serve(file_store, mount=mount("https://tools.example.com/evidence", "/"))
    page = client.get("/sessions")
    assert page.status_code == 200
    assert "/evidence" + session_path("stripped") in links(page.text)
    assert client.get("/").headers["location"] == "/evidence/sessions"


# --- finding sessions -----------------------------------------------------------------------------


def test_the_session_box_opens_an_exact_id_and_lists_the_ids_containing_other_text(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    for sid in ("eu-match-001", "eu-match-002", "us-match-001", "a/b <b>x</b>"):
        put_session(file_store, sid, ended_at=NOW - 60)
    client = serve(file_store, mount=mount(None, PREFIX))
    exact = client.get(PREFIX + "/sessions", params={"session": "a/b <b>x</b>"})
    assert exact.status_code == 302 and exact.headers["location"] == PREFIX + session_path("a/b <b>x</b>")
    assert client.get(exact.headers["location"]).status_code == 200
    assert _ids(client.get(PREFIX + "/sessions", params={"session": "MATCH-001"}).text) == [
        "eu-match-001",
        "us-match-001",
    ]
    hostile = client.get(PREFIX + "/sessions", params={"session": "<script>x"})
    assert hostile.status_code == 200 and "<script>x" not in hostile.text and "&lt;script&gt;x" in hostile.text
    assert _ids(hostile.text) == []


def test_a_players_matches_are_listed_from_the_player_index_and_linked_from_each_session(
    store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    _seed_forensics(store)
    client = serve(store)
    page = client.get("/sessions", params={"player": "p-4711", "since": "1d"})
    assert _ids(page.text) == ["ndjson-1", "match-0", "match-2", "match-4"]
    assert _ids(client.get("/sessions", params={"player": "p-4711", "session": "match-"}).text) == [
        "match-0",
        "match-2",
        "match-4",
    ]
    assert _ids(client.get("/sessions", params={"player": "nobody"}).text) == []
    session = client.get("/sessions/match-0").text
    player_link = next(link for link in links(session) if "player=p-4711" in link)
    assert _ids(client.get(player_link).text) == ["ndjson-1", "match-0", "match-2", "match-4"]


@pytest.mark.parametrize("player", [None, "p-4711"])
def test_the_list_pages_older_then_newer_back_to_the_very_same_pages(
    file_store: ObjectStore, serve: Callable[..., httpx.Client], player: str | None
) -> None:
    """Older pages to the end, then newer pages back: each page seen twice is the same, ties included."""
    ends = {f"s-{i:02d}": NOW - 60 - i * 2500 for i in range(14)}
    ends["s-tie"] = ends["s-03"]
    for sid, ended_at in ends.items():
        put_session(file_store, sid, ended_at=ended_at, players=("p-4711",))
    index_players(file_store)
    client = serve(file_store, page_size=4)
    params = {"since": "2d"} | ({"player": player} if player else {})
    first = client.get("/sessions", params=params).text
    assert _link(first, "newer") is None and _link(first, "newest") is None
    forward = [_ids(first)]
    page = first
    while (older := _link(page, "older")) is not None:
        page = client.get(older).text
        forward.append(_ids(page))
    assert [sid for ids in forward for sid in ids] == sorted(ends, key=lambda s: (-ends[s], s))
    backward = [_ids(page)]
    while (newer := _link(page, "newer")) is not None:
        page = client.get(newer).text
        backward.append(_ids(page))
    assert backward == forward[::-1]
    assert _link(page, "newest") is not None


def test_an_absent_optional_artifact_reads_as_expected_and_lost_evidence_as_a_problem(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    """source_gone of an artifact path: "not present in this container", never red; expired: red."""
    absent = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/crash", outcome="source_gone", path="/srv/crash"
    )
    lost = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/replays", outcome="expired", path="/srv/replays", error="404"
    )
    put_session(file_store, "no-crash", ended_at=NOW - 60, extra_items=[absent])
    put_session(file_store, "too-late", ended_at=NOW - 120, extra_items=[lost])
    client = serve(file_store)
    cells = dict(re.findall(r'>([a-z-]+)</a></td>.*?<td class="nw items([^"]*)">', client.get("/sessions").text, re.S))
    assert cells == {"no-crash": " absent", "too-late": " bad"}
    listing = client.get("/sessions").text
    assert "1 not present" in listing and "1 expired" in listing
    page = client.get("/sessions/no-crash").text
    assert '<td class="outcome absent">not present in this container (source_gone)' in page
    assert 'class="outcome bad"' not in page
    assert '<td class="outcome bad">expired: 404</td>' in client.get("/sessions/too-late").text


# --- searching logs -------------------------------------------------------------------------------


def test_a_log_search_links_each_hit_to_its_line_on_the_right_log_page(
    store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    """Text logs (line 1234, on the third page of 500) and NDJSON with a blank keep-alive line (entry 2)."""
    _seed_forensics(store)
    client = serve(store, mount=mount(None, PREFIX))
    page = client.get(PREFIX + "/search", params={"q": "speedhack detected", "since": "1d"})
    assert page.status_code == 200
    assert _hits(page.text) == [PLANTED, PLANTED]
    line_links = [link for link in links(page.text) if "#L" in link]
    assert line_links == [
        PREFIX + "/sessions/ndjson-1/logs?instance=legacy#L2",
        PREFIX + "/sessions/match-2/logs?instance=legacy&start=1000#L1234",
    ]
    for link in line_links:
        target, anchor = link.split("#")
        log_page = client.get(target).text
        assert re.search(
            rf'id="{anchor}" href="#{anchor}">\s*\d+</a> <span class="[a-z]*">{re.escape(PLANTED)}</span>', log_page
        )
    assert '<p id="search-status" class="ok">Done: searched 7 sessions' in page.text and "2 hits" in page.text
    assert page.text.index('id="searching"') < page.text.index('class="hit"') < page.text.index('id="search-status"')


def test_a_log_search_finds_lines_of_each_live_capture_and_links_them_to_that_captures_view(
    store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    """An archive keeping two live captures beside its logs: hits from the logs, then each capture,
    each labelled and linked to its own log view (``capture=N``) at its line; the session page's
    "view" links are those same views."""
    instance = "20261122T120000.000Z"
    ticks = [("stdout", f"tick {n}") for n in range(1, 1100)]
    live_only = "anticheat: speedhack detected, seen live only"
    captures = [
        put_capture(store, "kept", _ndjson([ticks[0], ("stderr", PLANTED), *ticks[1:], ("stderr", live_only)]),
                    instance=instance),
        put_capture(store, "kept", _ndjson([("stdout", "speedhack detected before the rotation")]), segment=1,
                    instance=instance, capture="diverged"),
    ]  # fmt: skip
    logs = b"".join(b"tick %d\n" % n for n in range(1, 601)) + PLANTED.encode() + b"\n"
    put_session(store, "kept", ended_at=NOW - 300, logs=logs, instance=instance, extra_items=captures)
    client = serve(store, mount=mount(None, PREFIX))
    page = client.get(PREFIX + "/search", params={"q": "speedhack detected", "since": "1d"})
    assert page.status_code == 200 and "4 hits" in page.text
    assert _hits(page.text) == [PLANTED, PLANTED, live_only, "speedhack detected before the rotation"]
    sources = re.findall(r'<small class="source">([^<]*)</small>', page.text)
    assert sources == ["logs", "capture", "capture", "capture-2"]
    logs = f"{PREFIX}/sessions/kept/logs?instance={instance}"
    line_links = [link for link in links(page.text) if "#L" in link]
    assert line_links == [
        f"{logs}&start=500#L601",
        f"{logs}&capture=1#L2",
        f"{logs}&capture=1&start=1000#L1101",
        f"{logs}&capture=2#L1",
    ]
    for link, text in zip(line_links, _hits(page.text), strict=True):
        target, anchor = link.split("#")
        log_page = client.get(target).text
        assert re.search(
            rf'id="{anchor}" href="#{anchor}">\s*\d+</a> <span class="[a-z]*">{re.escape(text)}</span>', log_page
        )
        assert ('id="capture"' in log_page) == ("capture=" in link)
    session_page = client.get(f"{PREFIX}/sessions/kept", params={"instance": instance}).text
    views = [link for link in links(session_page) if "/logs" in link]
    assert views == [logs, f"{logs}&capture=1", f"{logs}&capture=2"]


def _ndjson(lines: list[tuple[str, str]]) -> bytes:
    return b"".join(json.dumps({"streamType": stream, "line": text}).encode() + b"\n" for stream, text in lines)


def test_a_log_search_stops_at_its_limit_and_pages_both_ways_over_the_hits_of_archiver_grep(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    for i in range(4):
        logs = b"".join(b"round %d of s%d: %s\n" % (n, i, b"FOUL" if n % 2 else b"ok") for n in range(1, 6))
        put_session(file_store, f"s{i}", ended_at=NOW - 60 - i * 600, logs=logs)
    out = io.StringIO()
    entries = retrieve.list_sessions(file_store, since=NOW - 2 * HOUR, now=NOW)
    retrieve.grep_sessions(file_store, entries, retrieve.Matcher("foul", ignore_case=True), out)
    expected = [line.split("  ", 2)[2] for line in out.getvalue().splitlines()]
    assert len(expected) == 12
    client = serve(file_store)
    url: str | None = "/search?" + str(httpx.QueryParams({"q": "foul", "icase": "1", "since": "2h", "limit": "5"}))
    shown: list[str] = []
    pages = []
    while url is not None:
        page = client.get(url).text
        pages.append(page)
        shown += _hits(page)
        url = _link(page, "next")
    assert shown == expected and len(pages) == 3
    assert "the limit of 5 hits per page was reached and more follow" in pages[0]
    assert "Hits 6 to 10 shown" in pages[1] and "Done: searched 4 sessions" in pages[2] and "12 hits" in pages[2]
    back = _link(pages[2], "prev")
    assert back is not None and _hits(client.get(back).text) == expected[5:10]
    assert _link(pages[0], "prev") is None


class _GatedStore:
    """A real store whose log reads wait until ``opened`` is set, except those of the ``free`` session ids."""

    def __init__(self, inner: ObjectStore, free: tuple[str, ...] = ()) -> None:
        self._inner = inner
        self._free = free
        self.opened = threading.Event()
        self.log_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        if "/logs." in key:
            self.log_reads += 1
            if not any(f"/{sid}/logs." in key for sid in self._free):
                assert self.opened.wait(30), "the test never opened the gate"
        return self._inner.iter_bytes(key)


def test_a_log_search_streams_searching_first_then_hits_then_its_status(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    """While the logs cannot be read yet, the page already shows "Searching…"; hits and the status follow."""
    put_session(file_store, "slow", ended_at=NOW - 60, logs=PLANTED.encode() + b"\n")
    gated = _GatedStore(file_store)
    client = serve(cast(ObjectStore, gated))
    with client.stream("GET", "/search", params={"q": "speedhack"}) as response:
        assert response.status_code == 200 and "content-length" not in response.headers
        received = ""
        chunks = response.iter_text()
        while "</thead>" not in received:
            received += next(chunks)
        assert 'id="searching"' in received and 'id="search-status"' not in received and PLANTED not in received
        gated.opened.set()
        received += "".join(chunks)
    assert _hits(received) == [PLANTED] and 'id="search-status" class="ok"' in received
    assert received.rstrip().endswith("</html>")


def test_searches_beyond_the_running_limit_get_a_503_until_a_slot_is_free(
    file_store: ObjectStore, serve: Callable[..., httpx.Client]
) -> None:
    put_session(file_store, "slow", ended_at=NOW - 60, logs=PLANTED.encode() + b"\n")
    gated = _GatedStore(file_store)
    client = serve(cast(ObjectStore, gated), max_searches=1)
    assert client.head("/search", params={"q": "x"}).status_code == 200  # a HEAD gives its slot back
    with client.stream("GET", "/search", params={"q": "speedhack"}) as running:
        chunks = running.iter_bytes()
        first = next(chunks)
        busy = client.get("/search", params={"q": "other"})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "10" and "try again" in busy.text
        assert client.get("/sessions").status_code == 200  # pages other than the search still serve
        gated.opened.set()
        assert 'id="search-status" class="ok"' in (first + b"".join(chunks)).decode()
    # The slot is given back as the server finishes the response, a moment after the client read its end.
    again = wait_until(
        lambda: (r := client.get("/search", params={"q": "speedhack"})).status_code != 503 and r,
        message="the search slot is free again",
    )
    assert _hits(again.text) == [PLANTED]


def test_a_search_whose_reader_left_stops_searching(file_store: ObjectStore) -> None:
    """Closing the page's hit stream stops the search at the next session: the rest are never read."""
    for i in range(30):
        put_session(file_store, f"m{i:02d}", ended_at=NOW - 60 - i * 60, logs=b"FOUL\n")
    gated = _GatedStore(file_store, free=("m00",))
    query = parse_search_query({"q": ["FOUL"], "since": ["2h"]}, NOW)
    assert query is not None
    run = SearchRun(cast(ObjectStore, gated), query, now=NOW, workers=1)
    batches = run.batches()
    assert next(batches)[0].session_id == "m00"
    batches.close()
    gated.opened.set()
    wait_until(
        lambda: not any(t.name == "browse-search" for t in threading.enumerate()), message="the search thread ended"
    )
    assert gated.log_reads < 30


# --- bad query strings ----------------------------------------------------------------------------

#: Past the longest value a field takes (the longest session id, inputs.MAX_ID_BYTES).
LONG = "x" * 5000


@pytest.mark.parametrize(
    ("path", "params", "says"),
    [
        ("/sessions", {"since": "yesterday-ish"}, "not a time"),
        ("/sessions", {"since": "2026-13-45T99:00"}, "ISO 8601"),
        ("/sessions", {"since": "1h", "until": "2h"}, "is after"),
        ("/sessions", {"before": "nan"}, "before: not a time"),
        ("/sessions", {"after": "1e999"}, "after: not a time"),
        ("/sessions", {"before": "1", "after": "2"}, "not both"),
        ("/sessions", {"session": LONG}, "session: too long"),
        ("/sessions", {"label": [f"k{i}=v" for i in range(25)]}, "label: at most"),
        ("/sessions/s1/logs", {"start": "ten"}, "start: not a whole number"),
        ("/sessions/s1/logs", {"start": "-5"}, "start: not a whole number"),
        ("/sessions/s1/logs", {"start": "99999999999"}, "start: out of range"),
        ("/sessions/s1/logs", {"start": "500"}, "start: past the end (these logs have 2 lines)"),
        ("/sessions/s1/logs", {"stream": "stdin"}, "stream: must be"),
        ("/sessions/s1", {"instance": LONG}, "instance: too long"),
        ("/search", {"q": "(unclosed"}, "not a valid regular expression"),
        ("/search", {"q": "x" * 1001}, "q: too long"),
        ("/search", {"q": "x", "limit": "0"}, "limit: out of range"),
        ("/search", {"q": "x", "limit": "5000"}, "limit: out of range"),
        ("/search", {"q": "x", "start": "1.5"}, "start: not a whole number"),
        ("/search", {"q": "x", "until": "not-a-date"}, "not a time"),
        ("/sessions/" + LONG, {}, "too long"),
    ],
)
def test_a_bad_query_string_gets_a_400_page_saying_which_field(
    file_store: ObjectStore, serve: Callable[..., httpx.Client], path: str, params: dict[str, Any], says: str
) -> None:
    put_session(file_store, "s1", ended_at=NOW - 60)
    response = serve(file_store).get(path, params=params)
    assert response.status_code == 400, response.text[:300]
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert says in html.unescape(response.text) and "Traceback" not in response.text


# --- the command ----------------------------------------------------------------------------------


def _browse(root: Path, *flags: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`archiver browse` started with ``flags``: the process, the URL it printed, and the lines before it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "archiver.cli", "browse", "--store", root.as_uri(), *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    before: list[str] = []
    while (line := proc.stderr.readline()) and "evidence browser:" not in line:
        before.append(line)
    url = re.search(r"(http://\S+/sessions)", line)
    assert url, (before, line)
    return proc, url.group(1), before


def test_archiver_browse_serves_under_the_path_of_its_external_url(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    put_session(open_store(root.as_uri()), "cli-session", ended_at=time.time() - 60)
    proc, url, before = _browse(
        root, "--web.listen-address", "127.0.0.1:0", "--web.external-url", "https://tools.example.com/evidence/"
    )
    try:
        assert before == []
        assert urlsplit(url).path == "/evidence/sessions"
        page = httpx.get(url, timeout=10).text
        assert "cli-session" in page and '<a class="session" href="/evidence/sessions/cli-session">' in page
        assert httpx.get(url.replace("/sessions", "/healthz"), timeout=10).text == "ok\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_former_browse_flags_still_work_with_one_deprecation_line_each(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    web = tmp_path / "web.yml"
    web.write_text("")
    proc, url, before = _browse(root, "--listen", "127.0.0.1:0", "--web-config-file", str(web))
    try:
        assert httpx.get(url, timeout=10).status_code == 200
        deprecations = [line for line in before if "deprecated" in line]
        assert len(deprecations) == 2, before
        assert "--listen is deprecated" in deprecations[0] and "use --web.listen-address instead" in deprecations[0]
        assert "use --web.config.file instead" in deprecations[1]
        assert all(" level=warn logger=archiver.config.settings " in line for line in deprecations)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
