"""HTTP client of the session hosting API: one method per endpoint, typed errors, one retry layer."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import httpx

from archiver import __version__
from archiver.config.credentials import Token
from archiver.errors import (
    ApiDecodeError,
    ApiError,
    ApiTransportError,
    NotFoundError,
    PayloadError,
    Violation,
    status_error_class,
    upstream_excerpt,
)
from archiver.retry import UPSTREAM_REQUEST, RetryObserver, RetryPolicy, call
from archiver.upstream import models, responses
from archiver.upstream.checks import decode_json
from archiver.upstream.listparser import SessionListParser, WholeBodyNeeded
from archiver.upstream.models import Session
from archiver.upstream.responses import CreatedSession, Location, PlayersResult
from archiver.upstream.sessionlist import scan_ended

# The wire-level pieces (auth, streamed bodies, header helpers) live in transport.py.
from archiver.upstream.transport import (
    BearerAuth,
    Download,
    RequestObserver,
    describe_transport_error,
    quote_segment,
    request_path,
    retry_after_seconds,
    sendable,
    sendable_path,
)

#: How much of an error body is read (error pages are small; a misbehaving proxy must not stall us).
_ERROR_BODY_LIMIT = 64 * 1024

T = TypeVar("T")

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=5.0)


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """The list filters of the OpenAPI file; `labels` become `filter[key]=value` (exact, ANDed)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    location: str | None = None
    image: str | None = None
    tag: str | None = None
    host: str | None = None
    player_count_lt: int | None = None
    player_count_gt: int | None = None
    all: bool = False

    def params(self) -> list[tuple[str, str]]:
        params = [(f"filter[{key}]", value) for key, value in sorted(self.labels.items())]
        for name, value in (
            ("location", self.location),
            ("image", self.image),
            ("tag", self.tag),
            ("host", self.host),
        ):
            if value is not None:
                params.append((name, value))
        if self.player_count_lt is not None:
            params.append(("playerCount[lt]", str(self.player_count_lt)))
        if self.player_count_gt is not None:
            params.append(("playerCount[gt]", str(self.player_count_gt)))
        if self.all:
            params.append(("all", "true"))
        return params


class SessionHostClient:
    """The session hosting API over an injected httpx.Client (base URL and transport are the caller's)."""

    def __init__(
        self,
        http: httpx.Client,
        token: Token,
        *,
        policy: RetryPolicy | None = None,
        observer: RequestObserver | None = None,
        retry_observer: RetryObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._http = http
        self._auth = BearerAuth(token)
        self._policy = policy or UPSTREAM_REQUEST
        self._observer = observer
        self._retry_observer = retry_observer
        self._clock = clock
        self._sleep = sleep
        #: Retries made per endpoint since start (for tests and debugging; approximate under threads).
        self.retries: Counter[str] = Counter()

    @classmethod
    def connect(
        cls,
        base_url: str,
        token: Token,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        max_connections: int = 16,
        **kwargs: Any,
    ) -> SessionHostClient:
        http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": f"session-archiver/{__version__}"},
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        return cls(http, token, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SessionHostClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- sessions ---------------------------------------------------------------------------

    def create_session(
        self,
        location: str,
        image: str,
        *,
        session_id: str | None = None,
        version: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        restart: bool | None = None,
        ttl: str | None = None,
    ) -> CreatedSession:
        body: dict[str, Any] = {"location": location, "image": image}
        optional: dict[str, Any] = {
            "id": session_id,
            "version": version,
            "env": dict(env) if env is not None else None,
            "args": list(args) if args is not None else None,
            "labels": dict(labels) if labels is not None else None,
            "restart": restart,
            "ttl": ttl,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        # Not retried on 5xx: a create whose answer was lost may have started a session; the
        # caller decides (a retry with the same id answers 409, which is then unambiguous).
        payload = self._json("POST", "/session", "POST /session", json_body=body, retry=session_id is not None)
        return self._parse(lambda p: responses.parse_created(p, session_id), payload, "POST", "/session")

    def list_sessions(
        self,
        filters: SessionFilter | None = None,
        *,
        policy: RetryPolicy | None = None,
        parser: SessionListParser | None = None,
    ) -> models.SessionList:
        """`GET /session`: the sessions, and the entries left out because a value failed a range
        check (`.invalid`). Pass the same `parser` on every poll to reuse the Session objects of
        unchanged entries (the poller does); without one, each call parses from scratch. Only a bad
        body (not JSON, no `sessions` array) is an ApiDecodeError."""
        params = filters.params() if filters else []
        parser = SessionListParser() if parser is None else parser
        # Parsed as it arrives, a window at a time: a 100,000-session list is 64 MB that is never
        # held whole. A body in an odd shape is parsed whole, the reference path (fetched again only
        # when the oddity showed after a window had been parsed and dropped: rare, and never a loss).
        try:
            return self._read_streamed("GET", "/session", "GET /session", params, policy, parser.parse_stream)
        except WholeBodyNeeded as odd:
            whole = odd.body
        body = (
            whole
            if whole is not None
            else self._read_streamed("GET", "/session", "GET /session", params, policy, _gather)
        )
        try:
            return parser.parse(body)
        except PayloadError as exc:
            raise ApiDecodeError(f"GET /session: {exc}", body=body, method="GET", path="/session") from None

    def list_ended_sessions(self, *, policy: RetryPolicy | None = None) -> list[models.EndedEntry]:
        """`GET /session?all=true`, reduced to the entries whose status is terminal, unparsed
        (`models.parse_ended` parses one); see `sessionlist.scan_ended` for why."""
        params = SessionFilter(all=True).params()
        body = self._read_streamed("GET", "/session", "GET /session", params, policy, _gather)
        try:
            return scan_ended(body)
        except PayloadError as exc:
            raise ApiDecodeError(f"GET /session: {exc}", body=body, method="GET", path="/session") from None

    def describe_session(self, session_id: str, *, policy: RetryPolicy | None = None) -> Session:
        path = f"/session/{quote_segment(session_id)}"
        payload = self._json("GET", path, "GET /session/{id}", policy=policy)
        return self._parse(models.parse_session, payload, "GET", path)

    def stop_session(self, session_id: str) -> None:
        path = f"/session/{quote_segment(session_id)}"
        # 204 per the OpenAPI, 200 per the spec: any 2xx is success, the body is ignored.
        self._request("DELETE", path, "DELETE /session/{id}").close()

    def join_players(self, session_id: str, players: Sequence[str]) -> PlayersResult:
        body = {"session": sendable(session_id), "players": list(players)}
        payload = self._json("PUT", "/session/player/join", "PUT /session/player/join", json_body=body)
        return self._parse(responses.parse_players_result, payload, "PUT", "/session/player/join")

    def leave_players(self, session_id: str, players: Sequence[str]) -> PlayersResult:
        body = {"session": sendable(session_id), "players": list(players)}
        path = "/session/player/leave"
        payload = self._json("DELETE", path, "DELETE /session/player/leave", json_body=body)
        return self._parse(responses.parse_players_result, payload, "DELETE", path)

    # --- catalogue --------------------------------------------------------------------------

    def available_locations(self, image: str) -> list[Location]:
        path = f"/available-location/{quote_segment(image)}"
        payload = self._json("GET", path, "GET /available-location/{image}")
        return self._parse(responses.parse_locations, payload, "GET", path)

    def tag_exists(self, region: str, image: str, version: str) -> bool:
        """Whether the tag exists; the real service often answers an absent tag with 404, not false."""
        path = "/tag/" + "/".join(quote_segment(p) for p in (region, image, version))
        try:
            payload = self._json("GET", path, "GET /tag/{region}/{image}/{version}")
        except NotFoundError:
            return False
        return self._parse(responses.parse_tag_exists, payload, "GET", path)

    # --- bodies (streamed) ------------------------------------------------------------------

    def metrics_text(self, *, policy: RetryPolicy | None = None) -> str:
        response = self._request("GET", "/metrics", "GET /metrics", policy=policy, accept="text/plain")
        return response.text

    def open_artifact(self, session_id: str, path: str, *, policy: RetryPolicy | None = None) -> Download:
        """`GET /artifacts`: a .tar.gz of `path`, streamed (gzip even when labelled application/x-tar)."""
        params = [("session", sendable(session_id)), ("path", sendable_path(path))]
        return self._stream("GET", "/artifacts", "GET /artifacts", params=params, policy=policy, accept="*/*")

    def open_query_log(self, session_id: str, *, policy: RetryPolicy | None = None) -> Download:
        """`GET /query/log`: every log line so far, then close; the body shape is not specified."""
        params = [("matchKey", sendable(session_id))]
        return self._stream("GET", "/query/log", "GET /query/log", params=params, policy=policy, accept="*/*")

    def open_logs(
        self,
        session_id: str,
        *,
        follow: bool = False,
        json_lines: bool = False,
        policy: RetryPolicy | None = None,
    ) -> Download:
        """`GET /logs`: plain text, or NDJSON `{streamType, line}` entries when `json_lines`."""
        params = [("id", sendable(session_id)), ("follow", "true" if follow else "false")]
        accept = "application/json" if json_lines else "text/plain"
        return self._stream("GET", "/logs", "GET /logs", params=params, policy=policy, accept=accept)

    # --- plumbing ---------------------------------------------------------------------------

    def _parse(self, parser: Callable[[Any], T], payload: Any, method: str, path: str) -> T:
        try:
            return parser(payload)
        except PayloadError as exc:
            raise ApiDecodeError(
                f"{method} {path}: {exc}", body=json.dumps(payload), method=method, path=path
            ) from None

    def _json(
        self,
        method: str,
        path: str,
        endpoint: str,
        *,
        params: Sequence[tuple[str, str]] = (),
        json_body: Any = None,
        policy: RetryPolicy | None = None,
        retry: bool = True,
    ) -> Any:
        timeout = (policy or self._policy).attempt_timeout

        def attempt() -> Any:
            response = self._send(
                method,
                path,
                endpoint,
                params,
                json_body,
                accept="application/json",
                stream=False,
                timeout=timeout,
            )
            try:
                return decode_json(response.content)
            except PayloadError as exc:
                raise ApiDecodeError(
                    f"{method} {path}: {exc}", body=response.content, method=method, path=path
                ) from None

        return self._retrying(attempt, endpoint, policy, retry)

    def _read_streamed(
        self,
        method: str,
        path: str,
        endpoint: str,
        params: Sequence[tuple[str, str]],
        policy: RetryPolicy | None,
        consume: Callable[[Iterator[bytes]], T],
    ) -> T:
        """`consume` of a body's chunks as they arrive; a broken body is retried from the start. A
        large body is read past httpx's HTTP/1.1 parser (`Download.iter_direct`)."""
        timeout = (policy or self._policy).attempt_timeout

        def attempt() -> T:
            response = self._send(
                method, path, endpoint, params, None, accept="application/json", stream=True, timeout=timeout
            )
            with Download(response) as download:
                return consume(download.iter_direct())

        return self._retrying(attempt, endpoint, policy, True)

    def _request(
        self,
        method: str,
        path: str,
        endpoint: str,
        *,
        params: Sequence[tuple[str, str]] = (),
        policy: RetryPolicy | None = None,
        accept: str = "application/json",
    ) -> httpx.Response:
        timeout = (policy or self._policy).attempt_timeout
        return self._retrying(
            lambda: self._send(method, path, endpoint, params, None, accept=accept, stream=False, timeout=timeout),
            endpoint,
            policy,
            True,
        )

    def _stream(
        self,
        method: str,
        path: str,
        endpoint: str,
        *,
        params: Sequence[tuple[str, str]],
        policy: RetryPolicy | None,
        accept: str,
    ) -> Download:
        def attempt() -> Download:
            return Download(self._send(method, path, endpoint, params, None, accept=accept, stream=True))

        return self._retrying(attempt, endpoint, policy, True)

    def _retrying(self, attempt: Callable[[], T], endpoint: str, policy: RetryPolicy | None, retry: bool) -> T:
        effective = policy or self._policy
        if not retry:
            effective = effective.single_attempt()

        def on_retry(exc: BaseException, wait: float) -> None:
            self.retries[endpoint] += 1

        return call(
            attempt,
            effective,
            clock=self._clock,
            sleep=self._sleep,
            on_retry=on_retry,
            observer=self._retry_observer,
        )

    def _send(
        self,
        method: str,
        path: str,
        endpoint: str,
        params: Sequence[tuple[str, str]],
        json_body: Any,
        *,
        accept: str,
        stream: bool,
        timeout: float | None = None,
    ) -> httpx.Response:
        request = self._http.build_request(
            method,
            path,
            params=list(params) or None,
            json=json_body,
            headers={"Accept": accept},
            timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        started = time.perf_counter()
        code = "error"
        try:
            response = self._http.send(request, auth=self._auth, stream=True)
            code = str(response.status_code)
            if response.status_code >= 300:
                self._raise_for_status(response)
            if not stream:
                try:
                    response.read()
                finally:
                    response.close()
            return response
        except httpx.TransportError as exc:
            code = "error"
            raise ApiTransportError(
                f"{method} {request_path(request)} failed: {describe_transport_error(exc)}",
                method=method,
                path=request_path(request),
            ) from None
        finally:
            if self._observer is not None:
                self._observer(endpoint, code, time.perf_counter() - started)

    @staticmethod
    def _raise_for_status(response: httpx.Response) -> None:
        request = response.request
        body = b""
        try:
            if response.is_stream_consumed:  # an event hook already read it
                body = response.content[:_ERROR_BODY_LIMIT]
            else:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) >= _ERROR_BODY_LIMIT:
                        break
        except (httpx.TransportError, httpx.DecodingError):
            pass  # the status alone is enough to act on
        finally:
            response.close()
        info = responses.parse_error_body(body)
        status = response.status_code
        raise status_error_class(status)(
            status,
            code=info.code,
            message=info.message,
            details=info.details,
            identifier=info.identifier,
            violations=[Violation(f, d) for f, d in info.violations],
            body_excerpt="" if info.message else upstream_excerpt(body),
            retry_after=retry_after_seconds(response.headers.get("retry-after")),
            method=request.method,
            path=request_path(request),
        )


def _gather(chunks: Iterator[bytes]) -> bytearray:
    """A whole body in one growing buffer (`_read_streamed`'s consumer). httpx's `read()` joins a
    list of chunks, holding a large body twice at its peak."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
    return buffer


__all__ = [
    "ApiError",
    "Download",
    "RequestObserver",
    "SessionFilter",
    "SessionHostClient",
    "Token",
]
