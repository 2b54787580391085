"""Wire shapes (pure): sessions, create results, error bodies and metrics as the real service sends them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from archiver.errors import Violation
from archiver.fake.quirks import Quirks
from archiver.fake.state import Session

HTML_GATEWAY_PAGES = {
    404: "Not Found",
    502: "Bad Gateway",
    503: "Service Temporarily Unavailable",
    504: "Gateway Time-out",
}

#: Reason phrases http.server lacks (420) or that must read like the real service's.
REASONS = {420: "Enhance Your Calm", 422: "Unprocessable Entity", 429: "Too Many Requests"}

ERROR_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "RESOURCE_NOT_FOUND",
    409: "CONFLICT",
    420: "ENHANCE_YOUR_CALM",
    422: "UNPROCESSABLE_ENTITY",
    429: "TOO_MANY_REQUESTS",
    500: "INTERNAL_SERVER_ERROR",
    503: "SERVICE_UNAVAILABLE",
}


def dumps(doc: object) -> bytes:
    """Compact JSON bytes (what the real service sends)."""
    return json.dumps(doc, separators=(",", ":")).encode()


def error_body(
    status: int,
    code: str,
    message: str,
    details: str,
    path: str,
    now: float,
    violations: Sequence[Violation] = (),
) -> bytes:
    """The standard ErrorResponse body; ``identifier`` is a fresh trace id."""
    doc: dict[str, object] = {
        "statusCode": status,
        "code": code,
        "message": message,
        "details": details or message,
        "path": path,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "identifier": str(uuid.uuid4()),
    }
    if violations:
        doc["violations"] = [{"field": v.field, "description": v.description} for v in violations]
    return dumps(doc)


def html_gateway_page(status: int) -> bytes:
    """What a proxy in front of the service answers (nginx style)."""
    title = f"{status} {HTML_GATEWAY_PAGES.get(status, 'Error')}"
    return (
        f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n"
        f"<center><h1>{title}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    ).encode()


def _created(s: Session, quirks: Quirks) -> int | float:
    ms = s.created * 1000.0
    # Without the quirk: an integer; with it: a float that really has a fractional part.
    return round(ms, 3) if quirks.float_created else int(ms)


def _port(s: Session, quirks: Quirks) -> object:
    port: object = {spec.key: host_port for spec, host_port in s.ports}
    if quirks.port_as_string:
        port = json.dumps(port)
    return {"port": port} if quirks.port_wrapped else port


def _labels(s: Session, quirks: Quirks) -> object:
    labels: object = {
        "env": json.dumps(s.container_env(), separators=(",", ":")),
        "tags": json.dumps(s.labels, separators=(",", ":")),
    }
    if quirks.labels_as_string:
        labels = json.dumps(labels)
    return {"labels": labels} if quirks.labels_wrapped else labels


def _common(s: Session, quirks: Quirks) -> dict[str, object]:
    doc: dict[str, object] = {
        "id": s.id,
        "image": s.image,
        "tag": s.tag,
        "location": s.location,
        "host": s.host,
        "created": _created(s, quirks),
        "port": _port(s, quirks),
        "status": s.status,
        "labels": _labels(s, quirks),
    }
    if quirks.extra_fields:
        doc["enableMetrics"] = False
        doc["external_id"] = ""
    return doc


def list_entry(s: Session, quirks: Quirks) -> dict[str, object]:
    """An element of GET /session's ``sessions``."""
    doc = _common(s, quirks)
    doc["playerCount"] = None if quirks.player_count_null else len(s.players)
    if quirks.omit_optional_list_fields:
        for name in ("tag", "status", "playerCount"):
            doc.pop(name)
    return doc


def described(s: Session, quirks: Quirks) -> dict[str, object]:
    """GET /session/{id}."""
    doc = _common(s, quirks)
    doc["players"] = {"joined": list(s.players), "joinedCount": len(s.players)}
    return doc


def create_result(s: Session, quirks: Quirks, *, caller_chose_id: bool) -> dict[str, object]:
    """POST /session's 201 body; the id-less quirk only drops an id the caller already knows."""
    doc: dict[str, object] = {
        "id": s.id,
        "host": s.host,
        "ports": [{"type": spec.protocol, "container": spec.container, "host": hp} for spec, hp in s.ports],
    }
    if quirks.omit_create_id and caller_chose_id:
        del doc["id"]
    return doc


def metrics_text(active: int, started_total: int, players_by_location: dict[str, int], quirks: Quirks) -> bytes:
    """GET /metrics: the bare ``session_count N`` line, or (quirk) typed families with HELP/TYPE."""
    if not quirks.metrics_extra_families:
        return f"session_count {active}\n".encode()
    lines = [
        "# HELP session_count Number of active sessions of this organisation.",
        "# TYPE session_count gauge",
        f"session_count {active}",
        "# HELP sessions_started_total Sessions started by this organisation.",
        "# TYPE sessions_started_total counter",
        f"sessions_started_total {started_total}",
        "# HELP session_players Players joined to active sessions, per location.",
        "# TYPE session_players gauge",
    ]
    lines.extend(
        f'session_players{{location="{_label_value(loc)}"}} {n}' for loc, n in sorted(players_by_location.items())
    )
    return ("\n".join(lines) + "\n").encode()


def _label_value(value: str) -> str:
    """A Prometheus label value escaped for the text format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
