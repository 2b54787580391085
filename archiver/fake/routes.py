"""Handlers of the interface's endpoints: a parsed request and the state in, a (streamed) response out."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.message import Message

from archiver.errors import Violation
from archiver.fake import endpoints as ep
from archiver.fake.errors import HttpProblem
from archiver.fake.logs import LogLine, render_legacy, render_ndjson, render_text
from archiver.fake.oracle import LOGS, ServedAs
from archiver.fake.state import NOT_FOUND, SESSION_GONE_DETAILS, ListFilter, Org, ServiceState
from archiver.fake.tarstream import artifact_stream
from archiver.fake.traffic import TrafficGenerator
from archiver.fake.validation import InvalidBody, validate_create, validate_players
from archiver.fake.wire import create_result, described, dumps, list_entry, metrics_text

JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

#: Real seconds a /logs follower waits for news before looking again.
FOLLOW_POLL = 0.1
#: Real seconds of silence after which the keep-alive quirk sends a blank line.
KEEPALIVE_AFTER = 1.0


@dataclass
class Request:
    """What a handler needs of an HTTP request (already authenticated: ``org`` is the caller)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Message
    body: bytes
    org: Org
    params: Mapping[str, str] = field(default_factory=dict)

    def arg(self, name: str) -> str | None:
        """First value of a query parameter, or None."""
        values = self.query.get(name)
        return values[0] if values else None

    def json_body(self) -> object:
        """The decoded JSON body; a 422 problem if it is not JSON."""
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            raise HttpProblem(
                422, "UNPROCESSABLE_ENTITY", "The request body is not valid JSON.",
                violations=[Violation("body", "must be a JSON document")],
            ) from None  # fmt: skip


@dataclass
class Response:
    """A response: bytes are sent with Content-Length, an iterator with chunked encoding."""

    status: int
    body: bytes | Iterator[bytes] = b""
    content_type: str | None = JSON
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: A session's log or artifact body: recorded in the oracle as it is served.
    served_as: ServedAs | None = None
    #: A follow stream: what the server needs to serve it on its hub instead of iterating ``body``.
    follow: FollowFrom | None = None


@dataclass(eq=False)
class FollowFrom:
    """Where a follow stream stands: its session, how lines are rendered, how many went out
    (``first``, the log so far, is the stream's first chunk)."""

    org: Org
    sid: str
    render: Callable[[list[LogLine]], bytes]
    sent: int
    first: bytes


@dataclass
class Context:
    """What handlers share: the state, the traffic generator and the server's stop signal
    (which ends long streams)."""

    state: ServiceState
    traffic: TrafficGenerator
    stopping: threading.Event


def _unprocessable(err: InvalidBody) -> HttpProblem:
    return HttpProblem(
        422, "UNPROCESSABLE_ENTITY", "The request has invalid syntax.",
        "See violations for the fields at fault.", violations=err.violations,
    )  # fmt: skip


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def _int_arg(req: Request, name: str) -> int | None:
    raw = req.arg(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise HttpProblem(
            400, "BAD_REQUEST", f"Query parameter {name} must be an integer.",
            violations=[Violation(name, "must be an integer")],
        ) from None  # fmt: skip


def create_session(ctx: Context, req: Request) -> Response:
    try:
        create = validate_create(req.json_body())
    except InvalidBody as err:
        raise _unprocessable(err) from None
    s = ctx.state.create(req.org, create)
    body = create_result(s, ctx.state.quirks, caller_chose_id=create.id is not None)
    return Response(201, dumps(body))


def list_sessions(ctx: Context, req: Request) -> Response:
    ctx.state.admit_list(req.org)
    labels = {k[len("filter[") : -1]: v[0] for k, v in req.query.items() if k.startswith("filter[") and k.endswith("]")}
    flt = ListFilter(
        labels=labels,
        location=req.arg("location"),
        image=req.arg("image"),
        tag=req.arg("tag"),
        host=req.arg("host"),
        players_lt=_int_arg(req, "playerCount[lt]"),
        players_gt=_int_arg(req, "playerCount[gt]"),
        include_terminated=_truthy(req.arg("all")),
    )
    quirks = ctx.state.quirks
    with ctx.state.lock:
        docs: list[object] = [list_entry(s, quirks) for s in ctx.state.matching(req.org, flt)]
        docs.extend(req.org.injected_list_entries)  # raw, unfiltered: they are not sessions
    return Response(200, dumps({"sessions": docs}))


def describe_session(ctx: Context, req: Request) -> Response:
    with ctx.state.lock:
        doc = described(ctx.state.require(req.org, req.params["id"]), ctx.state.quirks)
    return Response(200, dumps(doc))


def stop_session(ctx: Context, req: Request) -> Response:
    ctx.state.stop(req.org, req.params["id"])
    if ctx.state.quirks.delete_returns_200:
        return Response(200, b"", content_type=None)
    return Response(204, b"", content_type=None)


def _players(ctx: Context, req: Request, *, join: bool) -> Response:
    try:
        sid, players = validate_players(req.json_body(), session_required=join)
    except InvalidBody as err:
        raise _unprocessable(err) from None
    roster = ctx.state.set_players(req.org, sid, players, join=join)
    return Response(200, dumps({"count": len(roster), "players": roster}))


def join_players(ctx: Context, req: Request) -> Response:
    return _players(ctx, req, join=True)


def leave_players(ctx: Context, req: Request) -> Response:
    return _players(ctx, req, join=False)


def _image_or_404(ctx: Context, image: str) -> None:
    if image not in ctx.state.catalogue.images:
        raise HttpProblem(404, NOT_FOUND, "Image not found or you are not authorized to use this image.")


def available_locations(ctx: Context, req: Request) -> Response:
    image = req.params["image"]
    _image_or_404(ctx, image)
    cat = ctx.state.catalogue
    with ctx.state.lock:
        ctx.state.refresh()
        free = [
            loc for loc in cat.image_locations(image)
            if loc not in cat.capacity or ctx.state.active_in(loc) < cat.capacity[loc]
        ]  # fmt: skip
    return Response(200, dumps({"locations": [{"id": loc, "ips": list(cat.locations[loc])} for loc in free]}))


def tag_exists(ctx: Context, req: Request) -> Response:
    image = req.params["image"]
    _image_or_404(ctx, image)
    cat = ctx.state.catalogue
    known_region = req.params["region"] in cat.image_locations(image)
    exists = known_region and req.params["version"] in cat.images[image].tags
    if not exists and ctx.state.quirks.tag_absent_404:
        raise HttpProblem(404, NOT_FOUND, "Image not found or you are not authorized to use this image.")
    return Response(200, dumps({"exists": exists}))


def artifacts(ctx: Context, req: Request) -> Response:
    sid, path = req.arg("session"), req.arg("path")
    if not sid or not path:
        raise HttpProblem(
            400, "BAD_REQUEST", "The query parameters session and path are required.",
            violations=[Violation(n, "is required") for n, v in (("session", sid), ("path", path)) if not v],
        )  # fmt: skip
    with ctx.state.lock:
        s = ctx.state.require(req.org, sid)
        # The interface only documents 404 for /artifacts: a running container has nothing to
        # download yet, so an active session answers 404 with a message saying why.
        if s.active:
            raise HttpProblem(
                404, NOT_FOUND,
                "The session is still running; artifacts can be downloaded only after it has terminated.",
                SESSION_GONE_DETAILS,
            )  # fmt: skip
        files = s.files()
    body = artifact_stream(sid, files, path)
    if body is None:
        raise HttpProblem(404, NOT_FOUND, "No file or folder exists at the given path in the container.")
    content_type = "application/x-tar" if ctx.state.quirks.artifacts_content_type_tar else "application/gzip"
    return Response(200, body, content_type=content_type, served_as=ServedAs(req.org.name, sid, path))


def _session_log(ctx: Context, req: Request, sid: str) -> list[LogLine]:
    with ctx.state.lock:
        s = ctx.state.require(req.org, sid, message="That session doesn't seem to exist. Double-check the ID.")
        if ctx.state.quirks.logs_gone_at_termination and not s.active:
            # A service that drops a container's logs when it stops ("logs may or may not be
            # available after termination"); a follow stream open at that moment still ends normally.
            raise HttpProblem(404, NOT_FOUND, "No logs are available for this session.", SESSION_GONE_DETAILS)
        return s.log(ctx.state.clock.now())


def logs(ctx: Context, req: Request) -> Response:
    sid = req.arg("id") or req.arg("matchKey") or ""  # matchKey: the superseded name, still accepted
    as_json = "application/json" in (req.headers.get("Accept") or "") and not ctx.state.quirks.logs_text_only
    render: Callable[[list[LogLine]], bytes] = render_ndjson if as_json else render_text
    content_type = NDJSON if as_json else TEXT
    lines = _session_log(ctx, req, sid)
    if not _truthy(req.arg("follow")):
        return Response(200, render(lines), content_type=content_type, served_as=ServedAs(req.org.name, sid, LOGS))
    first = render(lines)
    return Response(
        200,
        _follow(ctx, req.org, sid, render, len(lines), first),
        content_type=content_type,
        follow=FollowFrom(req.org, sid, render, len(lines), first),
    )


def _follow(
    ctx: Context, org: Org, sid: str, render: Callable[[list[LogLine]], bytes], sent: int, first: bytes
) -> Iterator[bytes]:
    """Stream new lines as the session writes them; end after its last line once it terminated."""
    if first:
        yield first
    last_out = time.monotonic()
    state = ctx.state
    while not ctx.stopping.is_set():
        with state.changed:
            s = state.get(org, sid)
            if s is None:  # removed while following: nothing more will come
                return
            lines = s.log(state.clock.now())
            done = not s.active
            if len(lines) <= sent and not done:
                state.changed.wait(FOLLOW_POLL)
        if len(lines) > sent:
            yield render(lines[sent:])
            sent = len(lines)
            last_out = time.monotonic()
        elif state.quirks.logs_keepalive and time.monotonic() - last_out >= KEEPALIVE_AFTER:
            yield b"\n"
            last_out = time.monotonic()
        if done:
            return


def query_log(ctx: Context, req: Request) -> Response:
    sid = req.arg("matchKey") or req.arg("id") or ""
    lines = _session_log(ctx, req, sid)
    shape = ctx.state.quirks.query_log_shape
    served_as = ServedAs(req.org.name, sid, LOGS)
    if shape == "ndjson":
        return Response(200, render_ndjson(lines), content_type=NDJSON, served_as=served_as)
    if shape == "legacy":
        return Response(200, render_legacy(lines), content_type=JSON, served_as=served_as)
    return Response(200, render_text(lines), content_type=TEXT, served_as=served_as)


def metrics(ctx: Context, req: Request) -> Response:
    with ctx.state.lock:
        active = ctx.state.matching(req.org, ListFilter())
        players: Counter[str] = Counter()
        for s in active:
            players[s.location] += len(s.players)
        body = metrics_text(len(active), req.org.started_total, dict(players), ctx.state.quirks)
    return Response(200, body, content_type=PROMETHEUS_TEXT)


HANDLERS: dict[str, Callable[[Context, Request], Response]] = {
    ep.CREATE: create_session,
    ep.LIST: list_sessions,
    ep.DESCRIBE: describe_session,
    ep.STOP: stop_session,
    ep.JOIN: join_players,
    ep.LEAVE: leave_players,
    ep.LOCATIONS: available_locations,
    ep.TAG: tag_exists,
    ep.ARTIFACTS: artifacts,
    ep.LOGS: logs,
    ep.QUERY_LOG: query_log,
    ep.METRICS: metrics,
}
