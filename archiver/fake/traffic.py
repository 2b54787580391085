"""Traffic generator: starts sessions at a rate, lets players join, and ends them after a random lifetime."""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import asdict, dataclass

from archiver.fake.errors import FakeConfigError, HttpProblem
from archiver.fake.state import Org, ServiceState
from archiver.fake.validation import CreateRequest

log = logging.getLogger(__name__)

#: Real seconds between two passes of the generator.
TICK = 0.1
#: Most sessions started in one pass, so a big clock jump cannot stall the service.
MAX_STARTS_PER_TICK = 1000
#: Sessions given a chance to gain a player per pass (bounded work with 50k sessions).
JOIN_SAMPLE = 20
#: Average virtual seconds between two players joining a traffic session.
JOIN_EVERY = 30.0
MAX_PLAYERS = 8


@dataclass(frozen=True, slots=True)
class TrafficSettings:
    """How one organisation's traffic looks; durations are virtual seconds."""

    rate_per_min: float
    min_duration: float = 60.0
    max_duration: float = 600.0
    crash_ratio: float = 0.1
    max_active: int | None = None
    image: str = "demo-game"

    def __post_init__(self) -> None:
        if self.rate_per_min <= 0:
            raise FakeConfigError(f"traffic rate_per_min must be > 0, got {self.rate_per_min}")
        if not 0 < self.min_duration <= self.max_duration:
            raise FakeConfigError("traffic durations need 0 < min_duration <= max_duration")
        if not 0.0 <= self.crash_ratio <= 1.0:
            raise FakeConfigError(f"traffic crash_ratio must be within 0..1, got {self.crash_ratio}")
        if self.max_active is not None and self.max_active < 1:
            raise FakeConfigError(f"traffic max_active must be >= 1, got {self.max_active}")


@dataclass
class _Flow:
    settings: TrafficSettings
    last: float
    owed: float = 0.0
    started: int = 0


class TrafficGenerator:
    """One background thread driving every organisation's traffic; also applies due lifecycle
    transitions on each pass, so sessions end and disappear even when nobody calls the API."""

    def __init__(self, state: ServiceState, stopping: threading.Event, *, seed: int = 0) -> None:
        self._state = state
        self._stopping = stopping
        self._rng = random.Random(seed)
        self._flows: dict[str, _Flow] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, org: Org, settings: TrafficSettings) -> None:
        """Start (or retune) ``org``'s traffic."""
        if settings.image not in self._state.catalogue.images:
            raise FakeConfigError(f"traffic image {settings.image!r} is not in the catalogue")
        with self._lock:
            flow = self._flows.get(org.name)
            if flow is None:
                self._flows[org.name] = _Flow(settings, self._state.clock.now())
            else:
                flow.settings = settings
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fake-traffic", daemon=True)
                self._thread.start()

    def stop(self, org: Org) -> None:
        """Stop starting sessions for ``org`` (running ones still end on their own)."""
        with self._lock:
            self._flows.pop(org.name, None)

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the thread after the stop event was set."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def snapshot(self, org: Org) -> dict[str, object] | None:
        with self._lock:
            flow = self._flows.get(org.name)
            return None if flow is None else {**asdict(flow.settings), "started": flow.started}

    def _run(self) -> None:
        while not self._stopping.wait(TICK):
            try:
                self.step()
            except Exception:  # the generator must outlive one bad pass
                log.exception("traffic pass failed")

    def step(self) -> None:
        """One pass: apply due transitions, start what is owed, let some players join."""
        state = self._state
        with self._lock:
            flows = [(state.orgs_by_name()[name], flow) for name, flow in self._flows.items()]
        with state.lock:
            now = state.refresh()
            for org, flow in flows:
                self._start_owed(org, flow, now)
                self._join_some(org, now - flow.last)
                flow.last = now

    def _start_owed(self, org: Org, flow: _Flow, now: float) -> None:
        cfg = flow.settings
        flow.owed += max(0.0, now - flow.last) * cfg.rate_per_min / 60.0
        due = int(flow.owed)
        flow.owed -= due
        active = sum(1 for s in org.sessions.values() if s.active and s.traffic)
        for _ in range(min(due, MAX_STARTS_PER_TICK)):
            if cfg.max_active is not None and active >= cfg.max_active:
                break
            rng = self._rng
            location = rng.choice(self._state.catalogue.image_locations(cfg.image))
            req = CreateRequest(
                location=location,
                image=cfg.image,
                labels={"mode": rng.choice(["duel", "team", "ffa"]), "source": "traffic"},
                # A secret-looking env value: whatever consumes the fake must never leak it.
                env={"MATCH_SECRET": f"{rng.getrandbits(64):016x}"},
            )
            try:
                self._state.create(
                    org, req, players=[self._player()], crashes=rng.random() < cfg.crash_ratio,
                    lifetime=rng.uniform(cfg.min_duration, cfg.max_duration), traffic=True,
                )  # fmt: skip
            except HttpProblem:  # no capacity or start-rate limit: this start is lost, like a real one
                continue
            active += 1
            flow.started += 1

    def _join_some(self, org: Org, elapsed: float) -> None:
        candidates = [s for s in org.sessions.values() if s.active and s.traffic and len(s.players) < MAX_PLAYERS]
        for s in self._rng.sample(candidates, min(JOIN_SAMPLE, len(candidates))):
            if self._rng.random() < min(1.0, elapsed / JOIN_EVERY):
                s.players.append(self._player())

    def _player(self) -> str:
        return f"player-{self._rng.getrandbits(32):08x}"
