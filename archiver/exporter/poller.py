"""The poll loop: once per interval, `GET /session` and `GET /metrics`, handed on as one PollResult
(with the list entries left out of that poll, each logged once while it keeps appearing)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from archiver.errors import ApiError, ApiStatusError, PayloadError
from archiver.retry import RetryPolicy, upstream_poll
from archiver.textsafe import printable
from archiver.upstream.api import SessionHostClient
from archiver.upstream.listparser import SessionListParser
from archiver.upstream.metrics import MetricFamily, parse_upstream_metrics
from archiver.upstream.models import InvalidEntry, ListDelta, Session

log = logging.getLogger("archiver.poller")

SESSIONS = "sessions"
METRICS = "metrics"
ENDPOINTS = (SESSIONS, METRICS)

#: An invalid entry's id is shown cut to this many characters: it is upstream data of any length.
_ID_SHOWN = 80


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll saw. `sessions`/`families` are None when that endpoint failed this time;
    `invalid` holds the list entries left out of `sessions` because a value failed a range check;
    `delta` what changed since the parser's previous list (for the renderer; None when unknown)."""

    started_at: float
    sessions: list[Session] | None
    families: list[MetricFamily] | None
    durations: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    invalid: tuple[InvalidEntry, ...] = ()
    delta: ListDelta | None = None


def poll_policy(interval: float) -> RetryPolicy:
    """The upstream-poll policy of archiver.retry for this interval."""
    return upstream_poll(interval)


def _cut(text: str) -> str:
    return text if len(text) <= _ID_SHOWN else text[:_ID_SHOWN] + "…"


def _describe_error(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


class Poller:
    """Polls the upstream on its own thread and hands each result to `on_result` (the daemon)."""

    def __init__(
        self,
        client: SessionHostClient,
        *,
        interval: float,
        on_result: Callable[[PollResult], None],
        clock: Callable[[], float] = time.time,
        parser: SessionListParser | None = None,
        upstream_metrics: bool = True,
    ) -> None:
        self._client = client
        #: False on every shard but 0: the upstream's /metrics is re-exposed once per fleet.
        self.upstream_metrics = upstream_metrics
        # One parser across polls: entries unchanged since the last poll come back as the same
        # Session objects, which spares their decode here and their re-render in the exposition.
        self._parser = SessionListParser() if parser is None else parser
        self._interval = interval
        self._on_result = on_result
        self._clock = clock
        self._policy = poll_policy(interval)
        self._healthy: dict[str, bool | None] = dict.fromkeys(ENDPOINTS)
        # (id, reason) of the entries left out by the last poll: each is logged once while it keeps
        # appearing; only the last poll's keys are kept, so one that goes and comes back is logged again.
        self._invalid_logged: frozenset[tuple[str | None, str]] = frozenset()
        self.heartbeat = 0.0
        #: Entered around every poll cycle (the poll and its consumer): the daemon pauses live
        #: capture meanwhile, so its streams do not take the GIL from the cycle.
        self.guard: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext

    def poll_once(self) -> PollResult:
        started = self._clock()
        durations: dict[str, float] = {}
        errors: dict[str, str] = {}

        sessions: list[Session] | None = None
        invalid: tuple[InvalidEntry, ...] = ()
        delta: ListDelta | None = None
        t0 = time.perf_counter()
        try:
            listed = self._client.list_sessions(policy=self._policy, parser=self._parser)
            sessions, invalid, delta = listed.sessions, listed.invalid, listed.delta
            self._log_invalid(invalid)
        except ApiError as exc:
            errors[SESSIONS] = _describe_error(exc)
            self._transition(SESSIONS, False, exc)
        else:
            self._transition(SESSIONS, True, None)
        durations[SESSIONS] = time.perf_counter() - t0

        if not self.upstream_metrics:
            return PollResult(started, sessions, [], durations, errors, invalid, delta)
        families: list[MetricFamily] | None = None
        t0 = time.perf_counter()
        try:
            families = parse_upstream_metrics(self._client.metrics_text(policy=self._policy))
        except (ApiError, PayloadError) as exc:
            errors[METRICS] = _describe_error(exc)
            self._transition(METRICS, False, exc)
        else:
            self._transition(METRICS, True, None)
        durations[METRICS] = time.perf_counter() - t0

        return PollResult(started, sessions, families, durations, errors, invalid, delta)

    def _log_invalid(self, invalid: tuple[InvalidEntry, ...]) -> None:
        """One WARNING per entry left out, the first poll it appears in; the id made printable and cut."""
        keys: set[tuple[str | None, str]] = set()
        for item in invalid:
            # Keyed without the entry's index: sessions ending ahead of it shift it in the list,
            # and that must not log it again.
            key = (item.session_id, item.reason.replace(f"session list entry {item.index}", "", 1))
            keys.add(key)
            if key in self._invalid_logged:
                continue
            shown = "none" if item.session_id is None else f"'{printable(_cut(item.session_id))}'"
            # The reason quotes values with repr(), so it is printable already; printable() is the
            # guard should that ever change (a log line must not carry a terminal escape).
            reason = item.reason if item.reason.isprintable() else printable(item.reason)
            log.warning(
                "upstream list entry %d (id %s) left out of this poll: %s",
                item.index,
                shown,
                reason,
                extra={"endpoint": SESSIONS},
            )
        self._invalid_logged = frozenset(keys)

    def _transition(self, endpoint: str, ok: bool, exc: Exception | None) -> None:
        """One log line per failure, and one per change of state (down → up)."""
        previous = self._healthy[endpoint]
        self._healthy[endpoint] = ok
        if ok:
            if previous is False:
                log.info("upstream %s poll recovered", endpoint, extra={"endpoint": endpoint})
            return
        extra: dict[str, object] = {"endpoint": endpoint}
        if isinstance(exc, ApiStatusError):
            extra["status"] = exc.status
            if exc.identifier:
                extra["identifier"] = exc.identifier
        level = logging.WARNING if previous is not False else logging.INFO
        log.log(level, "upstream %s poll failed: %s", endpoint, _describe_error(exc or Exception()), extra=extra)

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set; a poll that overruns the interval starts the next one at once."""
        next_at = time.monotonic()
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            try:
                with self.guard():
                    self._on_result(self.poll_once())
            except Exception:  # the loop edge: a bug in a consumer must not stop polling
                log.exception("poll cycle failed")
            next_at = max(next_at + self._interval, time.monotonic())
            stop.wait(max(0.0, next_at - time.monotonic()))
