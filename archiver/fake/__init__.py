"""The fake session hosting service: a stateful, real HTTP upstream for tests, the demo and CI.

Start one with ``with FakeService(["token"]) as svc: ...`` and point a client at ``svc.base_url``;
the methods below seed sessions, move the clock and switch quirks and faults, and the same is
reachable over HTTP under ``/_fake/`` (see ``archiver.fake.control``).
"""

from __future__ import annotations

import dataclasses
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType

from archiver.fake.catalogue import Catalogue, ImageSpec, PortSpec, default_catalogue
from archiver.fake.clock import FakeClock
from archiver.fake.control import seed_session
from archiver.fake.errors import (
    FakeConfigError,
    FakeServiceError,
    HttpProblem,
    UnknownSessionError,
    UnknownTokenError,
)
from archiver.fake.faults import FAULT_KINDS, FaultSpec, parse_fault_spec
from archiver.fake.logs import DEFAULT_BODY_LINES, LogLine
from archiver.fake.oracle import Ended, Oracle, Served
from archiver.fake.quirks import QUIRK_NAMES, Quirks, parse_quirk, with_flags
from archiver.fake.routes import Context
from archiver.fake.server import FakeHTTPServer
from archiver.fake.state import ServiceState, Session
from archiver.fake.tarstream import artifact_stream
from archiver.fake.traffic import TrafficGenerator, TrafficSettings

__all__ = [
    "FAULT_KINDS",
    "QUIRK_NAMES",
    "Catalogue",
    "Ended",
    "FakeClock",
    "FakeConfigError",
    "FakeService",
    "FakeServiceError",
    "FaultSpec",
    "ImageSpec",
    "Oracle",
    "PortSpec",
    "Quirks",
    "Served",
    "TrafficSettings",
    "UnknownSessionError",
    "UnknownTokenError",
    "default_catalogue",
    "parse_fault_spec",
    "parse_quirk",
]

DEFAULT_RETENTION = 4 * 3600.0


class FakeService:
    """The fake hosting service on a real socket. Each token is its own organisation.

    ``retention`` is in virtual seconds; ``capacity`` caps active sessions per location and
    ``start_rate_per_min`` caps starts per organisation per virtual minute (420 beyond either;
    both unlimited by default); ``log_lines`` is the number of match lines a session writes.
    """

    def __init__(
        self,
        tokens: Sequence[str] = ("test-token",),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: FakeClock | None = None,
        retention: float = DEFAULT_RETENTION,
        catalogue: Catalogue | None = None,
        capacity: Mapping[str, int] | None = None,
        start_rate_per_min: int | None = None,
        log_lines: int = DEFAULT_BODY_LINES,
        quirks: Mapping[str, bool | str] | None = None,
        seed: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        tokens = list(dict.fromkeys(tokens))
        if not tokens or not all(isinstance(t, str) and t and t.strip() == t and " " not in t for t in tokens):
            raise FakeConfigError("give at least one token; tokens are non-empty and contain no spaces")
        if retention < 0 or log_lines < 0:
            raise FakeConfigError("retention and log_lines must be >= 0")
        catalogue = catalogue or default_catalogue()
        if capacity is not None:
            catalogue = dataclasses.replace(catalogue, capacity=dict(capacity))
        self.clock = clock or FakeClock()
        self.state = ServiceState(
            tokens, clock=self.clock, catalogue=catalogue, retention=retention, seed=seed,
            start_rate_per_min=start_rate_per_min, log_body_lines=log_lines,
        )  # fmt: skip
        if quirks:
            self.state.quirks = with_flags(self.state.quirks, quirks)
        self._address = (host, port)
        self._tls = tls
        self._stopping = threading.Event()
        self.traffic = TrafficGenerator(self.state, self._stopping, seed=seed)
        self._server: FakeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeService:
        """Bind and serve in a background thread; returns self."""
        if self._server is not None:
            raise FakeServiceError("the fake service is already started")
        self._server = FakeHTTPServer(self._address, Context(self.state, self.traffic, self._stopping), tls=self._tls)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-service",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: end streams and open connections, join every thread, close the socket."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._stopping.set()
        with self.state.changed:
            self.state.changed.notify_all()
        server.shutdown()
        thread.join(timeout)
        server.close_all(timeout)
        server.server_close()
        self.traffic.join(timeout)
        self._server = self._thread = None

    def __enter__(self) -> FakeService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the running service (``https://`` when it serves TLS)."""
        if self._server is None:
            raise FakeServiceError("the fake service is not started")
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self._tls is not None else 'http'}://{shown}:{port}"

    # --- sessions -----------------------------------------------------------------------------

    def add_session(
        self,
        token: str,
        *,
        id: str | None = None,
        image: str = "demo-game",
        location: str = "eu-west-1",
        tag: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        players: Sequence[str] = (),
        crashed: bool = False,
        files: Mapping[str, int] | None = None,
        lifetime: float | None = None,
    ) -> str:
        """Seed an active session for ``token``'s organisation (no capacity or rate limits);
        returns its id. ``crashed``: it ends ``dead`` (with a crash core) instead of ``exited``;
        ``files``: extra files or sizes (path → bytes); ``lifetime``: virtual seconds until it
        ends by itself. Raises FakeConfigError for a bad description."""
        body: dict[str, object] = {
            "image": image, "location": location, "labels": dict(labels or {}), "env": dict(env or {}),
            "players": list(players), "crash": crashed, "files": dict(files or {}),
        }  # fmt: skip
        for name, value in (("id", id), ("tag", tag), ("lifetime", lifetime)):
            if value is not None:
                body[name] = value
        try:
            return seed_session(self.state, self.state.org(token), body).id
        except HttpProblem as problem:
            detail = "; ".join(f"{v.field}: {v.description}" for v in problem.violations) or problem.message
            raise FakeConfigError(f"cannot seed the session: {detail}") from None

    def rotate_token(self, old: str, new: str) -> None:
        """Rotate an organisation's token: `new` works from the next request on, `old` is refused
        with 401 (as when a Kubernetes Secret is rotated upstream first)."""
        self.state.rotate_token(old, new)

    def end_session(self, token: str, session_id: str, status: str | None = None) -> None:
        """End an active session as if its container exited (``exited``) or crashed (``dead``);
        by default as the session was seeded (``crashed``). UnknownSessionError otherwise."""
        self.state.end(self.state.org(token), session_id, status)

    def session(self, token: str, session_id: str) -> Session:
        """The live session object (active or terminated); UnknownSessionError once removed."""
        s = self.state.get(self.state.org(token), session_id)
        if s is None:
            raise UnknownSessionError(f"no session {session_id!r} in this organisation")
        return s

    def hide_from_list(self, token: str, session_id: str, polls: int = 1) -> None:
        """Leave an active session out of the next ``polls`` plain ``GET /session`` answers (a
        flapping upstream); ``all=true`` lists and describes still show it."""
        org = self.state.org(token)
        with self.state.lock:
            self.state.list_omissions[(org.name, session_id)] += polls

    def inject_list_entries(self, token: str, entries: Sequence[object]) -> None:
        """Append raw JSON values to every ``GET /session`` body of ``token``'s organisation, as
        they are (poisoned entries: ``{"id": "x", "playerCount": 1e30}``); see clear_list_entries."""
        with self.state.lock:
            self.state.org(token).injected_list_entries.extend(entries)

    def clear_list_entries(self, token: str) -> None:
        """Remove every injected list entry of ``token``'s organisation."""
        with self.state.lock:
            self.state.org(token).injected_list_entries.clear()

    def advance(self, seconds: float) -> float:
        """Move the clock forward and apply the transitions that became due; returns virtual now."""
        return self.state.advance(seconds)

    # --- switches -----------------------------------------------------------------------------

    def set_quirks(self, **flags: bool | str) -> None:
        """Turn quirks on or off by name (see ``Quirks``); FakeConfigError for unknown names."""
        self.state.quirks = with_flags(self.state.quirks, flags)

    def set_fault(
        self,
        endpoint: str,
        *,
        status: int | None = None,
        rate: float = 0.0,
        count: int | None = None,
        retry_after: float | None = None,
        latency: float = 0.0,
        kind: str = "status",
        interval: float = 0.05,
        after: int | None = None,
        per_session: int | None = None,
        follow_only: bool = False,
    ) -> None:
        """Install a fault for an endpoint key (e.g. ``"GET /session"``) or ``"*"``; see FaultSpec."""
        spec = FaultSpec(
            kind=kind, status=status, rate=rate, count=count, retry_after=retry_after, latency=latency,
            interval=interval, after=after, per_session=per_session, follow_only=follow_only,
        )  # fmt: skip
        self.state.faults.set(endpoint, spec)

    def set_list_rate_limit(self, per_minute: int | None) -> None:
        """Answer 429 to an organisation's `GET /session` beyond `per_minute` lists per virtual
        minute (None: unlimited), as a rate-limited service does."""
        if per_minute is not None and per_minute < 1:
            raise FakeConfigError(f"the list rate limit must be at least 1 per minute, got {per_minute}")
        self.state.list_rate_per_min = per_minute

    def clear_faults(self, endpoint: str | None = None) -> None:
        """Remove one endpoint's fault, or all."""
        self.state.faults.clear(endpoint)

    def faults_fired(self, endpoint: str | None = None) -> dict[str, int]:
        """How many requests each kind of fault hit so far, on one endpoint key (e.g. ``"GET
        /session"``) or on all: by status ("503"), "latency" (a delay alone), or kind ("truncate",
        "reset", "drip", ...)."""
        return self.state.faults.fired(endpoint)

    @property
    def oracle(self) -> Oracle:
        """The ground truth recorded as it happened: every session ended, and sha256 and size of
        every log and artifact body served (complete or cut short)."""
        return self.state.oracle

    def request_count(self, endpoint: str) -> int:
        """How many requests an endpoint key received (faulted ones included)."""
        with self.state.lock:
            return self.state.requests[endpoint]

    # --- ground truth -------------------------------------------------------------------------

    def artifact_bytes(self, token: str, session_id: str, path: str) -> Iterator[bytes]:
        """The exact bytes ``GET /artifacts`` serves for this session and path (whatever the
        session's state); UnknownSessionError if the session or the path does not exist."""
        s = self.session(token, session_id)
        with self.state.lock:
            files = s.files()
        body = artifact_stream(session_id, files, path)
        if body is None:
            raise UnknownSessionError(f"no file or folder at {path!r} in session {session_id!r}")
        return body

    def log_lines(self, token: str, session_id: str) -> list[LogLine]:
        """``(streamType, line)`` of everything the session wrote so far (1 stdout, 2 stderr)."""
        s = self.session(token, session_id)
        with self.state.lock:
            return s.log(self.clock.now())

    # --- traffic ------------------------------------------------------------------------------

    def start_traffic(
        self,
        token: str,
        *,
        rate_per_min: float,
        min_duration: float = 60.0,
        max_duration: float = 600.0,
        crash_ratio: float = 0.1,
        max_active: int | None = None,
        image: str = "demo-game",
    ) -> None:
        """Start sessions for ``token`` at ``rate_per_min`` (virtual minutes), each ending after a
        uniform random lifetime in [min_duration, max_duration] virtual seconds, ``crash_ratio``
        of them as ``dead``; players join while they run."""
        settings = TrafficSettings(
            rate_per_min=rate_per_min, min_duration=min_duration, max_duration=max_duration,
            crash_ratio=crash_ratio, max_active=max_active, image=image,
        )  # fmt: skip
        self.traffic.start(self.state.org(token), settings)

    def stop_traffic(self, token: str) -> None:
        """Stop starting sessions for ``token``."""
        self.traffic.stop(self.state.org(token))
