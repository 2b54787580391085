"""Routing table of the fake service: request method and raw path to an endpoint key and its path values."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

# Endpoint keys: how request counters and fault switches name each endpoint.
CREATE = "POST /session"
LIST = "GET /session"
DESCRIBE = "GET /session/{id}"
STOP = "DELETE /session/{id}"
JOIN = "PUT /session/player/join"
LEAVE = "DELETE /session/player/leave"
LOCATIONS = "GET /available-location/{image}"
TAG = "GET /tag/{region}/{image}/{version}"
ARTIFACTS = "GET /artifacts"
LOGS = "GET /logs"
QUERY_LOG = "GET /query/log"
METRICS = "GET /metrics"

SPEC_ENDPOINTS: tuple[str, ...] = (
    CREATE, LIST, DESCRIBE, STOP, JOIN, LEAVE, LOCATIONS, TAG, ARTIFACTS, LOGS, QUERY_LOG, METRICS,
)  # fmt: skip

CONTROL_PREFIX = "/_fake/"
C_SEED = "POST /_fake/sessions"
C_END = "POST /_fake/sessions/{id}/end"
C_ADVANCE = "POST /_fake/clock/advance"
C_QUIRKS = "PUT /_fake/quirks"
C_FAULTS_SET = "PUT /_fake/faults"
C_FAULTS_CLEAR = "DELETE /_fake/faults"
C_TRAFFIC = "POST /_fake/traffic"
C_STATE = "GET /_fake/state"
C_LIST_ENTRIES_ADD = "POST /_fake/list-entries"
C_LIST_ENTRIES_CLEAR = "DELETE /_fake/list-entries"

#: Key of requests that match no route (counted too, so stray calls show up in the state).
UNMATCHED = "UNMATCHED"


@dataclass(frozen=True, slots=True)
class Route:
    """A matched endpoint: its key and the percent-decoded path parameters."""

    key: str
    params: dict[str, str]


def _segments(raw_path: str) -> list[str]:
    return raw_path.strip("/").split("/") if raw_path.strip("/") else []


def match(method: str, raw_path: str) -> Route:
    """Route a request. Matching runs on the raw (still percent-encoded) path, so a session id
    holding ``/`` (sent as ``%2F``) can never be mistaken for a sub-path; an id sent with a
    literal ``/`` still works because everything after ``/session/`` is the id."""
    segs = _segments(raw_path)
    if raw_path.startswith(CONTROL_PREFIX):
        return _match_control(method, segs)
    if not segs:
        return Route(UNMATCHED, {})
    head = segs[0]
    if head == "session":
        if len(segs) == 1:
            if method == "POST":
                return Route(CREATE, {})
            if method == "GET":
                return Route(LIST, {})
        elif segs[1:] == ["player", "join"] and method == "PUT":
            return Route(JOIN, {})
        elif segs[1:] == ["player", "leave"] and method == "DELETE":
            return Route(LEAVE, {})
        else:
            sid = unquote("/".join(segs[1:]), errors="surrogateescape")
            if method == "GET":
                return Route(DESCRIBE, {"id": sid})
            if method == "DELETE":
                return Route(STOP, {"id": sid})
    elif head == "available-location" and len(segs) == 2 and method == "GET":
        return Route(LOCATIONS, {"image": unquote(segs[1])})
    elif head == "tag" and len(segs) == 4 and method == "GET":
        return Route(TAG, {"region": unquote(segs[1]), "image": unquote(segs[2]), "version": unquote(segs[3])})
    elif method == "GET" and len(segs) == 1 and head in ("artifacts", "logs", "metrics"):
        return Route({"artifacts": ARTIFACTS, "logs": LOGS, "metrics": METRICS}[head], {})
    elif method == "GET" and segs == ["query", "log"]:
        return Route(QUERY_LOG, {})
    return Route(UNMATCHED, {})


def _match_control(method: str, segs: list[str]) -> Route:
    rest = segs[1:]
    if rest == ["sessions"] and method == "POST":
        return Route(C_SEED, {})
    if len(rest) >= 3 and rest[0] == "sessions" and rest[-1] == "end" and method == "POST":
        return Route(C_END, {"id": unquote("/".join(rest[1:-1]), errors="surrogateescape")})
    table = {
        ("POST", "clock/advance"): C_ADVANCE,
        ("PUT", "quirks"): C_QUIRKS,
        ("PUT", "faults"): C_FAULTS_SET,
        ("DELETE", "faults"): C_FAULTS_CLEAR,
        ("POST", "traffic"): C_TRAFFIC,
        ("GET", "state"): C_STATE,
        ("POST", "list-entries"): C_LIST_ENTRIES_ADD,
        ("DELETE", "list-entries"): C_LIST_ENTRIES_CLEAR,
    }
    key = table.get((method, "/".join(rest)))
    return Route(key, {}) if key else Route(UNMATCHED, {})
