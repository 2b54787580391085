"""The incremental session-list parser: same models as the pure parser, unchanged entries reused by
identity, changed ones re-parsed, ended ones dropped, a bad entry left out (never failing the whole
list, never remembered), no env values."""

from __future__ import annotations

import http.server
import json
import logging
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from archiver.config.credentials import Token
from archiver.errors import ApiDecodeError, PayloadError
from archiver.exporter.poller import Poller
from archiver.fake import FakeService
from archiver.retry import RetryPolicy
from archiver.upstream.api import SessionHostClient
from archiver.upstream.checks import decode_json
from archiver.upstream.listparser import SessionListParser
from archiver.upstream.models import InvalidEntry, SessionList
from archiver.upstream.sessionlist import parse_session_list
from tests.fixtures_fake import TEST_TOKEN
from tests.support import ENV, QUIRKS, SECRET, body, entry

FAST = RetryPolicy(attempts=2, max_elapsed=2.0, initial_wait=0.0, max_wait=0.0, jitter=0.0)


def pure(raw: bytes) -> SessionList:
    return parse_session_list(decode_json(raw))


@pytest.mark.parametrize("overrides", QUIRKS.values(), ids=QUIRKS.keys())
def test_every_quirk_parses_to_the_same_models_as_the_pure_parser(overrides: dict[str, Any]) -> None:
    raw = body(entry("plain"), entry("quirky", **overrides))
    assert SessionListParser().parse(raw) == pure(raw)


def test_missing_optional_fields_parse_like_the_pure_parser() -> None:
    sparse = {k: v for k, v in entry().items() if k not in ("tag", "status", "playerCount", "labels")}
    raw = body(sparse)
    [session] = SessionListParser().parse(raw).sessions
    assert [session] == pure(raw).sessions
    assert (session.tag, session.status, session.player_count, dict(session.labels)) == ("", "unknown", None, {})


@pytest.mark.parametrize(
    "raw",
    [
        b'{"sessions": [{"id": "n", "image": "i", "location": "l", "created": NaN}]}',  # only Python's json
        b'{"sessions": [{"id": "\\ud800", "image": "i", "location": "l", "created": 1}]}',
        b'\xef\xbb\xbf{"sessions": []}',
        b'{"sessions": [{"id": "big", "image": "i", "location": "l", "created": 1e400}]}',
        b'{"other": 1, "sessions": []}',
    ],
    ids=["NaN", "lone surrogate", "BOM", "huge float", "extra top-level field"],
)
def test_json_that_only_pythons_decoder_accepts_still_parses_like_the_pure_parser(raw: bytes) -> None:
    def outcome(parse: Callable[[bytes], object]) -> str:
        try:
            return repr(parse(raw))  # repr: NaN != NaN
        except PayloadError as exc:  # a non-finite `created` is refused by both
            return f"PayloadError: {exc}"

    assert outcome(SessionListParser().parse) == outcome(pure)


def test_unchanged_entries_come_back_as_the_same_objects_changed_ones_are_new_ended_ones_gone() -> None:
    parser = SessionListParser()
    first = {s.id: s for s in parser.parse(body(entry("kept"), entry("changed"), entry("ended"))).sessions}
    second_list = parser.parse(body(entry("kept"), entry("changed", playerCount=9), entry("new"))).sessions
    second = {s.id: s for s in second_list}

    assert [s.id for s in second_list] == ["kept", "changed", "new"]
    assert second["kept"] is first["kept"]
    assert second["changed"] is not first["changed"]
    assert second["changed"].player_count == 9
    assert "ended" not in second
    assert second_list == pure(body(entry("kept"), entry("changed", playerCount=9), entry("new"))).sessions


def test_an_ended_session_that_comes_back_is_parsed_again_not_resurrected_from_old_state() -> None:
    parser = SessionListParser()
    [original] = parser.parse(body(entry("a"))).sessions
    assert parser.parse(body()) == SessionList([])
    [again] = parser.parse(body(entry("a"))).sessions
    assert again == original and again is not original


def test_a_changed_env_value_is_a_changed_entry_but_yields_an_equal_model() -> None:
    parser = SessionListParser()
    [before] = parser.parse(body(entry("a"))).sessions
    rotated = {**entry("a")["labels"], "env": json.dumps({**ENV, "MATCH_SECRET": "rotated"})}
    [after] = parser.parse(body(entry("a", labels=rotated))).sessions
    assert after == before and after is not before


def test_identical_duplicate_entries_share_one_object() -> None:
    first, second = SessionListParser().parse(body(entry("dup"), entry("dup"))).sessions
    assert first is second


BAD_ENTRIES: dict[str, tuple[Any, str | None, str]] = {
    "no id": (entry("x", id=None), None, r"session list entry 1 has no 'id'"),
    "non-string id": (entry("x", id=7), None, r"session list entry 1 field 'id' is int, expected a string"),
    "empty id": (entry("x", id=""), None, r"session list entry 1 field 'id' is empty"),
    "no image": (entry("x", image=None), "x", r"session list entry 1 'x' has no 'image'"),
    "unparseable created": (entry("x", created="yesterday"), "x", r"session list entry 1 'x' field 'created'"),
    "created in microseconds": (entry("x", created=1_648_472_895_000_000), "x", r"'created' is not an epoch-ms"),
    "negative created": (entry("x", created=-1648472895000), "x", r"'created' is not an epoch-ms"),
    "playerCount 1e30": (entry("x", playerCount=1e30), "x", r"'x' field 'playerCount' is out of the 64-bit"),
    "playerCount '1e25'": (entry("x", playerCount="1e25"), "x", r"field 'playerCount' is out of the 64-bit"),
    "lone surrogate in id": (entry("x\ud800"), "x\ud800", r"session list entry 1 field 'id' is not valid UTF-8"),
    "lone surrogate in image": (entry("x", image="g\udc00"), "x", r"'x' field 'image' is not valid UTF-8"),
    "lone surrogate in a label value": (
        entry("x", labels={"env": json.dumps(ENV), "tags": json.dumps({"mode": "\ud800"})}),
        "x",
        r"field 'labels.tags' holds a key or value that is not valid UTF-8",
    ),
    "not an object": ("garbage", None, r"session list entry 1 is str, expected an object"),
}


@pytest.mark.parametrize(("bad", "session_id", "reason"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_one_bad_entry_is_left_out_with_its_index_and_id_and_every_other_entry_parses(
    bad: Any, session_id: str | None, reason: str
) -> None:
    parser = SessionListParser()
    [good] = parser.parse(body(entry("good"))).sessions
    listed = parser.parse(body(entry("good"), bad, entry("other")))

    assert [s.id for s in listed.sessions] == ["good", "other"]
    assert listed.sessions[0] is good  # the unchanged entry is still reused
    [invalid] = listed.invalid
    assert (invalid.index, invalid.session_id) == (1, session_id)
    assert re.search(reason, invalid.reason), invalid.reason
    assert SECRET not in invalid.reason
    assert listed == pure(body(entry("good"), bad, entry("other")))  # both paths agree


def test_a_bad_entry_is_checked_again_on_every_poll_and_never_remembered() -> None:
    """Invalid entries are not cached: the parser's state holds the current body's good entries only."""
    parser = SessionListParser()
    bad = entry("bad", playerCount=1e30)
    first = parser.parse(body(entry("good"), bad))
    second = parser.parse(body(bad, entry("good")))
    assert [i.index for i in first.invalid] == [1]
    assert [i.index for i in second.invalid] == [0]  # re-parsed, so its index is the new one
    assert len(parser._by_digest) == 1
    assert parser.parse(body(entry("good"))).invalid == ()


def test_a_bad_entry_that_is_fixed_is_parsed_and_kept_on_the_next_poll() -> None:
    parser = SessionListParser()
    assert parser.parse(body(entry("a", created=-1))).sessions == []
    [fixed] = parser.parse(body(entry("a"))).sessions
    assert fixed.id == "a" and fixed.created_ms == 1648472895000


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"<html>502 Bad Gateway</html>", "body is not JSON"),
        (b"[]", "session list is list, expected an object"),
        (b'{"sessions": {}}', "'sessions' is dict, expected an array"),
        (b"{}", "'sessions' is null, expected an array"),
        (b'{"sessions": [1,]}', "body is not JSON"),
    ],
)
def test_a_malformed_body_fails_with_the_pure_parsers_message(raw: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        SessionListParser().parse(raw)


def test_env_values_never_appear_in_returned_models_or_in_the_parsers_state() -> None:
    parser = SessionListParser()
    shapes = [entry(f"s{i}", **overrides) for i, overrides in enumerate(QUIRKS.values())]
    sessions = parser.parse(body(*shapes)).sessions
    assert len(sessions) == len(shapes)
    for session in sessions:
        assert SECRET not in repr(session)
        assert session.env_keys == ()  # list entries do not even decode the env
    # The parser remembers entries by digest, not by their bytes (which hold the env).
    assert SECRET.encode() not in pickle.dumps(parser)


# --- through the client and the poller, over real loopback HTTP ---------------------------------


def test_the_poller_reuses_unchanged_sessions_across_polls(fake_service: FakeService) -> None:
    for sid in ("a", "b", "c"):
        fake_service.add_session(TEST_TOKEN, id=sid, labels={"mode": "duel"}, env={"SECRET": SECRET})
    with SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN), policy=FAST) as client:
        poller = Poller(client, interval=5.0, on_result=lambda result: None)
        first = poller.poll_once().sessions
        assert first is not None
        before = {s.id: s for s in first}
        client.join_players("b", ["p1"])
        fake_service.end_session(TEST_TOKEN, "c")
        second = poller.poll_once().sessions
        assert second is not None
        after = {s.id: s for s in second}

    assert set(after) == {"a", "b"}
    assert after["a"] is before["a"]
    assert after["b"] is not before["b"] and after["b"].player_count == 1
    assert all(SECRET not in repr(s) for s in second)


class _CannedHandler(http.server.BaseHTTPRequestHandler):
    canned = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.canned)))
        self.end_headers()
        self.wfile.write(self.canned)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def canned_upstream() -> Iterator[tuple[str, type[_CannedHandler]]]:
    """An upstream on 127.0.0.1 answering every GET with `handler.canned`."""
    handler = type("Handler", (_CannedHandler,), {})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    # A short poll interval: shutdown() waits for one, once per test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_bad_list_is_a_decode_error_whose_message_carries_no_env_value(
    canned_upstream: tuple[str, type[_CannedHandler]],
) -> None:
    url, handler = canned_upstream
    # A short body puts the env inside the first 200 bytes, where the error's body excerpt looks.
    handler.canned = json.dumps({"sessions": {"id": "s", "labels": {"env": json.dumps(ENV)}}}).encode()
    expected = r"GET /session: session list field 'sessions' is dict, expected an array"
    with (
        SessionHostClient(httpx.Client(base_url=url), Token("t"), policy=FAST) as client,
        pytest.raises(ApiDecodeError, match=expected) as info,
    ):
        client.list_sessions(parser=SessionListParser())
    assert SECRET not in str(info.value)
    # The excerpt stops before the first quote: the structure's first byte, and the body's size.
    assert info.value.excerpt == f"{{… ({len(handler.canned)} bytes)"


def test_a_bad_entry_through_the_client_is_left_out_not_a_decode_error(
    canned_upstream: tuple[str, type[_CannedHandler]],
) -> None:
    url, handler = canned_upstream
    handler.canned = body(entry("good"), {"id": "s", "labels": {"env": json.dumps(ENV)}, "image": None})
    with SessionHostClient(httpx.Client(base_url=url), Token("t"), policy=FAST) as client:
        listed = client.list_sessions(parser=SessionListParser())
    assert [s.id for s in listed.sessions] == ["good"]
    assert listed.invalid == (InvalidEntry(1, "s", "session list entry 1 's' has no 'image'"),)


def test_a_lone_surrogate_entry_does_not_cost_the_other_entries_their_reuse() -> None:
    """msgspec refuses a body with a lone surrogate; the parser still splits it into entries, so the
    other sessions keep their identity (no re-render) and the result is exactly the pure parser's."""
    parser = SessionListParser()
    emoji = entry("emoji", tag="1.0 \U0001f3ae")  # a valid surrogate pair on the wire
    backslash = entry("back\\ud800slash")  # a backslash before "ud800": text, not an escape
    poisoned = entry("poison", image="g\ud800")
    first = parser.parse(body(entry("a"), emoji, backslash))
    raw = body(entry("a"), poisoned, emoji, backslash)
    assert b"\\ud800" in raw and b"\\ud83c\\udfae" in raw
    second = parser.parse(raw)

    assert second == pure(raw)
    assert [s.id for s in second.sessions] == ["a", "emoji", "back\\ud800slash"]
    assert all(x is y for x, y in zip(second.sessions, first.sessions, strict=True))
    assert [(i.index, i.session_id) for i in second.invalid] == [(1, "poison")]
    assert second.sessions[1].tag == "1.0 \U0001f3ae"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"playerCount": 1e30}, "playerCount"), ({"created": -1}, "created"), ({"image": "g\ud800"}, "image")],
)
def test_a_described_session_with_an_out_of_range_value_is_a_decode_error_naming_the_field(
    canned_upstream: tuple[str, type[_CannedHandler]], overrides: dict[str, Any], field: str
) -> None:
    """`GET /session/{id}` runs the same checks; there is no list to quarantine from, so it fails."""
    url, handler = canned_upstream
    handler.canned = json.dumps(entry("d", **overrides)).encode()
    with (
        SessionHostClient(httpx.Client(base_url=url), Token("t"), policy=FAST) as client,
        pytest.raises(ApiDecodeError, match=rf"session 'd' field '{field}'") as info,
    ):
        client.describe_session("d")
    assert SECRET not in str(info.value)


def test_an_odd_envelope_with_a_lone_surrogate_still_parses_like_the_pure_parser() -> None:
    """An earlier field holding a copy of an entry must not be mistaken for it when splitting."""
    copy = entry("twin", image="g\u0000")
    raw = json.dumps({"meta": {"sessions": [copy]}, "sessions": [entry("twin", image="g\ud800"), entry("b")]}).encode()
    listed = SessionListParser().parse(raw)
    assert listed == pure(raw)
    assert [s.id for s in listed.sessions] == ["b"] and [i.session_id for i in listed.invalid] == ["twin"]


def _escaped(name: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in name)


#: Bodies that put an env value inside the first 200 bytes while hiding the words `labels` and `env`
#: from a byte search, or that desynchronise a naive quote tracker (a stray leading quote).
HOSTILE_BODIES = {
    "escaped keys": f'{{"sessions": {{"{_escaped("labels")}": {{"{_escaped("env")}": {{"K": "{SECRET}"}}}}}}}}',
    "escaped value": f'{{"sessions": {{"x": {{"{_escaped("env")}": "{_escaped(SECRET)}"}}}}}}',
    "stray quote": f'"{{"labels":{{"env":{{"K":"{SECRET}"}}}}}}',
    "single quotes": f"{{'sessions': {{'labels': {{'env': {{'K': '{SECRET}'}}}}}}}}",
    "truncated": f'{{"sessions": [{{"id": "s", "labels": {{"env": "{{\\"K\\": \\"{SECRET}',
    "html echo": f"<html><body><pre>labels={{&quot;env&quot;:&quot;{SECRET}&quot;}}</pre>",
    "text echo": f"upstream error. labels env MATCH_SECRET: {SECRET}",
    "url echo": f"<html><body>labels%3D%7Benv%7D%22{SECRET}",
}


@pytest.mark.parametrize("status", [200, 502])
@pytest.mark.parametrize("body", list(HOSTILE_BODIES.values()), ids=list(HOSTILE_BODIES))
def test_no_hostile_body_puts_an_env_value_into_an_error_or_a_log_line(
    canned_upstream: tuple[str, type[_CannedHandler]], caplog: pytest.LogCaptureFixture, body: str, status: int
) -> None:
    """Excerpts are secret-free by construction (nothing from the first quote on), not by searching
    the bytes for `labels`/`env`: escaped names, stray quotes and truncations all stay hidden."""
    url, handler = canned_upstream
    handler.canned, handler.status = body.encode(), status
    caplog.set_level(logging.DEBUG)
    with SessionHostClient(httpx.Client(base_url=url), Token("t"), policy=FAST) as client:
        result = Poller(client, interval=0.1, on_result=lambda result: None).poll_once()  # short retry waits
    assert result.sessions is None and set(result.errors) == {"sessions", "metrics"}
    shown = " ".join(result.errors.values()) + caplog.text
    assert SECRET not in shown and SECRET[:6] not in shown
    assert f"({len(body.encode())} bytes)" in shown  # the size is said, for whoever debugs it
