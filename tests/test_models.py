"""Tolerant parsing of upstream payloads: every quirk of api-behaviour.md yields the same model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from archiver.errors import PayloadError
from archiver.models import (
    UNKNOWN_STATUS,
    decode_json,
    parse_created,
    parse_error_body,
    parse_labels,
    parse_ports,
    parse_session,
    parse_session_list,
)

ENV = {"GAMEYE_SESSION_ID": "s1", "GAMEYE_HOST": "203.0.113.42", "SECRET": "hunter2"}
TAGS = {"mode": "duel", "tournament": "spring"}


def entry(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "s1",
        "image": "demo-game",
        "tag": "1.1.0",
        "location": "eu-west-1",
        "host": "203.0.113.42",
        "created": 1648472895000,
        "port": {"7777/udp": 25160},
        "status": "running",
        "playerCount": 2,
        "labels": {"env": json.dumps(ENV), "tags": json.dumps(TAGS)},
    }
    base.update(overrides)
    return base


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
        ({"sessions": [entry(id=None)]}, "has no 'id'"),
        ({"sessions": [entry(id=7)]}, "expected a string"),
        ({"sessions": [entry(image=None)]}, "has no 'image'"),
        ({"sessions": [entry(created="yesterday")]}, "'created'"),
        ({"sessions": [entry(), "garbage"]}, "entry 1"),
    ],
)
def test_malformed_lists_raise_payload_errors_naming_the_problem(payload: Any, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        parse_session_list(payload)


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
    [listed] = parse_session_list({"sessions": [entry()]})
    assert listed.env_keys == ()
    assert listed == parse_session(entry(), with_env_keys=False)
    assert parse_session(entry()).env_keys == tuple(sorted(ENV))


def test_repeated_strings_are_shared_between_sessions() -> None:
    # Built at run time so the two copies are distinct objects before parsing.
    a, b = parse_session_list({"sessions": [entry(id="a", image="".join(["demo", "-game"])), entry(id="b")]})
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
