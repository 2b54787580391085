"""What to do when a follow stream ends, for each way it can end (pure; the clock and randomness passed in).

A follow stream ends properly when the container stops; anything else (a cut, a stall, a refused
connection, 5xx, 429) is retried with `archiver.retry.backoff` under the `FOLLOW_LOGS` policy
for as long as the session is listed active. Once it is no longer listed, its follow drains: it
goes on until a stream ends properly or the service answers 404 for its log, and at most
`Tuning.drain_timeout` seconds. The capture is then *complete* if the last stream ended properly
(it saw the end of the log), else it has a known *gap*.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from archiver.retry import FOLLOW_LOGS, RetryPolicy, backoff


class Ending(StrEnum):
    """How one stream attempt ended: the ``reason`` of a reopen, and one log line per kind."""

    ENDED = "ended"  # the body ended properly: the container stopped
    CUT = "cut"  # the connection broke mid-body (or mid-line)
    STALLED = "stalled"  # no byte for longer than the stall timeout
    SILENT = "silent"  # no first byte (no answer at all) within the first-byte timeout of opening
    REFUSED = "refused"  # no connection: refused, unreachable, connect timeout
    GONE = "gone"  # 404: the service has no log for the session (yet, or any more)
    THROTTLED = "throttled"  # 420 or 429
    SERVER_ERROR = "server_error"  # 5xx
    DENIED = "denied"  # 401 or 403
    REJECTED = "rejected"  # another status, or an answer that is not HTTP/1.1
    DIVERGED = "diverged"  # the replay is not the log kept so far: a new segment begins
    WRITE_FAILED = "write_failed"  # the capture file could not be written (local disk)
    UNWANTED = "unwanted"  # no longer listed, and its stream did not end within the drain timeout


class Finish(StrEnum):
    """A capture's final state (a segment superseded by a different replay is ``diverged``)."""

    COMPLETE = "complete"  # the last stream ended properly after the session's last line
    GAP = "gap"  # the end of the log was never seen: something may be missing at the end
    DIVERGED = "diverged"  # a later replay did not start with this segment's lines


def ending_of_status(status: int) -> Ending:
    """The ending of a non-200 answer."""
    if status == 404:
        return Ending.GONE
    if status in (420, 429):
        return Ending.THROTTLED
    if status >= 500:
        return Ending.SERVER_ERROR
    if status in (401, 403):
        return Ending.DENIED
    return Ending.REJECTED


@dataclass(frozen=True, slots=True)
class Tuning:
    """Timing of follow streams; tests shorten it."""

    policy: RetryPolicy = FOLLOW_LOGS
    #: First wait before reopening a stream that ended properly while its session is still listed
    #: (the poll that shows the end is usually on its way; each reopen replays the whole log).
    ended_wait: float = 5.0
    #: No byte for this long reopens the stream; doubled (up to 8x) while reopens find nothing new.
    stall_timeout: float = 300.0
    #: How long a follow whose session left the active list may take to see the end of its stream.
    drain_timeout: float = 120.0
    #: Longest wait between reopens while draining.
    drain_max_wait: float = 5.0
    #: No byte at all (not even the answer's headers) this long after a stream was opened
    #: reopens it: a healthy service answers at once, so silence is a lost connection or a
    #: swamped accept queue, not an idle game server (that is ``stall_timeout``'s).
    first_byte_timeout: float = 5.0
    connect_timeout: float = 5.0
    #: Seconds between checkpoints of the captures (one transaction; finished segments sealed first).
    checkpoint_interval: float = 10.0
    #: A running segment that only gained lines is recorded at most this often: its row is where a
    #: restart resumes, and recovery scans the lines written after it.
    progress_interval: float = 60.0


@dataclass(frozen=True, slots=True)
class Next:
    """The decision after a stream ended: finish the capture, or reopen after ``delay`` seconds
    (in a new segment when the replay diverged)."""

    finish: Finish | None = None
    delay: float = 0.0
    new_segment: bool = False


def after(
    ending: Ending,
    *,
    wanted: bool,
    ended_properly: bool,
    attempt: int,
    draining_for: float,
    tuning: Tuning,
    rng: random.Random,
    retry_after: float | None = None,
) -> Next:
    """The next step for a follow whose stream just ended with ``ending``.

    ``wanted``: the session is still listed active; ``ended_properly``: a stream ended properly and
    no line came after it; ``attempt``: reopens since lines last arrived (1 = this is the first);
    ``draining_for``: seconds since the session left the active list (0 while listed).
    """
    if ending is Ending.DIVERGED:
        return Next(new_segment=True)
    if not wanted:
        if ending is Ending.ENDED or (ending is Ending.GONE and ended_properly):
            return Next(finish=Finish.COMPLETE)
        if ending is Ending.GONE or drain_expired(draining_for, tuning):
            return Next(finish=Finish.COMPLETE if ended_properly else Finish.GAP)
    policy = tuning.policy
    initial = tuning.ended_wait if ending in (Ending.ENDED, Ending.GONE) else policy.initial_wait
    maximum = policy.max_wait if wanted else min(policy.max_wait, tuning.drain_max_wait)
    wait = backoff(
        max(1, attempt), initial=min(initial, maximum), maximum=maximum, jitter=policy.jitter, hint=retry_after, rng=rng
    )
    return Next(delay=wait)


def drain_expired(draining_for: float, tuning: Tuning) -> bool:
    """A draining follow waiting to reopen past its drain timeout is finished instead."""
    return draining_for >= tuning.drain_timeout


def first_byte_after(silences: int, tuning: Tuning) -> float:
    """The first-byte timeout after ``silences`` streams in a row that brought no byte: a service
    too swamped to answer in time gets more patience with each, so reopens never keep it busy."""
    return tuning.first_byte_timeout * (1 << min(silences, 3))


def stall_after(idle_stalls: int, tuning: Tuning) -> float:
    """The stall timeout after ``idle_stalls`` reopens in a row that found no new line: an idle
    server is not reopened (and its whole log replayed) every few minutes."""
    return tuning.stall_timeout * (1 << min(idle_stalls, 3))
