"""Every retry policy of the archiver: which failures are transient, how long to keep trying, the one
backoff schedule, and the report of each retry (a log line and an observer, e.g. a metric).

One retry layer per call: the upstream HTTP client retries through `call` with a named policy below;
S3 calls are retried by botocore's `standard` mode alone (`STORE` gives its attempt count); the
pipeline's item-level re-attempts (fetch, upload, finalize) are spaced by `backoff` from its Tuning.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import tenacity

from archiver.errors import ApiError, ApiStatusError, ArchiverError

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], None]

log = logging.getLogger(__name__)


class RetryObserver(Protocol):
    """Told about every retry (metrics): the policy's operation label."""

    def __call__(self, operation: str) -> None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds for retrying one call: by attempts, by total time, and optionally by an absolute deadline.

    `deadline` is in the same clock as the one passed to `call` (the fetch stage passes the
    4-hour removal deadline there, so no retry is ever scheduled past the point of no return).
    """

    attempts: int = 5
    max_elapsed: float = 30.0
    initial_wait: float = 0.2
    max_wait: float = 10.0
    jitter: float = 0.1
    deadline: float | None = None
    #: Longest a single attempt may take (None: the client's own timeouts apply).
    attempt_timeout: float | None = None
    #: What is retried: the `operation` label of archiver_retries_total and of the retry log line.
    operation: str = "upstream_request"

    def bounded_by(self, *, deadline: float | None = None, max_elapsed: float | None = None) -> RetryPolicy:
        """This policy with a tighter deadline or total time (None keeps the current bound)."""
        return dataclasses.replace(
            self,
            deadline=self.deadline if deadline is None else deadline,
            max_elapsed=self.max_elapsed if max_elapsed is None else max_elapsed,
        )

    def single_attempt(self) -> RetryPolicy:
        """This policy without retries (its per-attempt timeout still applies)."""
        return dataclasses.replace(self, attempts=1)

    def named(self, operation: str) -> RetryPolicy:
        """This policy, its retries counted and logged as `operation`."""
        return dataclasses.replace(self, operation=operation)


#: One request to the session hosting API (describe, stop, metrics, ...): the client's default.
UPSTREAM_REQUEST = RetryPolicy()
#: An interactive check (`archiver check`): a user waiting at a prompt wants a verdict quickly.
UPSTREAM_REQUEST_INTERACTIVE = RetryPolicy(attempts=2, max_elapsed=10.0, initial_wait=0.5)
#: One download of a session's logs or artifact; the fetcher bounds it further by the item's deadline.
FETCH_ITEM = RetryPolicy(operation="fetch_item")
#: Reopening a session's follow stream (`archiver.live`): no attempt limit while the session runs,
#: spaced by `backoff` from `initial_wait` to `max_wait`; each reopen is counted by its reason. The
#: first reopen comes quickly (a cut stream is usually a proxy's or a balancer's, and lines written
#: while none is open are lost if the session ends meanwhile and its logs go with it); the jitter
#: of up to 100 % spreads thousands of streams cut at once. The wait never grows past 5 s: once the
#: service is healthy again, no running session stays unfollowed for longer than that (the engine
#: opens at most `connecting_max` streams at a time, which is what spares a service in trouble).
FOLLOW_LOGS = RetryPolicy(attempts=2**31 - 1, max_elapsed=float("inf"), initial_wait=0.25, max_wait=5.0, jitter=1.0,
                          operation="follow_logs")  # fmt: skip
#: S3 requests: botocore's `standard` retry mode is the only layer, with this many attempts in all.
STORE = RetryPolicy(attempts=5, operation="store")
#: The store as `archiver check` probes it: two attempts, no minutes-long hang.
STORE_INTERACTIVE = RetryPolicy(attempts=2, operation="store")


def upstream_poll(interval: float) -> RetryPolicy:
    """Retries of one poll must finish well inside the interval, so polls never pile up."""
    return RetryPolicy(
        attempts=3,
        max_elapsed=interval * 0.5,
        initial_wait=min(0.5, interval / 20),
        max_wait=interval / 4,
        # A hung upstream must show as down within a poll or two, not after a 30 s read timeout.
        attempt_timeout=min(30.0, max(1.0, interval * 0.8)),
        operation="upstream_poll",
    )


#: Every operation the policies above name (the label values of archiver_retries_total, all
#: pre-created), in the order the metric lists them.
OPERATIONS: tuple[str, ...] = tuple(
    dict.fromkeys(policy.operation for policy in (UPSTREAM_REQUEST, upstream_poll(1.0), FETCH_ITEM, FOLLOW_LOGS, STORE))
)


def is_transient(exc: BaseException) -> bool:
    """Transport errors, 5xx, 420 and 429 are worth another try; every other failure is final."""
    return isinstance(exc, ArchiverError) and bool(getattr(exc, "transient", False))


def retry_after(exc: BaseException) -> float | None:
    if isinstance(exc, ApiStatusError) and exc.retry_after is not None:
        return float(exc.retry_after)
    return None


def backoff(
    attempt: int,
    *,
    initial: float,
    maximum: float,
    jitter: float = 0.0,
    hint: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """The wait before re-attempt number `attempt` (1: the first retry): exponential from `initial`,
    capped at `maximum`, plus up to `jitter` of itself at random; a server's Retry-After (`hint`),
    when given, is honoured as a floor."""
    wait: float = min(maximum, initial * 2.0 ** max(0, attempt - 1))
    if jitter and rng is not None:
        wait += wait * jitter * rng.random()
    if hint is not None:
        wait = max(wait, hint)
    return wait


def describe(exc: BaseException) -> str:
    """A failure as a retry log line shows it: the request and status, never a message or a body
    (an upstream's error text may echo what a caller sent, env included)."""
    if isinstance(exc, ApiStatusError):
        return f"{exc.method} {exc.path}: HTTP {exc.status}"
    if isinstance(exc, ApiError):
        return f"{exc.method} {exc.path}: {type(exc).__name__}"
    return type(exc).__name__


def call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_retry: Callable[[BaseException, float], None] | None = None,
    observer: RetryObserver | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run `fn`, retrying transient failures within the policy's bounds; the last failure is re-raised.

    Each retry is logged (operation, attempt, wait, the failure as `describe` shows it) and reported
    to `observer` (the daemon counts archiver_retries_total) and to `on_retry` (the caller's own use).
    """
    started = clock()
    generator = rng or random.Random()

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return backoff(
            state.attempt_number,
            initial=policy.initial_wait,
            maximum=policy.max_wait,
            jitter=policy.jitter,
            hint=retry_after(exc) if exc else None,
            rng=generator,
        )

    def stop(state: tenacity.RetryCallState) -> bool:
        resume_at = clock() + state.upcoming_sleep
        if state.attempt_number >= policy.attempts:
            return True
        if resume_at - started > policy.max_elapsed:
            return True
        return policy.deadline is not None and resume_at >= policy.deadline

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is None:
            return
        log.warning(
            "retrying %s (attempt %d of %d failed) in %.2fs: %s",
            policy.operation, state.attempt_number, policy.attempts, state.upcoming_sleep, describe(exc),
        )  # fmt: skip
        if observer is not None:
            observer(policy.operation)
        if on_retry is not None:
            on_retry(exc, state.upcoming_sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=wait,
        stop=stop,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)
