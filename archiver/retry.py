"""The one retry policy: which failures are transient and how long to keep trying them (tenacity)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from archiver.errors import ApiStatusError, ArchiverError

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], None]


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


def is_transient(exc: BaseException) -> bool:
    """Transport errors, 5xx, 420 and 429 are worth another try; every other failure is final."""
    return isinstance(exc, ArchiverError) and bool(getattr(exc, "transient", False))


def retry_after(exc: BaseException) -> float | None:
    if isinstance(exc, ApiStatusError) and exc.retry_after is not None:
        return float(exc.retry_after)
    return None


def backoff(policy: RetryPolicy, attempt: int, hint: float | None, rng: random.Random) -> float:
    """Exponential backoff with jitter; a server's Retry-After, when given, is honoured as a floor."""
    wait: float = min(policy.max_wait, policy.initial_wait * 2.0 ** (attempt - 1))
    wait += wait * policy.jitter * rng.random()
    if hint is not None:
        wait = max(wait, hint)
    return wait


def call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_retry: Callable[[BaseException, float], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run `fn`, retrying transient failures within the policy's bounds; the last failure is re-raised."""
    started = clock()
    generator = rng or random.Random()

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return backoff(policy, state.attempt_number, retry_after(exc) if exc else None, generator)

    def stop(state: tenacity.RetryCallState) -> bool:
        resume_at = clock() + state.upcoming_sleep
        if state.attempt_number >= policy.attempts:
            return True
        if resume_at - started > policy.max_elapsed:
            return True
        return policy.deadline is not None and resume_at >= policy.deadline

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if on_retry is not None and exc is not None:
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
