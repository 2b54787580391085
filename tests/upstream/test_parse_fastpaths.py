"""The session-list parser's fast paths give exactly the reference results: entries remembered by a
digest of their bytes (SHA-256, or the keyed hash the entry point hands over), never by the bytes;
entries of nearly the service's shape, and odd ones, parse incrementally to what the reference
parse gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.upstream.listparser import SessionListParser
from archiver.upstream.models import CREATED_MAX_MS, CREATED_MIN_MS, INT64_MAX, loads_json
from archiver.upstream.sessionlist import Digest, Digests, keyed_hash_digests, parse_session_list, sha256_digests
from tests.support import entries

_ONE_ENTRY = b'{"sessions": [{"id": "a", "image": "i", "location": "l", "created": 1648472895000}]}'
_PROBE = (
    "from archiver.upstream import listparser; "
    "p = listparser.SessionListParser(); "
    f"p.parse({_ONE_ENTRY!r}); "
    "print(type(next(iter(p._by_digest))).__name__)"
)


def test_a_parser_built_without_a_choice_remembers_entries_by_sha256_even_with_a_secret_hash_key() -> None:
    """Importing the parser picks nothing: the keyed hash is the entry point's to hand over
    (`archiver.app.process.apply`), so a fresh interpreter with a random key still uses SHA-256."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["bytes"]


@pytest.mark.parametrize(("digests", "kind"), [(sha256_digests, bytes), (keyed_hash_digests, int)])
def test_entries_are_remembered_by_the_digests_the_parser_was_built_with(digests: Digests, kind: type[Digest]) -> None:
    parser = SessionListParser(digests=digests)
    parser.parse(_ONE_ENTRY)
    again = parser.parse(_ONE_ENTRY)
    [digest] = parser._by_digest
    assert type(digest) is kind
    assert again.delta is not None and again.delta.added == [] and again.delta.removed == []


def test_the_remembered_digests_hold_no_entry_bytes() -> None:
    secret = "hunter2-do-not-leak"
    entry = {"id": "a", "image": "i", "location": "l", "created": 1648472895000, "labels": {"env": secret}}
    parser = SessionListParser()
    parser.parse(json.dumps({"sessions": [entry]}).encode())
    [digest] = parser._by_digest
    assert isinstance(digest, int | bytes) and secret.encode() not in repr(digest).encode()


# --- entries of nearly the service's shape: the incremental parse against the reference ---------


_TEXT = st.text(max_size=6) | st.sampled_from(["", "demo-game", "\ud800", "é", "x\u0000"])
_NUMBER = st.sampled_from(
    [0, 1, -1, 2.5, 3.0, INT64_MAX, INT64_MAX + 1, -(2**63), -(2**63) - 1, 10**30, True, "3", None]
)
_TAGS = st.sampled_from(
    ['{"mode": "duel"}', '{"mode": 3}', '{"m": "\\ud800"}', "{", "[1]", "duel", '{"mode": null}', "{}"]
)


@st.composite
def plain_entries(draw: st.DrawFn) -> dict[str, Any]:
    """Entries of nearly the service's shape, each field sometimes missing, null, of another type,
    at a range's edge or wrapped, so both parses meet every way an entry can be odd."""

    def field(plain: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> Any:
        return draw(plain if draw(st.integers(0, 9)) < 8 else odd)

    entry: dict[str, Any] = {
        "id": field(st.sampled_from(["a", "52e6b438"]), _TEXT | _NUMBER),
        "image": field(st.just("demo-game"), _TEXT | _NUMBER),
        "tag": field(st.just("1.0.0"), _TEXT | _NUMBER),
        "location": field(st.just("eu-west-1"), _TEXT | _NUMBER),
        "host": field(st.just("203.0.113.9"), _TEXT | _NUMBER),
        "created": field(
            st.integers(946_684_800_000, 7_258_118_400_000) | st.floats(9.5e11, 7.2e12),
            st.sampled_from([CREATED_MIN_MS, CREATED_MAX_MS, int(CREATED_MAX_MS) + 1, CREATED_MIN_MS - 0.5]) | _NUMBER,
        ),
        "status": field(st.sampled_from(["running", "exited"]), st.sampled_from(["", "weird"]) | _NUMBER),
        "playerCount": field(st.integers(0, 16), _NUMBER),
        "port": field(
            st.dictionaries(st.sampled_from(["7777/udp", "27015/tcp"]), st.integers(0, 65535), max_size=2),
            st.dictionaries(_TEXT, _NUMBER, max_size=2)
            | st.sampled_from([{"port": {"80/tcp": 1}}, {"port": 5}, '{"80/tcp": 1}', None]),
        ),
        "labels": field(
            st.fixed_dictionaries({"env": st.just('{"S": "hunter2"}')}, optional={"tags": _TAGS, "gameye": _TAGS}),
            st.dictionaries(st.sampled_from(["tags", "env", "gameye", "labels", "\ud800"]), _TAGS | _NUMBER, max_size=4)
            | st.sampled_from([{"labels": {"tags": '{"a": "b"}'}}, '{"tags": "{}"}', None]),
        ),
        "players": field(st.none(), st.sampled_from([{"joined": ["p"]}, [], 0])),
        "enableMetrics": False,
    }
    for key in draw(st.lists(st.sampled_from(list(entry)), max_size=2)):
        entry.pop(key, None)
    return entry


def _assert_same_as_reference(raw: bytes) -> None:
    """One entry (`raw`) listed alone and beside a plain entry: the incremental parse of the list
    is the reference parse's, field by field (repr: 3 and 3.0 differ)."""
    plain = b'{"id": "p", "image": "i", "location": "l", "created": 1648472895000}'
    for body in (b'{"sessions": [' + raw + b"]}", b'{"sessions": [' + plain + b", " + raw + b"]}"):
        listed = SessionListParser().parse(body)
        reference = parse_session_list(loads_json(body))
        assert listed == reference and repr(listed) == repr(reference)


@settings(deadline=None)  # a loaded CI machine must not fail an example on time
@given(plain_entries())
def test_an_entry_of_nearly_the_services_shape_parses_incrementally_as_the_reference_does(
    entry: dict[str, Any],
) -> None:
    _assert_same_as_reference(json.dumps(entry).encode())


@settings(deadline=None)  # a loaded CI machine must not fail an example on time
@given(entries())
def test_any_odd_entry_parses_incrementally_as_the_reference_does(entry: Any) -> None:
    _assert_same_as_reference(json.dumps(entry).encode())


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "", "id": "a", "image": "i", "location": "l", "created": 1648472895000}',  # last wins
        b'{"id": "a", "image": "i", "location": "l", "created": 1648472895000, "created": "x"}',
        b'{"\\u0069d": "a", "image": "i", "location": "l", "created": 1648472895000}',  # escaped key
        b'{"id": "a\\ud800", "image": "i", "location": "l", "created": 1648472895000}',  # lone surrogate
        b'{"id": "a", "image": "i", "location": "l", "created": 1648472895000, "port": {"p": 1, "p": 1e30}}',
        b'{"id": "a", "image": "i", "location": "l", "created": 1648472895000, "playerCount": 2, "players": null}',
    ],
)
def test_byte_level_oddities_parse_incrementally_as_the_reference_does(raw: bytes) -> None:
    _assert_same_as_reference(raw)


def test_the_services_usual_entries_parse_incrementally_as_the_reference_does() -> None:
    """The shape benchmarks/scrape.py generates (the real service's), beside an entry whose count is
    a string (the tolerant coercion)."""
    entry = {
        "id": "52e6b438-f2a7", "image": "demo-game", "tag": "1.0.0", "location": "eu-west-1",
        "host": "203.0.119.138", "created": 1760000000000, "port": {"7777/udp": 21542},
        "status": "running", "playerCount": 2, "enableMetrics": False,
        "labels": {"env": '{"MATCH_SECRET": "hunter2"}', "tags": '{"mode": "ffa"}', "gameye": '{"v": "1"}'},
    }  # fmt: skip
    body = json.dumps({"sessions": [entry, {**entry, "id": "b", "playerCount": "3"}]}).encode()
    listed = SessionListParser().parse(body)
    assert listed == parse_session_list(loads_json(body))
    assert listed.sessions[0].labels == {"mode": "ffa"} and listed.sessions[0].env_keys == ()
    assert "hunter2" not in repr(listed)
