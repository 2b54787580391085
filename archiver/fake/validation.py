"""Validation of request bodies (pure): field-by-field violations exactly as a 422 reports them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from archiver.errors import Violation

_TTL = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?$")

_CREATE_FIELDS = frozenset(
    {"id", "location", "image", "env", "args", "restart", "labels", "version", "ttl", "external_id"}
)


class InvalidBody(Exception):
    """A request body broke the schema; carries every violation found."""

    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))
        self.violations = violations


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """A valid POST /session body."""

    location: str
    image: str
    id: str | None = None
    version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    restart: bool = False
    ttl_seconds: int | None = None


def parse_ttl(text: str) -> int | None:
    """Seconds of a ttl like ``1h``, ``2h30m`` or ``1m`` (under a minute rounds up), or None if invalid."""
    m = _TTL.match(text)
    if not text or m is None:
        return None
    seconds = int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60
    return max(seconds, 60)


def _string(body: dict[str, object], name: str, out: list[Violation], *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required or name in body:
            out.append(Violation(name, "is required and must be a non-empty string"))
        return None
    if not isinstance(value, str) or not value:
        out.append(Violation(name, "must be a non-empty string"))
        return None
    return value


def _string_map(body: dict[str, object], name: str, out: list[Violation], *, non_empty: bool) -> dict[str, str]:
    value = body.get(name, {})
    if not isinstance(value, dict):
        out.append(Violation(name, "must be an object mapping strings to strings"))
        return {}
    bad = [k for k, v in value.items() if not isinstance(v, str) or (non_empty and not v)]
    # Name only the keys: an env value can be a secret and must not be echoed back.
    out.extend(Violation(f"{name}.{k}", "must be a non-empty string" if non_empty else "must be a string") for k in bad)
    return {k: v for k, v in value.items() if isinstance(v, str)}


def validate_create(body: object) -> CreateRequest:
    """The create request in ``body`` (decoded JSON); InvalidBody lists every problem."""
    if not isinstance(body, dict):
        raise InvalidBody([Violation("body", "must be a JSON object")])
    out: list[Violation] = [Violation(k, "is not a known field") for k in sorted(set(body) - _CREATE_FIELDS)]
    sid = _string(body, "id", out, required=False)
    location = _string(body, "location", out, required=True)
    image = _string(body, "image", out, required=True)
    version = _string(body, "version", out, required=False)
    _string(body, "external_id", out, required=False)
    env = _string_map(body, "env", out, non_empty=True)
    labels = _string_map(body, "labels", out, non_empty=False)
    args = body.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and a for a in args):
        out.append(Violation("args", "must be an array of non-empty strings"))
        args = []
    restart = body.get("restart", False)
    if not isinstance(restart, bool):
        out.append(Violation("restart", "must be a boolean"))
        restart = False
    ttl_seconds = None
    ttl = body.get("ttl")
    if ttl is not None:
        ttl_seconds = parse_ttl(ttl) if isinstance(ttl, str) else None
        if ttl_seconds is None:
            out.append(Violation("ttl", "must be a duration in hours and minutes, e.g. 1h, 2h30m, 1m"))
    if out or location is None or image is None:
        raise InvalidBody(out)
    return CreateRequest(
        location=location, image=image, id=sid, version=version, env=env, labels=labels,
        args=list(args), restart=restart, ttl_seconds=ttl_seconds,
    )  # fmt: skip


def validate_players(body: object, *, session_required: bool) -> tuple[str | None, list[str]]:
    """``(session, players)`` of a join (``session_required``) or leave body; InvalidBody otherwise.

    A leave body without ``session`` is valid here: the service answers it with 404, not 422.
    """
    if not isinstance(body, dict):
        raise InvalidBody([Violation("body", "must be a JSON object")])
    out = [Violation(k, "is not a known field") for k in sorted(set(body) - {"session", "players"})]
    session = _string(body, "session", out, required=session_required)
    raw = body.get("players")
    players = [p for p in raw if isinstance(p, str)] if isinstance(raw, list) else []
    if not isinstance(raw, list) or len(players) != len(raw):
        out.append(Violation("players", "is required and must be an array of strings"))
    if out:
        raise InvalidBody(out)
    return session, players
