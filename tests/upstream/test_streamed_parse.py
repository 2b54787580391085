"""The streamed session-list parse (`SessionListParser.parse_stream`): the same result as the whole-body
parse whatever the chunking and window size, cuts proved by msgspec (never inside a string or a nested
object), odd bodies handed back to the whole-body path, and the client fetching a body again only when
a window was already dropped."""

from __future__ import annotations

import gzip
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.config.credentials import Token
from archiver.config.sharding import Shard
from archiver.errors import ApiTransportError
from archiver.retry import RetryPolicy
from archiver.upstream.api import SessionHostClient
from archiver.upstream.listparser import SessionListParser, WholeBodyNeeded
from archiver.upstream.models import Session
from archiver.upstream.transport import DIRECT_MIN_BYTES
from tests.fixtures_http import TLSFiles
from tests.support import QUIRKS, SECRET, body, entry


def chunked(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]


def both(raw: bytes, *, size: int, window: int, owns: Any = None) -> tuple[object, object]:
    """(whole-body parse, streamed parse) of `raw`, each by a fresh parser."""
    whole = SessionListParser(owns=owns).parse(raw)
    streamed = SessionListParser(owns=owns).parse_stream(chunked(raw, size), window=window)
    return whole, streamed


#: Entries whose strings and nested objects hold the very bytes a cut looks for (`}, {`).
TRAPS = [
    entry("brace-in-string", labels={"tags": json.dumps({"mode": "}, {", "x": '}, {"id": 1}'})}),
    entry("nested-array", somethingNew=[{"a": 1}, {"b": 2}, {"c": [{"d": 3}, {"e": 4}]}]),
    entry("nested-object", port={"port": {"7777/udp": 1}}, extra={"k": {"l": {}}}),
    entry("escaped-quote", image='demo"}, {"game'),
]


@pytest.mark.parametrize("size", [1, 7, 64, 4096])
@pytest.mark.parametrize("window", [1, 50, 700, 1 << 20])
def test_any_chunking_and_window_give_the_whole_body_result(size: int, window: int) -> None:
    entries = [entry(f"s{i}", playerCount=i) for i in range(6)] + TRAPS + [entry("s1")]  # s1 twice
    entries += [entry(f"q{i}", **overrides) for i, overrides in enumerate(QUIRKS.values())]
    entries.append(entry("bad", created="soon"))  # left out, with its index, either way
    whole, streamed = both(body(*entries), size=size, window=window)
    assert streamed == whole
    assert len(whole.sessions) == len(entries) - 1 and len(whole.invalid) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("window", [1, 300, 1 << 20])
def test_a_shard_streams_the_same_owned_sessions_with_the_same_indices(window: int) -> None:
    entries = [entry(f"s{i}") for i in range(40)] + [entry("", image="x"), {"id": 5}, "not an object"]
    owns = Shard(1, 3).owns
    whole, streamed = both(body(*entries), size=97, window=window, owns=owns)
    assert streamed == whole
    assert 0 < len(whole.sessions) < 40  # type: ignore[attr-defined]


def test_compact_and_indented_json_stream_alike() -> None:
    entries = [entry(f"s{i}") for i in range(5)] + TRAPS
    for raw in (
        json.dumps({"sessions": entries}, separators=(",", ":")).encode(),
        json.dumps({"sessions": entries}, indent=2).encode() + b"\n",
        b'\r\n {  "sessions" :\t[ ]  }\n',
    ):
        whole, streamed = both(raw, size=33, window=200)
        assert streamed == whole


def test_unchanged_entries_come_back_as_the_same_objects_across_streamed_polls() -> None:
    parser = SessionListParser()
    first = parser.parse_stream(chunked(body(entry("a"), entry("b")), 50), window=100).sessions
    second = parser.parse_stream(chunked(body(entry("a"), entry("b", playerCount=7)), 50), window=100).sessions
    assert second[0] is first[0] and second[1] is not first[1] and second[1].player_count == 7


@pytest.mark.parametrize(
    ("raw", "keeps_body"),
    [
        (b"<html>502 Bad Gateway</html>", True),
        (b'{"other": 1, "sessions": []}', True),
        (b'{"sessions": [' + json.dumps(entry("a")).encode() + b', {"id": "n", "created": NaN}]}', False),
        (b'{"sessions": [' + json.dumps(entry("a")).encode() + b'], "next": null}', False),
        (b'{"sessions": [' + json.dumps(entry("a")).encode() + b"]", False),
    ],
    ids=["not json", "sessions not first", "NaN after a window", "a key after the list", "truncated"],
)
def test_an_odd_body_is_handed_to_the_whole_body_path_and_the_parser_state_is_untouched(
    raw: bytes, keeps_body: bool
) -> None:
    parser = SessionListParser()
    [kept] = parser.parse(body(entry("k"))).sessions
    with pytest.raises(WholeBodyNeeded) as info:
        parser.parse_stream(chunked(raw, 16), window=40)
    assert (info.value.body == raw) if keeps_body else info.value.body is None
    assert parser.parse(body(entry("k"))).sessions[0] is kept  # the last good parse's state is in place


def test_no_secret_is_kept_by_a_streamed_parse() -> None:
    parser = SessionListParser()
    parser.parse_stream(chunked(body(*[entry(f"s{i}") for i in range(5)]), 64), window=300)
    state = repr(vars(parser)) + repr(parser._by_digest)
    assert SECRET not in state


class _ListServer(http.server.BaseHTTPRequestHandler):
    """Answers `GET /session` with the queued bodies in turn (the last one repeats). A body in
    `cut` is announced whole but only its first half is sent: then the connection is closed, or
    held open until `release` is set when `stall`."""

    bodies: list[bytes] = []
    served = 0
    cut: set[int] = set()
    stall = False
    release = threading.Event()
    encoding: str | None = None
    #: The client's address of each request (a reused connection repeats its port).
    peers: list[tuple[str, int]] = []
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        cls = type(self)
        cls.peers.append(self.client_address)
        number = min(cls.served, len(cls.bodies) - 1)
        raw = cls.bodies[number]
        cls.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if cls.encoding:
            self.send_header("Content-Encoding", cls.encoding)
        self.end_headers()
        if number not in cls.cut:
            self.wfile.write(raw)
            return
        self.wfile.write(raw[: len(raw) // 2])
        self.wfile.flush()
        if cls.stall:
            cls.release.wait()
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve_lists(tls: ssl.SSLContext | None = None) -> Iterator[type[_ListServer]]:
    attributes = {"bodies": [], "served": 0, "cut": set(), "release": threading.Event(), "peers": []}
    handler = type("Handler", (_ListServer,), attributes)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    handler.url = f"{scheme}://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    yield handler
    handler.release.set()
    server.shutdown()
    thread.join()


@pytest.fixture
def list_server() -> Iterator[type[_ListServer]]:
    yield from _serve_lists()


@pytest.fixture
def tls_list_server(self_signed_cert: TLSFiles) -> Iterator[type[_ListServer]]:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(self_signed_cert.cert, self_signed_cert.key)
    yield from _serve_lists(tls)


def test_the_client_fetches_again_only_when_a_window_was_already_dropped(list_server: type[_ListServer]) -> None:
    big = [entry(f"s{i}") for i in range(3000)]  # ~2 MB: more than one window
    odd_tail = json.dumps({"sessions": big, "next": None}).encode()
    with SessionHostClient.connect(list_server.url, Token("t")) as client:  # type: ignore[attr-defined]
        list_server.bodies = [odd_tail]
        assert [s.id for s in client.list_sessions().sessions] == [e["id"] for e in big]
        assert list_server.served == 2  # streamed, then fetched again and parsed whole
        list_server.bodies, list_server.served = [b'{"other": 1, "sessions": []}'], 0
        assert client.list_sessions().sessions == []
        assert list_server.served == 1  # odd from its first bytes: parsed whole from what was read


def test_duplicates_in_different_windows_share_one_object() -> None:
    raw = body(entry("dup"), *[entry(f"s{i}") for i in range(8)], entry("dup"))
    listed = SessionListParser().parse_stream(chunked(raw, 64), window=300).sessions
    assert listed[0] is listed[-1]


# --- the delta handed to the renderer ---------------------------------------------------------------

_poll_entries = st.lists(
    st.tuples(
        st.integers(0, 9),  # ids from a small pool: sessions end, come back, repeat within a body
        st.integers(0, 2),  # player count: a changed entry
        st.booleans(),  # a bad entry (left out, never remembered)
    ),
    max_size=12,
)


def _poll_body(entries: list[tuple[int, int, bool]]) -> bytes:
    return body(*(entry(f"s{n}", playerCount=players, image=None if bad else "g") for n, players, bad in entries))


def _broken_after(head: bytes) -> Iterator[bytes]:
    yield head
    raise OSError("connection reset mid-body")


@settings(max_examples=50, deadline=None)
@given(polls=st.lists(st.tuples(_poll_entries, st.sampled_from(["whole", "stream", "fails"])), min_size=1, max_size=6))
def test_the_delta_is_exactly_the_identity_difference_between_consecutive_good_lists(
    polls: list[tuple[list[tuple[int, int, bool]], str]],
) -> None:
    """`added` is every object of the new list that the previous good list did not hold (in list
    order), `removed` every object of the previous good list that the new one does not hold; a parse
    that fails in between (its stream breaks) changes neither the state nor the next delta's base."""
    parser = SessionListParser()
    last: list[Session] | None = None
    for entries, how in polls:
        raw = _poll_body(entries)
        if how == "fails":
            with pytest.raises(OSError):
                parser.parse_stream(_broken_after(raw[: len(raw) // 2]), window=64)
            continue
        listed = parser.parse(raw) if how == "whole" else parser.parse_stream(chunked(raw, 16), window=64)
        delta = listed.delta
        assert delta is not None
        assert (delta.base is last if last is not None else delta.base == []) and delta.current is listed.sessions
        before, now = set(map(id, delta.base)), set(map(id, listed.sessions))
        expected_added = list({id(s): s for s in listed.sessions if id(s) not in before}.values())
        assert [id(s) for s in delta.added] == [id(s) for s in expected_added]
        assert sorted(map(id, delta.removed)) == sorted({id(s) for s in delta.base if id(s) not in now})
        last = listed.sessions


def test_a_list_parsed_the_pure_way_has_no_delta_and_the_next_one_is_relative_to_the_last_good_one() -> None:
    parser = SessionListParser()
    first = parser.parse(body(entry("a"), entry("b")))
    odd = parser.parse(body(entry("c"))[:-2] + b', {"id": "n", "created": NaN}]}')  # only Python's json reads NaN
    assert odd.delta is None
    third = parser.parse(body(entry("a"), entry("c")))
    assert third.delta is not None and third.delta.base is first.sessions
    assert [s.id for s in third.delta.added] == ["c"] and [s.id for s in third.delta.removed] == ["b"]


_BIG = [entry(f"s{i}") for i in range(3000)]  # ~2 MB: read past httpx's parser (DIRECT_MIN_BYTES)
_ONCE = RetryPolicy(attempts=1, attempt_timeout=0.5)


def test_a_large_list_read_past_httpx_parses_whole_and_each_poll_gets_its_body(list_server: type[_ListServer]) -> None:
    """The body comes whole and exact over a fresh connection each poll (the last one is not reused
    after a direct read), unchanged entries still come back as the same objects."""
    changed = [*_BIG[:-1], entry("s2999", playerCount=9)]
    raws = [body(*_BIG), body(*changed)]
    assert len(raws[0]) > DIRECT_MIN_BYTES
    list_server.bodies = raws
    parser = SessionListParser()
    with SessionHostClient.connect(list_server.url, Token("t")) as client:  # type: ignore[attr-defined]
        first = client.list_sessions(parser=parser).sessions
        second = client.list_sessions(parser=parser).sessions
    assert first == SessionListParser().parse(raws[0]).sessions
    assert second == SessionListParser().parse(raws[1]).sessions
    assert all(a is b for a, b in zip(first[:-1], second[:-1], strict=True)) and second[-1].player_count == 9
    assert len(set(list_server.peers)) == 2  # read directly: the connection was not reused


def test_a_large_list_over_tls_is_read_past_httpx_decrypted_and_whole(
    tls_list_server: type[_ListServer], self_signed_cert: TLSFiles
) -> None:
    tls_list_server.bodies = [body(*_BIG)]
    transport = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(self_signed_cert.cert)))
    with SessionHostClient.connect(tls_list_server.url, Token("t"), transport=transport) as client:  # type: ignore[attr-defined]
        for _ in range(2):
            assert [s.id for s in client.list_sessions().sessions] == [e["id"] for e in _BIG]
    assert len(set(tls_list_server.peers)) == 2  # read directly: the connection was not reused


def test_a_small_list_keeps_its_connection(list_server: type[_ListServer]) -> None:
    list_server.bodies = [body(*_BIG[:10])]
    with SessionHostClient.connect(list_server.url, Token("t")) as client:  # type: ignore[attr-defined]
        for _ in range(2):
            assert len(client.list_sessions().sessions) == 10
    assert len(list_server.peers) == 2 and len(set(list_server.peers)) == 1


def test_a_large_gzipped_list_takes_httpxs_path_and_parses_alike(list_server: type[_ListServer]) -> None:
    list_server.bodies, list_server.encoding = [gzip.compress(body(*_BIG) + b" " * DIRECT_MIN_BYTES)], "gzip"
    with SessionHostClient.connect(list_server.url, Token("t")) as client:  # type: ignore[attr-defined]
        assert [s.id for s in client.list_sessions().sessions] == [e["id"] for e in _BIG]


def test_a_large_list_cut_short_is_a_transport_error_and_the_next_attempt_reads_it_whole(
    list_server: type[_ListServer],
) -> None:
    list_server.bodies, list_server.cut = [body(*_BIG), body(*_BIG)], {0}
    with SessionHostClient.connect(list_server.url, Token("t")) as client:  # type: ignore[attr-defined]
        with pytest.raises(ApiTransportError, match="GET /session broke mid-body"):
            client.list_sessions(policy=_ONCE)
        assert [s.id for s in client.list_sessions(policy=_ONCE).sessions] == [e["id"] for e in _BIG]


def test_a_large_list_that_stalls_mid_body_fails_with_the_read_timeout(list_server: type[_ListServer]) -> None:
    list_server.bodies, list_server.cut, list_server.stall = [body(*_BIG)], {0}, True
    client = SessionHostClient.connect(list_server.url, Token("t"))  # type: ignore[attr-defined]
    with client, pytest.raises(ApiTransportError, match="broke mid-body: ReadTimeout"):
        client.list_sessions(policy=_ONCE)
