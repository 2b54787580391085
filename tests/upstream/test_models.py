"""Tolerant parsing of upstream payloads: every quirk of api-behaviour.md yields the same model."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from archiver.errors import PayloadError
from archiver.upstream import models
from archiver.upstream.checks import decode_json
from archiver.upstream.models import UNKNOWN_STATUS, InvalidEntry, parse_labels, parse_ports, parse_session
from archiver.upstream.responses import parse_created, parse_error_body
from archiver.upstream.sessionlist import parse_session_list
from tests.support import list_entry

ENV = {"GAMEYE_SESSION_ID": "s1", "GAMEYE_HOST": "203.0.113.42", "SECRET": "hunter2"}
TAGS = {"mode": "duel", "tournament": "spring"}


def entry(**overrides: Any) -> dict[str, Any]:
    return list_entry("s1", {"env": json.dumps(ENV), "tags": json.dumps(TAGS)}, overrides)


CANONICAL = parse_session(entry())


@pytest.mark.parametrize(
    "port",
    [
        {"7777/udp": 25160},
        json.dumps({"7777/udp": 25160}),
        {"port": {"7777/udp": 25160}},
        {"port": json.dumps({"7777/udp": 25160})},
        json.dumps({"port": {"7777/udp": 25160}}),
        {"7777/udp": 25160.0},
        {"7777/udp": "25160"},
    ],
)
def test_every_port_shape_parses_to_the_same_mapping(port: Any) -> None:
    assert parse_session(entry(port=port)).ports == {"7777/udp": 25160}


@pytest.mark.parametrize(
    "labels",
    [
        {"env": json.dumps(ENV), "tags": json.dumps(TAGS)},
        json.dumps({"env": json.dumps(ENV), "tags": json.dumps(TAGS)}),
        {"labels": {"env": json.dumps(ENV), "tags": json.dumps(TAGS)}},
        {"labels": json.dumps({"env": ENV, "tags": TAGS})},
        {"env": ENV, "tags": TAGS},
    ],
)
def test_every_labels_shape_gives_the_caller_labels_and_only_env_keys(labels: Any) -> None:
    session = parse_session(entry(labels=labels))
    assert session.labels == TAGS
    assert session.env_keys == tuple(sorted(ENV))
    assert "hunter2" not in repr(session)


def test_env_values_never_survive_parsing() -> None:
    session = parse_session(entry())
    assert "hunter2" not in repr(session)
    assert "SECRET" in session.env_keys


def test_missing_optional_list_fields_are_tolerated() -> None:
    raw = entry()
    for key in ("tag", "status", "playerCount", "labels"):
        raw.pop(key)
    session = parse_session(raw)
    assert (session.tag, session.status, session.player_count, dict(session.labels)) == (
        "",
        UNKNOWN_STATUS,
        None,
        {},
    )


@pytest.mark.parametrize("status", ["", None, "hibernating", 5])
def test_unknown_or_missing_status_maps_to_unknown(status: Any) -> None:
    assert parse_session(entry(status=status)).status == UNKNOWN_STATUS


def test_null_player_count_and_unknown_fields_are_tolerated() -> None:
    session = parse_session(entry(playerCount=None, enableMetrics=True, somethingNew={"a": 1}))
    assert session.player_count is None
    assert session.id == CANONICAL.id


def test_float_created_keeps_full_precision() -> None:
    session = parse_session(entry(created=1648472895123.5))
    assert session.created_ms == 1648472895123.5
    assert session.created_seconds == pytest.approx(1648472895.1235, abs=1e-6)


def test_described_session_carries_players() -> None:
    raw = entry(players={"joined": ["p1", "p2", "p3"], "joinedCount": 3})
    raw.pop("playerCount")
    session = parse_session(raw)
    assert session.players == ("p1", "p2", "p3")
    assert session.player_count == 3


def test_terminal_statuses() -> None:
    assert parse_session(entry(status="exited")).terminal
    assert parse_session(entry(status="dead")).terminal
    assert not parse_session(entry(status="draining")).terminal


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "expected an object"),
        ({"sessions": {}}, "expected an array"),
        ({}, "'sessions' is null"),
    ],
)
def test_a_malformed_envelope_fails_the_whole_list_naming_the_problem(payload: Any, message: str) -> None:
    """Without a `sessions` array there is no list at all: the poll failed."""
    with pytest.raises(PayloadError, match=message):
        parse_session_list(payload)


SECRET_ENV_VALUE = "s3cr3t-env-value-never-logged"
POISONED_LABELS = {"env": json.dumps({"MATCH_SECRET": SECRET_ENV_VALUE}), "tags": json.dumps(TAGS)}

#: Entry overrides that must be quarantined → (expected session_id of the InvalidEntry, reason pattern).
BAD_ENTRIES: dict[str, tuple[dict[str, Any], str | None, str]] = {
    "playerCount 1e30": ({"id": "big", "playerCount": 1e30}, "big", r"'big' field 'playerCount' is out of the 64-bit"),
    "playerCount '1e25'": ({"id": "big", "playerCount": "1e25"}, "big", r"field 'playerCount' is out of the 64-bit"),
    "joinedCount 2**63": (
        {"id": "j", "playerCount": None, "players": {"joinedCount": 2**63}},
        "j",
        r"field 'players.joinedCount' is out of the 64-bit",
    ),
    "lone surrogate in id": ({"id": "ab\ud800"}, "ab\ud800", r"entry 1 field 'id' is not valid UTF-8"),
    "lone surrogate in image": ({"id": "img", "image": "demo\udfff"}, "img", r"'img' field 'image' is not valid"),
    "lone surrogate in tag": ({"id": "t", "tag": "\ud800"}, "t", r"field 'tag' is not valid UTF-8"),
    "lone surrogate in host": ({"id": "h", "host": "\ud800"}, "h", r"field 'host' is not valid UTF-8"),
    "lone surrogate in location": ({"id": "l", "location": "\ud800"}, "l", r"field 'location' is not valid"),
    "lone surrogate in a label value": (
        {"id": "lv", "labels": {"env": POISONED_LABELS["env"], "tags": json.dumps({"mode": "\ud800"})}},
        "lv",
        r"field 'labels.tags' holds a key or value that is not valid UTF-8",
    ),
    "lone surrogate in a label value, labels as objects": (
        {"id": "lo", "labels": {"tags": {"mode": "\ud800"}}},
        "lo",
        r"field 'labels.tags' holds",
    ),
    "lone surrogate in an image label key": (
        {"id": "ik", "labels": {"com.example\ud800": "1"}},
        "ik",
        r"field 'labels' holds a key or value",
    ),
    "created in microseconds": ({"id": "us", "created": 1_700_000_000_000_000}, "us", r"'created' is not an epoch-ms"),
    "negative created": ({"id": "neg", "created": -1}, "neg", r"'neg' field 'created' is not an epoch-ms time"),
    "created in seconds": ({"id": "sec", "created": 1_700_000_000}, "sec", r"field 'created' is not an epoch-ms"),
    "empty id": ({"id": ""}, None, r"session list entry 1 field 'id' is empty"),
    "non-string id": ({"id": 7}, None, r"session list entry 1 field 'id' is int, expected a string"),
    "missing id": ({"id": None}, None, r"session list entry 1 has no 'id'"),
    "missing image": ({"id": "noimg", "image": None}, "noimg", r"'noimg' has no 'image'"),
    "unparseable created": ({"id": "y", "created": "yesterday"}, "y", r"'y' field 'created'"),
}


def _decoded(overrides: dict[str, Any]) -> dict[str, Any]:
    """The entry as the client gets it: through JSON, where a lone surrogate travels as "\\ud800"."""
    decoded: dict[str, Any] = json.loads(json.dumps(entry(**{"labels": POISONED_LABELS, **overrides})))
    return decoded


@pytest.mark.parametrize(("overrides", "session_id", "reason"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_a_bad_entry_is_left_out_with_its_index_and_id_while_the_others_parse(
    overrides: dict[str, Any], session_id: str | None, reason: str
) -> None:
    bad = _decoded(overrides)
    listed = parse_session_list({"sessions": [entry(id="before"), bad, entry(id="after")]})

    assert [s.id for s in listed.sessions] == ["before", "after"]
    [invalid] = listed.invalid
    assert invalid.index == 1
    assert invalid.session_id == session_id
    assert re.search(reason, invalid.reason), invalid.reason
    assert SECRET_ENV_VALUE not in invalid.reason


@pytest.mark.parametrize(("overrides", "session_id", "reason"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_a_described_session_with_a_bad_value_is_a_payload_error_naming_the_field(
    overrides: dict[str, Any], session_id: str | None, reason: str
) -> None:
    """The same checks guard `GET /session/{id}`: what would fail later fails here, as a PayloadError."""
    with pytest.raises(PayloadError) as info:
        parse_session(_decoded(overrides))
    assert SECRET_ENV_VALUE not in str(info.value)
    str(info.value).encode("utf-8")  # the message itself never carries a lone surrogate


def test_a_non_object_entry_is_left_out_without_an_id() -> None:
    listed = parse_session_list({"sessions": [entry(), "garbage"]})
    assert [s.id for s in listed.sessions] == ["s1"]
    assert listed.invalid == (InvalidEntry(1, None, "session list entry 1 is str, expected an object"),)


@pytest.mark.parametrize(
    "created", [models.CREATED_MIN_MS, models.CREATED_MAX_MS, 1_700_000_000_000, "1700000000000.5"]
)
def test_created_at_the_plausible_bounds_and_inside_them_is_accepted(created: Any) -> None:
    assert parse_session(entry(created=created)).created_ms == float(created)


@pytest.mark.parametrize(
    ("count", "kept"), [(2**63 - 1, 2**63 - 1), (-(2**63), -(2**63)), ("9.2e18", 9_200_000_000_000_000_000), (0, 0)]
)
def test_player_counts_that_fit_64_bits_are_kept(count: Any, kept: int) -> None:
    assert parse_session(entry(playerCount=count)).player_count == kept


def test_a_port_out_of_range_or_with_an_unencodable_name_is_dropped_not_the_session() -> None:
    ports = {"7777/udp": 25160, "1/tcp": 2**64, "2/tcp\ud800": 1}
    session = parse_session(_decoded({"port": ports}))
    assert session.ports == {"7777/udp": 25160}


def test_a_lone_surrogate_in_a_joined_player_id_or_an_env_name_of_a_described_session_is_refused() -> None:
    with pytest.raises(PayloadError, match=r"field 'players.joined' holds an id that is not valid UTF-8"):
        parse_session(_decoded({"players": {"joined": ["p1", "p\ud800"]}}))
    env = json.dumps({"OK": SECRET_ENV_VALUE, "BAD\ud800": SECRET_ENV_VALUE})
    with pytest.raises(PayloadError, match=r"field 'labels.env' holds a name") as info:
        parse_session(_decoded({"labels": {"env": env}}))
    assert SECRET_ENV_VALUE not in str(info.value)
    # List entries never decode the env, so an odd env name cannot cost a session there.
    assert parse_session(_decoded({"labels": {"env": env}}), with_env_keys=False).env_keys == ()


def test_a_lone_surrogate_in_an_env_value_is_not_checked_because_values_are_never_kept() -> None:
    env = json.dumps({"MATCH_SECRET": "x\ud800"})
    assert parse_session(_decoded({"labels": {"env": env}})).env_keys == ("MATCH_SECRET",)


def test_a_very_long_id_is_cut_in_the_reason() -> None:
    listed = parse_session_list({"sessions": [entry(id="x" * 10_000, created=-5)]})
    [invalid] = listed.invalid
    assert invalid.session_id == "x" * 10_000
    assert len(invalid.reason) < 300


def test_create_response_falls_back_to_the_requested_id() -> None:
    created = parse_created(
        {"host": "1.2.3.4", "ports": [{"type": "udp", "container": 7777, "host": 25000}] * 2}, "mine"
    )
    assert created.id == "mine"
    assert len(created.ports) == 2
    with pytest.raises(PayloadError):
        parse_created({"host": "1.2.3.4", "ports": []}, None)


def test_labels_keep_undecodable_json_as_raw_strings() -> None:
    labels = parse_labels({"tags": "{not json", "com.example.build": "42"})
    assert labels.image == {"tags": "{not json", "com.example.build": "42"}
    assert labels.user == {}


def test_ports_with_garbage_values_drop_only_those_entries() -> None:
    assert parse_ports({"80/tcp": "x", "81/tcp": 8081, "82/tcp": None}) == {"81/tcp": 8081}
    assert parse_ports("not json") == {}


def test_error_body_parsing_never_raises() -> None:
    body = json.dumps(
        {
            "statusCode": 422,
            "code": "X",
            "message": "bad",
            "identifier": "abc",
            "violations": [{"field": "image", "description": "required"}],
        }
    ).encode()
    info = parse_error_body(body)
    assert (info.code, info.message, info.identifier, info.violations) == (
        "X",
        "bad",
        "abc",
        (("image", "required"),),
    )
    assert parse_error_body(b"<html><body>502 Bad Gateway</body></html>").message == ""
    assert parse_error_body(b"\x00\xff").code == ""


def test_list_entries_carry_no_env_keys_while_described_sessions_keep_them() -> None:
    [listed] = parse_session_list({"sessions": [entry()]}).sessions
    assert listed.env_keys == ()
    assert listed == parse_session(entry(), with_env_keys=False)
    assert parse_session(entry()).env_keys == tuple(sorted(ENV))


def test_repeated_strings_are_shared_between_sessions() -> None:
    # Built at run time so the two copies are distinct objects before parsing.
    a, b = parse_session_list({"sessions": [entry(id="a", image="".join(["demo", "-game"])), entry(id="b")]}).sessions
    assert a.image is b.image and a.location is b.location and a.status is b.status


@pytest.mark.parametrize(
    "body",
    [b'{"a": NaN}', b'{"a": "\\ud800"}', b'\xef\xbb\xbf{"a": 1}', b'{"a": 1e400}', b'{"a": [1, 2.5, "x"]}'],
)
def test_decode_json_gives_what_pythons_json_gives(body: bytes) -> None:
    assert repr(decode_json(body)) == repr(json.loads(body))


@pytest.mark.parametrize("created", [10**400, "1e999", float("nan")])
def test_created_that_is_not_a_finite_number_is_a_payload_error(created: Any) -> None:
    """A 400-digit integer would otherwise pass parsing and crash the renderer later."""
    with pytest.raises(PayloadError, match="'created'"):
        parse_session(entry(created=created))


def test_scan_ended_keeps_only_terminal_entries_and_parses_them_on_demand() -> None:
    """Reconciliation reads id, status and created of every entry and parses only ended ones."""
    from archiver.upstream.models import Session, parse_ended
    from archiver.upstream.sessionlist import scan_ended

    entries = [
        {"id": "running", "image": "g", "location": "l", "created": 1.7e12, "status": "running"},
        {"id": "done", "image": "g", "location": "l", "created": 1.7e12, "status": "exited",
         "labels": {"env": '{"SECRET": "hunter2"}'}},
        {"id": "crashed", "image": "g", "location": "l", "created": 1.7e12 + 5, "status": "dead"},
        {"id": "no-created", "image": "g", "location": "l", "status": "exited"},
        {"id": "bad\ud800", "image": "g", "location": "l", "created": 1.7e12, "status": "exited"},
        {"id": "huge", "image": "g", "location": "l", "created": 1.7e12, "status": "exited", "playerCount": 1e30},
        "not an object",
    ]  # fmt: skip
    body = json.dumps({"sessions": entries}).encode()
    found = scan_ended(body)
    assert [(e.index, e.session_id) for e in found] == [(1, "done"), (2, "crashed"), (4, "bad\ud800"), (5, "huge")]
    parsed = [parse_ended(e) for e in found]
    assert [p.id for p in parsed if isinstance(p, Session)] == ["done", "crashed"]
    invalid = [p for p in parsed if not isinstance(p, Session)]
    assert [(i.index, i.session_id) for i in invalid] == [(4, "bad\ud800"), (5, "huge")]
    assert all("hunter2" not in i.reason for i in invalid)
    with pytest.raises(PayloadError):
        scan_ended(b'{"sessions": 3}')
