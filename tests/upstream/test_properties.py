"""Property tests (hypothesis): whatever JSON the upstream sends, parsing yields models, quarantined
entries or a typed error, never another exception; what it yields passes the edge's range checks;
and the scrape rendered from it stays valid for `promtool check metrics`."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import re
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archiver.config.credentials import Token
from archiver.errors import PayloadError, upstream_excerpt
from archiver.exporter.exposition import SnapshotRenderer
from archiver.exporter.poller import Poller
from archiver.upstream.api import SessionHostClient
from archiver.upstream.listparser import SessionListParser
from archiver.upstream.models import (
    CREATED_MAX_MS,
    CREATED_MIN_MS,
    INT64_MAX,
    INT64_MIN,
    Session,
    SessionList,
    parse_ended,
)
from archiver.upstream.sessionlist import parse_session_list, scan_ended
from tests.support import JSON, entries


def _check_session(s: Session) -> None:
    assert s.id
    for text in (s.id, s.image, s.tag, s.location, s.host, *s.labels, *s.labels.values()):
        text.encode("utf-8")  # strict: no lone surrogate got through
    assert CREATED_MIN_MS <= s.created_ms <= CREATED_MAX_MS and math.isfinite(s.created_ms)
    assert s.player_count is None or INT64_MIN <= s.player_count <= INT64_MAX


def _check_result(result: SessionList, count: int) -> None:
    for s in result.sessions:
        _check_session(s)
    assert len(result.sessions) + len(result.invalid) == count
    for bad in result.invalid:
        assert "hunter2" not in bad.reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(entries(), max_size=6))
def test_any_list_body_parses_into_models_or_quarantined_entries(items: list[Any]) -> None:
    """The incremental parser and the pure one agree, and neither raises anything but PayloadError."""
    body = json.dumps({"sessions": items}).encode()
    pure = parse_session_list({"sessions": items})
    _check_result(pure, len(items))
    parser = SessionListParser()
    for _ in range(2):  # a second parse reuses the models of unchanged entries
        incremental = parser.parse(body)
        _check_result(incremental, len(items))
        assert [s.id for s in incremental.sessions] == [s.id for s in pure.sessions]
        assert [i.index for i in incremental.invalid] == [i.index for i in pure.invalid]
    ended = [parse_ended(e) for e in scan_ended(body)]
    for item in ended:
        if isinstance(item, Session):
            _check_session(item)
            assert item.terminal


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_json_envelope_is_a_list_or_a_payload_error(payload: Any) -> None:
    body = json.dumps(payload).encode()
    for parse in (SessionListParser().parse, scan_ended):
        with contextlib.suppress(PayloadError):  # the one exception a body may cause
            parse(body)


#: The metric name at the start of a HELP, TYPE or sample line of the text format.
_METRIC_NAME = re.compile(rb"^(# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)", re.M)


def _renamed(text: bytes, fleet: int) -> bytes:
    """The scrape with every family renamed `f{fleet}_...`: many fleets' scrapes concatenate into one
    valid text (no family twice), so one promtool run checks them all."""
    return _METRIC_NAME.sub(lambda m: (m.group(1) or b"") + b"f%d_" % fleet + m.group(2), text)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.lists(entries(), min_size=1, max_size=8), min_size=1, max_size=25))
def test_the_scrape_of_any_parsed_list_passes_promtool(promtool: str, fleets: list[list[Any]]) -> None:
    """Up to 25 generated fleets per promtool run (each fleet's families renamed apart), few runs."""
    renderer = SnapshotRenderer(max_sessions=5, label_allowlist=("mode",))
    texts = []
    for number, items in enumerate(fleets):
        sessions = SessionListParser().parse(json.dumps({"sessions": items}).encode()).sessions
        texts.append(_renamed(renderer.render(sessions, [], now=1_800_000_000.0).text, number))
    combined = b"".join(texts)
    assert combined.count(b"# TYPE ") == len(fleets) * texts[0].count(b"# TYPE ")  # every family, every fleet
    checked = subprocess.run([promtool, "check", "metrics"], input=combined, capture_output=True, timeout=60)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()


# --- upstream excerpts: secret-free by construction -----------------------------------------------

PLANTED = "pl4nted-s3cret-value"


def _escape_all(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    """A JSON-ish body with the planted secret in a string somewhere: under `labels.env` with key
    names escaped or not, the value escaped or not, with junk before it, truncated anywhere."""
    key = draw(st.sampled_from(["labels", _escape_all("labels"), "\\u006cabels", "x"]))
    env = draw(st.sampled_from(["env", _escape_all("env"), "e"]))
    value = draw(st.sampled_from([PLANTED, _escape_all(PLANTED), PLANTED.replace("-", "\\u002d")]))
    filler = draw(st.text(st.characters(codec="utf-8"), max_size=30))
    core = f'{{"{key}": {{"{env}": {{"K": "{value}"}}}}, "f": {json.dumps(filler)}}}'
    prefix = draw(st.sampled_from(["", '"', "'", "{", "[", " \n", "<html>", "]]}", '{"sessions": [']))
    body = (prefix + core).encode("utf-8", "surrogatepass")
    cut = draw(st.integers(0, len(body)))
    return body[: max(cut, len(prefix.encode()) + len(core.encode()) // 2)] if draw(st.booleans()) else body


@settings(max_examples=300, deadline=None)
@given(hostile_bodies(), st.sampled_from([80, 200]))
def test_an_upstream_excerpt_never_shows_a_planted_value_however_the_body_hides_it(body: bytes, limit: int) -> None:
    shown = upstream_excerpt(body, limit)
    assert PLANTED not in shown and PLANTED[:5] not in shown
    head = shown.rsplit("…", 1)[0]
    assert not set(head) & set("\"'`:=\\&%")  # nothing from the first quote, value or escape on
    assert len(shown) <= limit + 40 and shown.isprintable()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_an_upstream_excerpt_of_any_bytes_is_one_printable_line_that_states_the_size(body: bytes) -> None:
    shown = upstream_excerpt(body)
    assert shown.isprintable() and "\n" not in shown
    assert shown.endswith(f"({len(body)} bytes)") or len(shown.encode()) <= len(body)


# --- the poll: whatever the upstream sends over a real socket, a result and never an exception -----


class _Canned(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the class's `body` (the session list and /metrics alike)."""

    body = b""
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall between

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def canned_client() -> Iterator[SessionHostClient]:
    """A client of an upstream on 127.0.0.1 that answers every GET with `_Canned.body`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        with SessionHostClient(httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}"), Token("t")) as client:
            yield client
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@st.composite
def upstream_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["list", "list", "envelope", "bytes", "truncated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "envelope":
        return json.dumps(draw(JSON)).encode()
    items = draw(st.lists(entries(), max_size=5))
    body = json.dumps({"sessions": items}).encode()
    return body[: draw(st.integers(1, len(body)))] if kind == "truncated" else body


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(upstream_bodies())
def test_any_body_the_upstream_sends_is_a_poll_result_never_an_exception(
    canned_client: SessionHostClient, body: bytes
) -> None:
    """Parsed sessions (passing the edge's checks), quarantined entries, or an error string per
    endpoint; the env value planted in some entries is in none of them."""
    _Canned.body = body
    # A 200 is never retried: each poll is one request per endpoint, whatever the body.
    result = Poller(canned_client, interval=10.0, on_result=lambda result: None).poll_once()
    if result.sessions is None:
        assert result.errors["sessions"]
    else:
        for s in result.sessions:
            _check_session(s)
        assert all("hunter2" not in bad.reason for bad in result.invalid)
    assert all("hunter2" not in text for text in result.errors.values())
