"""Typed answers of the upstream's endpoints other than the session list: create, players, locations, tags, errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from archiver.errors import PayloadError
from archiver.upstream.checks import (
    as_int,
    optional_str,
    require_mapping,
    require_str,
    type_name,
)


@dataclass(frozen=True, slots=True)
class PortMapping:
    type: str
    container: int
    host: int


@dataclass(frozen=True, slots=True)
class CreatedSession:
    """The answer to POST /session (the id falls back to the requested one when omitted)."""

    id: str
    host: str
    ports: tuple[PortMapping, ...]


@dataclass(frozen=True, slots=True)
class PlayersResult:
    """The answer to player join/leave: the session's player count and ids."""

    count: int
    players: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Location:
    id: str
    ips: tuple[str, ...]


def parse_created(payload: Any, requested_id: str | None) -> CreatedSession:
    """The create answer; `id` may be missing when the caller chose one (observed)."""
    body = require_mapping(payload, "create response")
    sid = body.get("id")
    if not isinstance(sid, str) or not sid:
        if requested_id is None:
            raise PayloadError("create response has no 'id' and none was requested")
        sid = requested_id
    ports_raw = body.get("ports")
    ports: list[PortMapping] = []
    if isinstance(ports_raw, list):
        for item in ports_raw:
            if not isinstance(item, dict):
                continue
            container, host = as_int(item.get("container")), as_int(item.get("host"))
            if container is None or host is None:
                continue
            ports.append(PortMapping(str(item.get("type", "")), container, host))
    return CreatedSession(id=sid, host=optional_str(body, "host"), ports=tuple(ports))


def parse_players_result(payload: Any) -> PlayersResult:
    body = require_mapping(payload, "player result")
    players_raw = body.get("players")
    players = tuple(str(p) for p in players_raw) if isinstance(players_raw, list) else ()
    count = as_int(body.get("count"))
    return PlayersResult(count=len(players) if count is None else count, players=players)


def parse_locations(payload: Any) -> list[Location]:
    body = require_mapping(payload, "location list")
    raw = body.get("locations")
    if not isinstance(raw, list):
        raise PayloadError(f"location list field 'locations' is {type_name(raw)}, expected an array")
    result = []
    for i, item in enumerate(raw):
        entry = require_mapping(item, f"location {i}")
        ips = entry.get("ips")
        result.append(
            Location(
                id=require_str(entry, "id", f"location {i}"),
                ips=tuple(str(ip) for ip in ips) if isinstance(ips, list) else (),
            )
        )
    return result


def parse_tag_exists(payload: Any) -> bool:
    body = require_mapping(payload, "tag check")
    exists = body.get("exists")
    if not isinstance(exists, bool):
        raise PayloadError(f"tag check field 'exists' is {type_name(exists)}, expected a boolean")
    return exists


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """What an error response said, from whatever it was (JSON error body, HTML page, plain text)."""

    code: str = ""
    message: str = ""
    details: str = ""
    identifier: str = ""
    violations: tuple[tuple[str, str], ...] = ()


def parse_error_body(body: bytes) -> ErrorBody:
    """Best-effort reading of an error body; never raises (the HTTP status is what callers branch on)."""
    try:
        obj = json.loads(body) if body.lstrip()[:1] == b"{" else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return ErrorBody()
    violations: list[tuple[str, str]] = []
    raw = obj.get("violations")
    if isinstance(raw, list):
        for v in raw:
            if isinstance(v, dict):
                violations.append((str(v.get("field", "")), str(v.get("description", ""))))
    return ErrorBody(
        code=optional_str(obj, "code"),
        message=optional_str(obj, "message"),
        details=optional_str(obj, "details"),
        identifier=optional_str(obj, "identifier"),
        violations=tuple(violations),
    )
