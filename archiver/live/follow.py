"""One followed session: its stream's pieces turned into kept lines, and how its current stream ended.

A `Follow` is the sink of its session's `FollowStream`: it cuts the body into lines, checks the
replay against the kept prefix (`resume`), appends only new lines to the capture, and, when the
stream ends, tells the engine how (`policy.Ending`). It decides nothing about reopening: that is
`policy.after`, applied by the engine. Everything here runs on the engine's event loop thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from archiver.live import resume
from archiver.live.followset import SessionRef
from archiver.live.lines import LineSplitter
from archiver.live.policy import Ending, ending_of_status
from archiver.live.report import FIRST_BYTE_BUCKETS, bucket_of
from archiver.live.resume import Verdict
from archiver.live.segment import Segment
from archiver.live.store import CaptureStore
from archiver.live.stream import Closed, FollowStream
from archiver.logshape import declared


@dataclass
class Counters:
    """What every follow of one engine adds up (read from other threads: plain ints, keys fixed)."""

    lines: int = 0
    bytes: int = 0
    #: Unexpected errors caught at the loop's edges (archiver_errors_total{where="live"}).
    errors: int = 0
    #: Streams ended, by how.
    ends: dict[str, int] = field(default_factory=lambda: dict.fromkeys(Ending, 0))
    #: Streams reopened, by how the one before ended.
    reconnects: dict[str, int] = field(default_factory=lambda: dict.fromkeys(Ending, 0))
    #: Time from a session's first listing to its first captured line: counts per bucket, sum.
    first_byte_counts: list[int] = field(default_factory=lambda: [0] * (len(FIRST_BYTE_BUCKETS) + 1))
    first_byte_sum: float = 0.0

    def first_byte(self, seconds: float) -> None:
        """One session's first line came ``seconds`` after it was first listed."""
        self.first_byte_counts[bucket_of(seconds)] += 1
        self.first_byte_sum += seconds


class Follow:
    """One session's follow (see the module docstring)."""

    __slots__ = (
        "_base",
        "_progress",
        "_splitter",
        "_store",
        "appended",
        "attempt",
        "counters",
        "ended_properly",
        "idle_stalls",
        "left_at",
        "listed_at",
        "on_end",
        "queued",
        "reason",
        "ref",
        "retry_after",
        "segment",
        "silences",
        "status",
        "stream",
        "timer",
        "wanted",
    )  # fmt: skip

    def __init__(
        self,
        ref: SessionRef,
        segment: Segment,
        store: CaptureStore,
        counters: Counters,
        on_end: Callable[[Follow, Ending], None],
    ) -> None:
        self.ref = ref
        self.segment = segment
        self._store = store
        self.counters = counters
        self.on_end = on_end
        self.stream: FollowStream | None = None
        #: The loop's timer of the next reopen, while one is scheduled.
        self.timer: asyncio.TimerHandle | None = None
        self.wanted = False
        #: Loop time at which the session left the active list (None while listed).
        self.left_at: float | None = None
        #: When (time.monotonic) a new session was first listed, until its first line is kept
        #: (None: resumed, or its first line already measured).
        self.listed_at: float | None = None
        #: Reopens since a stream last brought a new line.
        self.attempt = 0
        #: A stream ended properly and no line came after it.
        self.ended_properly = False
        self.idle_stalls = 0
        #: Streams in a row that brought no byte at all (`policy.first_byte_after`).
        self.silences = 0
        #: Waiting in the engine's queue of streams to open.
        self.queued = False
        #: Set before the engine aborts the stream itself (stall, divergence found in the head).
        self.reason: Ending | None = None
        self.retry_after: float | None = None
        #: The HTTP status of the last answer (None: no answer).
        self.status: int | None = None
        #: Lines this stream appended (an idle reopen appends none).
        self.appended = 0
        self._base = segment.kept
        self._progress = resume.start(segment.kept)
        self._splitter = LineSplitter()

    def attach(self, stream: FollowStream) -> None:
        """A new connection: its replay is checked against what the capture holds now."""
        self.stream = stream
        self.reason = None
        self.retry_after = None
        self.appended = 0
        self._base = self.segment.kept
        self._progress = resume.start(self._base)
        self._splitter = LineSplitter()

    def abort(self, reason: Ending) -> None:
        """End the current stream (a stall, a divergence, a failed write): reported as ``reason``."""
        self.reason = reason
        if self.stream is not None:
            self.stream.abort()

    # --- StreamSink ---------------------------------------------------------------------------

    def head(self, content_type: str) -> None:
        shape = declared(content_type)
        if self.segment.shape is None:
            self._store.set_shape(self.segment, shape)
        elif self.segment.shape != shape:
            self.abort(Ending.DIVERGED)  # the same log in another shape would not be a line prefix

    def body(self, data: bytes) -> None:
        lines = self._splitter.feed(data)
        if lines:
            self._take(lines)

    def _take(self, lines: Sequence[bytes]) -> None:
        self._progress, new = resume.replay(self._base, self._progress, lines)
        if self._progress.verdict is Verdict.DIVERGED:
            self.abort(Ending.DIVERGED)
            return
        if not new:
            return
        try:
            written = self._store.append(self.segment, new)
        except OSError:
            self.abort(Ending.WRITE_FAILED)  # the replay of the next stream brings these lines again
            return
        if self.listed_at is not None:
            self.counters.first_byte(time.monotonic() - self.listed_at)
            self.listed_at = None
        self.counters.lines += len(new)
        self.counters.bytes += written
        self.appended += len(new)
        self.attempt = 0
        self.idle_stalls = 0
        self.ended_properly = False

    def closed(self, how: Closed, status: int | None, retry_after: float | None) -> None:
        self.stream = None
        if how is Closed.ABORTED and self.reason is None:
            return  # the engine stops: nothing to count, nothing to decide
        self.retry_after = retry_after
        self.status = status
        ending = self._ending(how, status)
        self.attempt += 1
        if ending is Ending.ENDED:
            self.ended_properly = True
        elif ending is Ending.STALLED and not self.appended:
            self.idle_stalls += 1
        self.silences = self.silences + 1 if ending is Ending.SILENT else 0
        self.counters.ends[ending] += 1
        self.on_end(self, ending)

    def _ending(self, how: Closed, status: int | None) -> Ending:
        if self.reason is not None:
            self._splitter.discard()
            return self.reason
        if how is Closed.ENDED and status == 200:
            last = self._splitter.finish()
            if last:
                self._take(last)
                if self.reason is not None:
                    return self.reason
            self._progress = resume.ended(self._base, self._progress)
            return Ending.DIVERGED if self._progress.verdict is Verdict.DIVERGED else Ending.ENDED
        self._splitter.discard()  # a partial last line is never kept: the next replay sends it whole
        if how is Closed.ENDED and status is not None:
            return ending_of_status(status)
        if how is Closed.NOT_HTTP:
            return Ending.REJECTED
        return Ending.CUT if status is not None else Ending.REFUSED
