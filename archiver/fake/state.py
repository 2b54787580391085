"""The fake service's state: organisations, sessions and their lifecycle, applied lazily against the clock."""

from __future__ import annotations

import heapq
import itertools
import threading
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from archiver.fake.catalogue import Catalogue, PortSpec
from archiver.fake.clock import FakeClock
from archiver.fake.content import FileSpec, seed_for, session_files
from archiver.fake.errors import FakeConfigError, HttpProblem, UnknownSessionError, UnknownTokenError
from archiver.fake.faults import FaultTable
from archiver.fake.logs import BOOT_LINES, DEFAULT_BODY_LINES, LINE_INTERVAL, LogLine, session_log
from archiver.fake.oracle import Oracle
from archiver.fake.quirks import Quirks
from archiver.fake.validation import CreateRequest

RUNNING = "running"
EXITED = "exited"
DEAD = "dead"
TERMINAL = (EXITED, DEAD)

PORT_MIN, PORT_MAX = 20000, 30000

NOT_FOUND = "RESOURCE_NOT_FOUND"
SESSION_GONE_DETAILS = (
    "It is possible that either the session has never existed at all "
    "or the container's lifespan on the machine has expired."
)


@dataclass(eq=False)
class Session:
    """One session of one organisation; mutated only under the state lock."""

    org: str
    id: str
    image: str
    tag: str
    location: str
    host: str
    ports: tuple[tuple[PortSpec, int], ...]
    created: float  # virtual epoch seconds
    env: dict[str, str]
    labels: dict[str, str]
    args: list[str]
    restart: bool
    players: list[str]
    crashes: bool
    extra_files: dict[str, int]
    log_body_lines: int
    ends_at: float | None = None
    status: str = RUNNING
    terminated_at: float | None = None
    traffic: bool = False

    @property
    def active(self) -> bool:
        return self.status == RUNNING

    def files(self) -> dict[str, FileSpec]:
        """The container's files; the crash core exists once the session died."""
        return session_files(self.extra_files, crashed=self.status == DEAD)

    def log(self, now: float) -> list[LogLine]:
        """Everything written so far: while running, one body line per LINE_INTERVAL of uptime."""
        if self.active:
            visible = int(max(0.0, now - self.created) // LINE_INTERVAL)
            return session_log(self.id, body_lines=self.log_body_lines, visible=visible, ending=None)
        return session_log(self.id, body_lines=self.log_body_lines, visible=None, ending=self.status)

    def line_count(self, now: float) -> int:
        """``len(self.log(now))`` of a running session, without building its lines."""
        visible = int(max(0.0, now - self.created) // LINE_INTERVAL)
        return BOOT_LINES + max(0, min(visible, self.log_body_lines))

    def container_env(self) -> dict[str, str]:
        """The caller's env plus what the service sets (secret values: never log this)."""
        return {**self.env, "GAMEYE_SESSION_ID": self.id, "GAMEYE_HOST": self.host}


@dataclass
class Org:
    """One token's organisation."""

    name: str
    sessions: dict[str, Session] = field(default_factory=dict)
    #: Raw JSON values appended to every GET /session body (POST /_fake/list-entries): poisoned
    #: entries no real session produces, for testing the client's quarantine.
    injected_list_entries: list[object] = field(default_factory=list)
    started_total: int = 0
    recent_starts: deque[float] = field(default_factory=deque)
    #: When the last `GET /session` lists were answered (virtual), for `list_rate_per_min`.
    recent_lists: deque[float] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class ListFilter:
    """The GET /session query: all given conditions must hold."""

    labels: Mapping[str, str] = field(default_factory=dict)
    location: str | None = None
    image: str | None = None
    tag: str | None = None
    host: str | None = None
    players_lt: int | None = None
    players_gt: int | None = None
    include_terminated: bool = False

    def matches(self, s: Session) -> bool:
        if not (s.active or self.include_terminated):
            return False
        for want, have in (
            (self.location, s.location),
            (self.image, s.image),
            (self.tag, s.tag),
            (self.host, s.host),
        ):
            if want is not None and want != have:
                return False
        n = len(s.players)
        if (self.players_lt is not None and not n < self.players_lt) or (
            self.players_gt is not None and not n > self.players_gt
        ):
            return False
        return all(s.labels.get(k) == v for k, v in self.labels.items())


class ServiceState:
    """All sessions of all organisations. Every public method takes the lock and first applies
    the transitions that are due (ttl ends, removals after retention), so a test that advances
    the clock sees the consequence on its very next request."""

    def __init__(
        self,
        tokens: Iterable[str],
        *,
        clock: FakeClock,
        catalogue: Catalogue,
        retention: float,
        seed: int = 0,
        start_rate_per_min: int | None = None,
        log_body_lines: int = DEFAULT_BODY_LINES,
    ) -> None:
        self.lock = threading.RLock()
        #: Notified on every state change (session end, clock jump), for followers of /logs.
        self.changed = threading.Condition(self.lock)
        self.clock = clock
        self.catalogue = catalogue
        self.retention = retention
        self.start_rate_per_min = start_rate_per_min
        #: The service's rate limit on `GET /session` per organisation and virtual minute (429
        #: beyond it); None: unlimited. Every archiver pod polls the list: see README, Scaling.
        self.list_rate_per_min: int | None = None
        self.log_body_lines = log_body_lines
        self.quirks = Quirks()
        self.faults = FaultTable(seed)
        #: Every end and every log/artifact body served, for chaos runs to check archives against.
        self.oracle = Oracle()
        self.requests: Counter[str] = Counter()
        #: (organisation, session id) → plain lists still to omit it from (a flapping upstream).
        self.list_omissions: Counter[tuple[str, str]] = Counter()
        self._orgs: dict[str, Org] = {t: Org(f"org-{i}") for i, t in enumerate(tokens, 1)}
        self._by_name = {o.name: o for o in self._orgs.values()}
        # Indexes kept in step with session status, so a create costs O(1) even with 50k sessions.
        self._active_by_location: Counter[str] = Counter()
        self._ports_in_use: dict[str, set[int]] = {}
        self._deadlines: list[tuple[float, int, Session]] = []
        self._seq = itertools.count()

    # --- organisations -------------------------------------------------------------------------

    def org_for(self, token: str | None) -> Org | None:
        """The organisation of a bearer token, or None."""
        return None if token is None else self._orgs.get(token)

    def org(self, token: str) -> Org:
        """Like org_for, for the Python API: an unknown token raises UnknownTokenError."""
        org = self._orgs.get(token)
        if org is None:
            raise UnknownTokenError("the token is not one of this fake service's organisations")
        return org

    def rotate_token(self, old: str, new: str) -> None:
        """The organisation of `old` answers to `new` from now on; `old` gets 401 (a revoked token)."""
        with self.lock:
            org = self.org(old)
            if not new or new.strip() != new or " " in new or new in self._orgs:
                raise FakeConfigError("the new token must be non-empty, without spaces, and not in use")
            del self._orgs[old]
            self._orgs[new] = org

    def orgs_by_name(self) -> Mapping[str, Org]:
        return self._by_name

    # --- lifecycle -----------------------------------------------------------------------------

    def refresh(self) -> float:
        """Apply every due transition; returns the current virtual time. Call with the lock held."""
        now = self.clock.now()
        while self._deadlines and self._deadlines[0][0] <= now:
            when, _, s = heapq.heappop(self._deadlines)
            org = self._by_name[s.org]
            if org.sessions.get(s.id) is not s:
                continue
            if s.active and s.ends_at == when:
                self._terminate(s, DEAD if s.crashes else EXITED, when)
            elif not s.active and s.terminated_at is not None and s.terminated_at + self.retention <= when:
                del org.sessions[s.id]
                self.changed.notify_all()
        return now

    def _schedule(self, when: float, s: Session) -> None:
        heapq.heappush(self._deadlines, (when, next(self._seq), s))

    def _terminate(self, s: Session, status: str, when: float) -> None:
        self._active_by_location[s.location] -= 1
        self._ports_in_use[s.host].difference_update(hp for _, hp in s.ports)
        s.status = status
        s.terminated_at = when
        self.oracle.session_ended(s.org, s.id, s.created, when, status)
        self._schedule(when + self.retention, s)
        self.changed.notify_all()

    def advance(self, seconds: float) -> float:
        """Move the clock forward and apply what became due."""
        with self.lock:
            self.clock.advance(seconds)
            now = self.refresh()
            self.changed.notify_all()
            return now

    # --- sessions ------------------------------------------------------------------------------

    def create(
        self,
        org: Org,
        req: CreateRequest,
        *,
        enforce_limits: bool = True,
        players: Sequence[str] = (),
        crashes: bool = False,
        extra_files: Mapping[str, int] | None = None,
        lifetime: float | None = None,
        traffic: bool = False,
    ) -> Session:
        """Start a session (POST /session semantics: 404 unknown image/location/version, 409
        duplicate id, 420 no capacity or too many starts). The keyword arguments are for seeded
        sessions: initial players, whether it crashes when it ends, extra files (path → size), and
        a lifetime after which it ends by itself (virtual seconds)."""
        with self.lock:
            now = self.refresh()
            image = self.catalogue.images.get(req.image)
            if image is None:
                raise HttpProblem(404, NOT_FOUND, f"The image {req.image!r} does not exist.")
            if req.location not in self.catalogue.image_locations(req.image):
                raise HttpProblem(404, NOT_FOUND, f"The location {req.location!r} does not exist for this image.")
            tag = image.default_tag if req.version is None else req.version
            if tag not in image.tags:
                raise HttpProblem(404, NOT_FOUND, f"The version {tag!r} of image {req.image!r} is not available.")
            sid = req.id if req.id is not None else str(uuid.uuid4())
            if sid in org.sessions:
                raise HttpProblem(409, "CONFLICT", "Cannot start a session with the provided id; use a unique id.")
            if enforce_limits:
                self._check_limits(org, req.location, now)
            host = self._pick_host(sid, req.location)
            ports = tuple((p, self._pick_port(sid, host, p)) for p in image.ports)
            s = Session(
                org=org.name, id=sid, image=req.image, tag=tag, location=req.location, host=host,
                ports=ports, created=now, env=dict(req.env), labels=dict(req.labels), args=list(req.args),
                restart=req.restart, players=list(dict.fromkeys(players)), crashes=crashes,
                extra_files=dict(extra_files or {}), log_body_lines=self.log_body_lines, traffic=traffic,
            )  # fmt: skip
            lifetimes = [t for t in (lifetime, req.ttl_seconds) if t is not None]
            if lifetimes:
                s.ends_at = now + min(lifetimes)
                self._schedule(s.ends_at, s)
            org.sessions[sid] = s
            self._active_by_location[s.location] += 1
            self._ports_in_use.setdefault(host, set()).update(hp for _, hp in ports)
            org.started_total += 1
            org.recent_starts.append(now)
            return s

    def _check_limits(self, org: Org, location: str, now: float) -> None:
        cap = self.catalogue.capacity.get(location)
        if cap is not None and self.active_in(location) >= cap:
            raise HttpProblem(420, "NO_CAPACITY", "This session can currently not be started in the provided region.")
        while org.recent_starts and org.recent_starts[0] <= now - 60:
            org.recent_starts.popleft()
        if self.start_rate_per_min is not None and len(org.recent_starts) >= self.start_rate_per_min:
            raise HttpProblem(420, "TOO_MANY_STARTS", "Too many sessions were started in a short period; try later.")

    def admit_list(self, org: Org) -> None:
        """Count one `GET /session` of `org`; HttpProblem 429 when it exceeds `list_rate_per_min`."""
        if self.list_rate_per_min is None:
            return
        now = self.clock.now()
        with self.lock:
            while org.recent_lists and org.recent_lists[0] <= now - 60:
                org.recent_lists.popleft()
            if len(org.recent_lists) >= self.list_rate_per_min:
                raise HttpProblem(
                    429, "TOO_MANY_REQUESTS", "Too many requests; try again later.",
                    f"At most {self.list_rate_per_min} session lists per minute.",
                )  # fmt: skip
            org.recent_lists.append(now)

    def active_in(self, location: str) -> int:
        """Active sessions in a location, every organisation together (capacity is per location)."""
        return self._active_by_location[location]

    def _pick_host(self, sid: str, location: str) -> str:
        ips = self.catalogue.locations[location]
        return ips[seed_for(sid, "host") % len(ips)]

    def _pick_port(self, sid: str, host: str, port: PortSpec) -> int:
        used = self._ports_in_use.get(host, set())
        span = PORT_MAX - PORT_MIN + 1
        start = seed_for(sid, f"port:{port.key}") % span
        for i in range(span):
            candidate = PORT_MIN + (start + i) % span
            if candidate not in used:
                return candidate
        raise HttpProblem(420, "NO_CAPACITY", "No free port on the host.")

    def get(self, org: Org, sid: str) -> Session | None:
        """The session (active or terminated, not removed), or None."""
        with self.lock:
            self.refresh()
            return org.sessions.get(sid)

    def require(
        self, org: Org, sid: str, *, message: str = "Could not find a session with the given session id."
    ) -> Session:
        """Like get, but a missing session is a 404 problem."""
        s = self.get(org, sid)
        if s is None:
            raise HttpProblem(404, NOT_FOUND, message, SESSION_GONE_DETAILS)
        return s

    def matching(self, org: Org, flt: ListFilter) -> list[Session]:
        """Sessions matching ``flt``, oldest first."""
        with self.lock:
            self.refresh()
            found = sorted((s for s in org.sessions.values() if flt.matches(s)), key=lambda s: s.created)
            if self.list_omissions and not flt.include_terminated:
                omitted = {s.id for s in found if self.list_omissions[(org.name, s.id)] > 0}
                for sid in omitted:
                    self.list_omissions[(org.name, sid)] -= 1
                found = [s for s in found if s.id not in omitted]
            return found

    def stop(self, org: Org, sid: str) -> None:
        """DELETE semantics: 404 unknown, 409 already terminated."""
        with self.lock:
            s = self.require(org, sid)
            if not s.active:
                raise HttpProblem(409, "CONFLICT", "This session has already been terminated.")
            self._terminate(s, EXITED, self.refresh())

    def end(self, org: Org, sid: str, status: str | None = None) -> Session:
        """End as if the container exited by itself (``dead`` for a crash; default by the session's
        crash flag). UnknownSessionError if it is unknown or not active."""
        if status not in (None, *TERMINAL):
            raise ValueError(f"status must be one of {TERMINAL}, got {status!r}")
        with self.lock:
            now = self.refresh()
            s = org.sessions.get(sid)
            if s is None or not s.active:
                raise UnknownSessionError(f"no active session {sid!r} in this organisation")
            self._terminate(s, status or (DEAD if s.crashes else EXITED), now)
            return s

    def set_players(self, org: Org, sid: str | None, players: Sequence[str], *, join: bool) -> list[str]:
        """Join (idempotent) or leave players of an active session; returns the current roster."""
        with self.lock:
            s = None if sid is None else self.get(org, sid)
            if s is None or not s.active:
                raise HttpProblem(404, NOT_FOUND, "The provided session does not exist.", SESSION_GONE_DETAILS)
            if join:
                s.players.extend(p for p in dict.fromkeys(players) if p not in s.players)
            else:
                gone = set(players)
                s.players[:] = [p for p in s.players if p not in gone]
            return list(s.players)

    def count_request(self, endpoint: str) -> None:
        with self.lock:
            self.requests[endpoint] += 1
