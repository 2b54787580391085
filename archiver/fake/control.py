"""The control API under /_fake/: seed and end sessions, move the clock, set quirks, faults and traffic,
inject raw session-list entries."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict

from archiver.errors import Violation
from archiver.fake import endpoints as ep
from archiver.fake.content import session_files
from archiver.fake.errors import FakeConfigError, HttpProblem, UnknownSessionError
from archiver.fake.faults import check_endpoint, fault_from_mapping
from archiver.fake.quirks import with_flags
from archiver.fake.routes import Context, Request, Response
from archiver.fake.state import TERMINAL, Org, ServiceState, Session
from archiver.fake.traffic import TrafficSettings
from archiver.fake.validation import CreateRequest, InvalidBody, validate_create
from archiver.fake.wire import dumps

_SEED_CREATE_FIELDS = ("id", "image", "location", "labels", "env")
_SEED_EXTRA_FIELDS = ("tag", "files", "crash", "players", "lifetime")


def _bad(message: str, violations: list[Violation] | None = None) -> HttpProblem:
    return HttpProblem(422, "UNPROCESSABLE_ENTITY", message, violations=violations or [])


def _object(req: Request) -> dict[str, object]:
    body = req.json_body()
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise _bad("The body must be a JSON object.", [Violation("body", "must be a JSON object")])
    return body


def seed_session(state: ServiceState, org: Org, body: Mapping[str, object]) -> Session:
    """Create a session for ``org`` from a seed description, bypassing capacity and start-rate
    limits. Keys: id, image (demo-game), location (eu-west-1), tag, labels, env, files
    (path → size), crash, players, lifetime (virtual seconds until it ends by itself)."""
    unknown = sorted(set(body) - {*_SEED_CREATE_FIELDS, *_SEED_EXTRA_FIELDS})
    problems = [Violation(k, "is not a known field") for k in unknown]
    create_body = {k: body[k] for k in _SEED_CREATE_FIELDS if k in body}
    create_body.setdefault("image", "demo-game")
    create_body.setdefault("location", "eu-west-1")
    if body.get("tag") is not None:
        create_body["version"] = body["tag"]
    req: CreateRequest | None = None
    try:
        req = validate_create(create_body)
    except InvalidBody as err:
        problems.extend(err.violations)
    files: dict[str, int] = {}
    raw_files = body.get("files") or {}
    if isinstance(raw_files, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in raw_files.values()):
        files = {str(k): int(v) for k, v in raw_files.items()}
    else:
        problems.append(Violation("files", "must map absolute paths to sizes in bytes"))
    players = body.get("players") or []
    if not isinstance(players, list) or not all(isinstance(p, str) for p in players):
        problems.append(Violation("players", "must be an array of strings"))
        players = []
    crash = body.get("crash", False)
    if not isinstance(crash, bool):
        problems.append(Violation("crash", "must be a boolean"))
        crash = False
    lifetime = body.get("lifetime")
    if lifetime is not None and (isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime <= 0):
        problems.append(Violation("lifetime", "must be a positive number of seconds"))
        lifetime = None
    try:
        session_files(files, crashed=crash)  # lays the files out once to reject bad paths/sizes now
    except ValueError as err:
        problems.append(Violation("files", str(err)))
    if problems or req is None:
        raise _bad("The seed description is invalid.", problems)
    return state.create(
        org, req, enforce_limits=False, players=[str(p) for p in players], crashes=crash,
        extra_files=files, lifetime=None if lifetime is None else float(lifetime),
    )  # fmt: skip


def _seed(ctx: Context, req: Request) -> Response:
    s = seed_session(ctx.state, req.org, _object(req))
    return Response(201, dumps({"id": s.id, "host": s.host, "status": s.status}))


def _end(ctx: Context, req: Request) -> Response:
    status = _object(req).get("status")
    if status is not None and status not in TERMINAL:
        raise _bad("status must be exited or dead.", [Violation("status", "must be exited or dead")])
    try:
        s = ctx.state.end(req.org, req.params["id"], status if isinstance(status, str) else None)
    except UnknownSessionError:
        raise HttpProblem(404, "RESOURCE_NOT_FOUND", "No active session with that id.") from None
    return Response(200, dumps({"id": s.id, "status": s.status}))


def _advance(ctx: Context, req: Request) -> Response:
    seconds = _object(req).get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise _bad("seconds must be a number >= 0.", [Violation("seconds", "must be a number >= 0")])
    return Response(200, dumps({"now": ctx.state.advance(float(seconds))}))


def _quirks(ctx: Context, req: Request) -> Response:
    try:
        ctx.state.quirks = with_flags(ctx.state.quirks, _object(req))
    except FakeConfigError as err:
        raise _bad(str(err)) from None
    return Response(200, dumps(_quirks_doc(ctx.state)))


def _quirks_doc(state: ServiceState) -> dict[str, object]:
    return asdict(state.quirks)


def _set_fault(ctx: Context, req: Request) -> Response:
    body = dict(_object(req))
    endpoint = body.pop("endpoint", None)
    try:
        if not isinstance(endpoint, str):
            raise FakeConfigError("endpoint is required, e.g. 'GET /session' or '*'")
        ctx.state.faults.set(check_endpoint(endpoint), fault_from_mapping(body))
    except FakeConfigError as err:
        raise _bad(str(err)) from None
    return Response(200, dumps(ctx.state.faults.snapshot()))


def _clear_faults(ctx: Context, req: Request) -> Response:
    ctx.state.faults.clear(req.arg("endpoint"))
    return Response(200, dumps(ctx.state.faults.snapshot()))


def _traffic(ctx: Context, req: Request) -> Response:
    body = dict(_object(req))
    action = body.pop("action", "start")
    if action == "stop":
        ctx.traffic.stop(req.org)
    elif action == "start":
        try:
            settings = TrafficSettings(**body)  # type: ignore[arg-type]
        except TypeError as err:
            raise _bad(f"Unknown or missing traffic option: {err}") from None
        except FakeConfigError as err:
            raise _bad(str(err)) from None
        ctx.traffic.start(req.org, settings)
    else:
        raise _bad("action must be start or stop.", [Violation("action", "must be start or stop")])
    return Response(200, dumps({"traffic": ctx.traffic.snapshot(req.org)}))


def _add_list_entries(ctx: Context, req: Request) -> Response:
    """`{"entries": [...]}`: raw JSON values appended as they are to every GET /session body."""
    entries = _object(req).get("entries")
    if not isinstance(entries, list):
        raise _bad("entries must be an array.", [Violation("entries", "must be an array of JSON values")])
    with ctx.state.lock:
        req.org.injected_list_entries.extend(entries)
        count = len(req.org.injected_list_entries)
    return Response(200, dumps({"injected": count}))


def _clear_list_entries(ctx: Context, req: Request) -> Response:
    with ctx.state.lock:
        req.org.injected_list_entries.clear()
    return Response(200, dumps({"injected": 0}))


def _state(ctx: Context, req: Request) -> Response:
    state = ctx.state
    with state.lock:
        now = state.refresh()
        sessions = [
            {
                "id": s.id, "status": s.status, "location": s.location, "created": s.created,
                "terminated_at": s.terminated_at, "ends_at": s.ends_at, "players": list(s.players),
                "traffic": s.traffic,
            }
            for s in req.org.sessions.values()
        ]  # fmt: skip
        doc = {
            "now": now,
            "time_scale": state.clock.time_scale,
            "retention": state.retention,
            "requests": dict(state.requests),
            "quirks": _quirks_doc(state),
            "faults": state.faults.snapshot(),
            "faults_fired": state.faults.fired(),
            "traffic": ctx.traffic.snapshot(req.org),
            "sessions": sessions,
        }
    return Response(200, dumps(doc))


HANDLERS: dict[str, Callable[[Context, Request], Response]] = {
    ep.C_SEED: _seed,
    ep.C_END: _end,
    ep.C_ADVANCE: _advance,
    ep.C_QUIRKS: _quirks,
    ep.C_FAULTS_SET: _set_fault,
    ep.C_FAULTS_CLEAR: _clear_faults,
    ep.C_TRAFFIC: _traffic,
    ep.C_STATE: _state,
    ep.C_LIST_ENTRIES_ADD: _add_list_entries,
    ep.C_LIST_ENTRIES_CLEAR: _clear_list_entries,
}
