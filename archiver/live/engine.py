"""`LiveCapture`: one event loop thread holding a follow stream per session it is given, under a cap.

The daemon hands it the shard's active sessions after every poll (`update`, from any thread);
those no longer listed drain until their stream ends, and `followset.plan` says which to start
following under the cap. Streams are opened at most `connecting_max` at a time (a stream counts until
its answer begins, so a thousand sessions listed at once never put a thousand requests in the
service's queue, where the first-byte timeout would abort and re-send them); a stream that ends is
reopened or finished by `policy.after`; a stall sweep aborts silent streams; the captures are
checkpointed every `Tuning.checkpoint_interval` on a helper thread (and soon after a capture
finishes). The loop's selector can be paused (`paused()`, around the poll cycle, so following
thousands of streams does not take the GIL from the poll: `benchmarks/follow.py` measures both).
If a background job fails, the loop ends (logged, counted) and `following` is false from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import httpx

from archiver.config.credentials import Token
from archiver.live import policy
from archiver.live.checkpoints import Checkpoints
from archiver.live.follow import Counters, Follow
from archiver.live.followset import SessionRef, plan, ref_of
from archiver.live.loop import PARK_WAIT, GatedSelector, open_file_limit, streams_room
from archiver.live.policy import Ending, Finish, Tuning
from archiver.live.report import FailureLog, LiveStats
from archiver.live.segment import FOLLOWING, Segment, SegmentRow
from archiver.live.store import CaptureStore
from archiver.live.stream import FollowStream, Target, open_stream

log = logging.getLogger("archiver.live")

#: A session whose replays keep diverging gets at most this many segments; then its follow ends.
MAX_SEGMENTS = 8
#: Follows finished this long ago are forgotten by the loop (the store still has them).
_RECENT_FOR = 3600.0
#: Seconds between looks at a stream opened but not answered yet (at most `connecting_max` of them).
_ANSWER_POLL = 0.02
#: Seconds between prunes of finished captures no archive took.
_PRUNE_EVERY = 3600.0


class LiveCapture:
    """Live capture of one process (see the module docstring). Start it, feed it, stop it."""

    def __init__(
        self,
        base_url: str,
        token: Token,
        store: CaptureStore,
        *,
        max_streams: int,
        tuning: Tuning | None = None,
        tls: ssl.SSLContext | None = None,
        connecting_max: int = 64,
        seed: int | None = None,
        keep_finished: float = 7 * 86400.0,
    ) -> None:
        self._target = Target.from_url(base_url)
        # The same trust as the daemon's httpx client (certifi, or SSL_CERT_FILE / SSL_CERT_DIR).
        self._tls = tls if tls is not None else (httpx.create_ssl_context() if self._target.tls else None)
        self._token = token
        self.store = store
        self.max_streams = max_streams
        self.tuning = tuning or Tuning()
        self._connecting_max = connecting_max
        #: Finished captures no archive took within this long are removed (`CaptureStore.prune`).
        self._keep_finished = keep_finished
        self._rng = random.Random(seed)
        self._gate = threading.Event()
        self._gate.set()
        self._pauses = 0
        self._pause_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._selector: GatedSelector | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._handoff = threading.Lock()
        self._pending: tuple[str, ...] | None = None
        self._stop_requested: asyncio.Event | None = None
        self._stopping = False
        self._stop_asked = False
        self._held: dict[str, Follow] = {}
        self._recent: dict[str, tuple[Segment, float]] = {}
        #: Keys whose follow finished, until a checkpoint has recorded it (see `following`).
        self._finishing: set[str] = set()
        self._queue: deque[Follow] = deque()
        self._connecting = 0
        self._unfollowed = 0
        self._counters = Counters()
        self._finished: dict[str, int] = dict.fromkeys(Finish, 0)
        self._failures = FailureLog()
        self._checkpoints = Checkpoints(store, self.tuning, self._gate, self._counters)
        self._tasks: set[asyncio.Task[None]] = set()
        #: Called (on the loop's or a dying thread) when `following` turned False for some keys:
        #: the archive's logs items waiting for those captures are woken.
        self.on_settled: Callable[[], None] | None = None

    # --- the caller's side (any thread) -------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread; resumes every capture the store was following. Follows no more
        streams than the open-file limit leaves room for (the entry point raised it for
        ``max_streams``: `archiver.app.process.apply`; here it is only read)."""
        allowed = streams_room(self.max_streams, open_file_limit())
        if allowed < self.max_streams:
            log.warning(
                "live capture: the open-file limit leaves room for %d follow streams, not %d; following at most %d",
                allowed, self.max_streams, allowed,
            )  # fmt: skip
            self.max_streams = allowed
        self._thread = threading.Thread(target=self._run, name="live-capture", daemon=True)
        self._thread.start()
        self._ready.wait(30.0)

    def update(self, keys: Iterable[str]) -> None:
        """The instance keys (``{creation ms}:{id}``) of the shard's active sessions now, after every
        poll: follow them, drain those no longer listed. Only the keys are copied on the caller's
        thread (the poller's); the rest happens on the loop's."""
        refs = tuple(keys)
        with self._handoff:
            loop = self._loop
            if loop is None or not self._ready.is_set():
                self._pending = refs
                return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the daemon is stopping
            loop.call_soon_threadsafe(self._apply, refs)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """While inside, the loop does not look at its streams (their bytes wait in the kernel).
        Entering waits (briefly, bounded) until the loop finished the streams it was handling."""
        with self._pause_lock:
            self._pauses += 1
            self._gate.clear()
        selector = self._selector
        if selector is not None:
            selector.idle.wait(PARK_WAIT)
        try:
            yield
        finally:
            with self._pause_lock:
                self._pauses -= 1
                if not self._pauses:
                    self._gate.set()

    def stats(self) -> LiveStats:
        held = list(self._held.values())
        draining = sum(1 for f in held if not f.wanted)
        followed, unfollowed = len(held) - draining, self._unfollowed
        if self._died():  # it follows nothing: what it held is left unfollowed
            followed, draining, unfollowed = 0, 0, unfollowed + followed
        counters = self._counters
        scratch_bytes, spills = self.store.scratch_usage()
        return LiveStats(
            followed=followed,
            draining=draining,
            unfollowed=unfollowed,
            lines=counters.lines,
            bytes=counters.bytes,
            ends=dict(counters.ends),
            reconnects=dict(counters.reconnects),
            errors=counters.errors,
            finished=dict(self._finished),
            first_byte_counts=tuple(counters.first_byte_counts),
            first_byte_sum=counters.first_byte_sum,
            scratch_bytes=scratch_bytes,
            scratch_spills=spills,
            seals_unsynced=self.store.seals_unsynced(),
        )

    def following(self, key: str) -> bool:
        """Whether a session instance's capture may still change: it is followed, or it finished
        and the checkpoint that records how has not committed yet. False for every key once the
        loop died on an error: nothing changes a capture any more (after `stop` they stay followed:
        the next start resumes them)."""
        if self._died():
            return False
        # `_finish` adds a key to `_finishing` before it leaves `_held`: looked at in this order, a
        # key between the two is always seen (each look is one atomic read; no lock needed).
        return key in self._held or key in self._finishing

    def _died(self) -> bool:
        thread = self._thread
        return thread is not None and not thread.is_alive() and not self._stop_asked

    def stop(self, timeout: float = 10.0) -> None:
        """Close every stream, checkpoint, and end the thread. Captures stay ``following`` and are
        resumed by the next start."""
        loop, thread = self._loop, self._thread
        self._stop_asked = True
        self._gate.set()
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._request_stop)
            thread.join(timeout)
        self._checkpoints.shutdown()

    # --- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        self._selector = GatedSelector(self._gate)
        loop = asyncio.SelectorEventLoop(self._selector)
        try:
            loop.run_until_complete(self._main(loop))
        except Exception:  # the thread's edge: live capture stops, archiving goes on without it; counted
            self._counters.errors += 1
            log.exception("live capture stopped on an error")
        finally:
            self._ready.set()
            loop.close()
            self._settled()  # dead: nothing follows any more (after a stop, captures stay followed)

    def _settled(self) -> None:
        callback = self.on_settled
        if callback is not None:
            try:
                callback()
            except Exception:  # the callback's edge: a missed wake costs one idle wait; counted
                self._counters.errors += 1
                log.exception("live capture: waking the archive failed")

    async def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stop_requested = asyncio.Event()
        for segment in self.store.following():
            ref = SessionRef(segment.key, segment.session_id, segment.created_ms)
            self._held[segment.key] = Follow(ref, segment, self.store, self._counters, self._ended)
        with self._handoff:
            self._loop = loop
            self._ready.set()
            pending, self._pending = self._pending, None
        if pending is not None:
            self._apply(pending)
        jobs = [loop.create_task(job) for job in (self._checkpoints.run(self._saved), self._sweeps())]
        self._tasks.update(jobs)
        stop = loop.create_task(self._stop_requested.wait())
        done, _ = await asyncio.wait([stop, *jobs], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        try:
            await self._shutdown()
        finally:
            for job in done - {stop}:
                job.result()  # a job that failed ends the loop (`_run` logs and counts it), never silently

    def _request_stop(self) -> None:
        assert self._stop_requested is not None
        self._stop_requested.set()

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _apply(self, keys: tuple[str, ...]) -> None:
        if self._stopping:
            return
        now = self._now()
        listed = set(keys)
        refs = [ref_of(key) for key in keys]
        for key, follow in list(self._held.items()):
            if key in listed:
                if not follow.wanted:
                    follow.wanted, follow.left_at = True, None
                    self._kick(follow)
            elif follow.wanted or follow.left_at is None:
                follow.wanted, follow.left_at = False, now
                self._left(follow)
        draining = {key for key, follow in self._held.items() if not follow.wanted}
        change = plan(refs, self._held.keys(), draining, self.max_streams)
        self._unfollowed = change.unfollowed
        for ref in change.start:
            segment, saw_end = self._segment_for(ref)
            follow = Follow(ref, segment, self.store, self._counters, self._ended)
            follow.wanted = True
            if segment.index == 0 and segment.kept.lines == 0:
                follow.listed_at = time.monotonic()  # the loop's clock is monotonic too
            # Listed again after its capture saw the end: unless new lines come, it stays complete.
            follow.ended_properly = saw_end
            self._held[ref.key] = follow
            self._enqueue(follow)

    def _segment_for(self, ref: SessionRef) -> tuple[Segment, bool]:
        """The segment a new follow appends to (the newest one of an earlier follow of the same
        instance, listed again after it ended, else a fresh one), and whether that one saw the end."""
        recent = self._recent.pop(ref.key, None)
        # Only while its finish awaits a checkpoint is the loop's copy newer than the store's; after
        # that the store is the truth (the archive may have removed the capture: it starts afresh).
        row = recent[0].row() if recent is not None and ref.key in self._finishing else self.store.latest(ref.key)
        return self._reuse(ref, row), row is not None and row.state == Finish.COMPLETE

    def _reuse(self, ref: SessionRef, row: SegmentRow | None) -> Segment:
        if row is None:
            return self.store.begin(ref.key, ref.session_id, ref.created_ms, 0)
        if row.state == Finish.DIVERGED:
            return self.store.begin(ref.key, ref.session_id, ref.created_ms, row.index + 1)
        return self.store.reopen(row)

    def _kick(self, follow: Follow) -> None:
        """A follow with neither a stream nor a reopen scheduled gets one now."""
        if follow.stream is None and follow.timer is None and not follow.queued:
            self._enqueue(follow)

    def _left(self, follow: Follow) -> None:
        """The session is no longer listed: finish at once if its stream already ended properly,
        else make sure a reopen comes soon (a running stream ends by itself at the end)."""
        if follow.stream is not None:
            return
        if follow.ended_properly:
            self._finish(follow, Finish.COMPLETE)
            return
        timer = follow.timer
        if timer is not None:
            if timer.when() - self._now() <= self.tuning.drain_max_wait:
                return
            timer.cancel()
            follow.timer = None
        self._kick(follow)

    def _enqueue(self, follow: Follow) -> None:
        follow.queued = True
        self._queue.append(follow)
        self._pump()

    def _pump(self) -> None:
        assert self._loop is not None
        while self._queue and self._connecting < self._connecting_max and not self._stopping:
            follow = self._queue.popleft()
            follow.queued = False
            if self._held.get(follow.ref.key) is not follow or follow.stream is not None:
                continue
            self._connecting += 1
            task = self._loop.create_task(self._connect(follow))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, follow: Follow) -> None:
        stream = FollowStream(self._target.request(follow.ref.session_id, self._token.reveal()), follow)
        follow.attach(stream)
        try:
            await open_stream(self._target, stream, tls=self._tls, timeout=self.tuning.connect_timeout)
            # Its slot is held until the answer begins or the stream ends (the first-byte sweep
            # bounds the wait): only `connecting_max` requests wait on the service at once.
            while follow.stream is stream and not stream.answered:
                await asyncio.sleep(_ANSWER_POLL)
        except (OSError, TimeoutError):
            follow.abort(Ending.REFUSED)
        finally:
            self._connecting -= 1
            self._pump()

    def _ended(self, follow: Follow, ending: Ending) -> None:
        """A follow's stream ended: finish it, or schedule its reopen (`policy.after`)."""
        if self._stopping or self._held.get(follow.ref.key) is not follow:
            return
        now = self._now()
        if ending is Ending.DENIED:
            self._token.reload()  # a rotated Secret: the next reopen sends the new token
        if not (ending is Ending.GONE and (follow.ended_properly or not follow.wanted)):
            self._failures.failed(ending, follow.ref.session_id, follow.status, time.monotonic())
        draining_for = 0.0 if follow.left_at is None else now - follow.left_at
        step = policy.after(
            ending, wanted=follow.wanted, ended_properly=follow.ended_properly, attempt=follow.attempt,
            draining_for=draining_for, tuning=self.tuning, rng=self._rng, retry_after=follow.retry_after,
        )  # fmt: skip
        if step.finish is not None:
            self._finish(follow, step.finish)
            return
        if step.new_segment and not self._next_segment(follow):
            return
        self._counters.reconnects[ending] += 1
        if step.delay <= 0:
            self._enqueue(follow)
        else:
            assert self._loop is not None
            follow.timer = self._loop.call_later(step.delay, self._due, follow)

    def _next_segment(self, follow: Follow) -> bool:
        """Keep what was captured as it is and start a new segment for the differing replay."""
        old = follow.segment
        if old.index + 1 >= MAX_SEGMENTS:
            log.warning("live capture: the log of session %r keeps changing; no longer followed", follow.ref.session_id)
            self._finish(follow, Finish.GAP)
            return False
        self.store.finish(old, Finish.DIVERGED)
        self._finished[Finish.DIVERGED] += 1
        follow.segment = self.store.begin(follow.ref.key, follow.ref.session_id, follow.ref.created_ms, old.index + 1)
        follow.ended_properly = False
        return True

    def _due(self, follow: Follow) -> None:
        follow.timer = None
        if self._held.get(follow.ref.key) is not follow:
            return
        if follow.left_at is not None and policy.drain_expired(self._now() - follow.left_at, self.tuning):
            self._finish(follow, Finish.COMPLETE if follow.ended_properly else Finish.GAP)
            return
        self._enqueue(follow)

    def _finish(self, follow: Follow, state: Finish) -> None:
        if follow.timer is not None:
            follow.timer.cancel()
            follow.timer = None
        key = follow.ref.key
        self._finishing.add(key)  # before it leaves `_held`: `following` sees it in one or the other
        self._recent[key] = (follow.segment, self._now())
        del self._held[key]
        if follow.stream is not None:
            follow.abort(Ending.UNWANTED)  # no longer held: its end is not acted upon
        self.store.finish(follow.segment, state)
        self._finished[state] += 1
        self._checkpoints.soon()

    # --- background jobs ----------------------------------------------------------------------

    async def _sweeps(self) -> None:
        """Abort silent streams, let go of drains past their timeout, sum up failures, and (hourly)
        remove finished captures no archive took."""
        tuning = self.tuning
        every = max(0.05, min(5.0, tuning.stall_timeout / 4, tuning.drain_timeout / 4, tuning.first_byte_timeout / 4))
        pruned_at = float("-inf")
        while True:
            await asyncio.sleep(every)
            if self._now() - pruned_at >= _PRUNE_EVERY:
                pruned_at = self._now()
                keep = frozenset(self._held) | frozenset(self._recent)
                stale = time.time() - self._keep_finished
                try:
                    removed = await self._checkpoints.in_background(functools.partial(self.store.prune, stale, keep))
                except Exception:  # housekeeping's edge: it never stops following; counted
                    self._counters.errors += 1
                    log.exception("live capture: removing finished captures failed")
                else:
                    if removed:
                        log.info("live capture: removed %d finished captures no archive took", removed)
            now, clock = self._now(), time.monotonic()
            for follow in list(self._held.values()):
                stream = follow.stream
                if stream is None:
                    continue
                if not stream.answered and clock - stream.opened > policy.first_byte_after(follow.silences, tuning):
                    follow.abort(Ending.SILENT)
                elif clock - stream.last_byte > policy.stall_after(follow.idle_stalls, tuning):
                    follow.abort(Ending.STALLED)
                elif follow.left_at is not None and policy.drain_expired(now - follow.left_at, self.tuning):
                    follow.abort(Ending.UNWANTED)
            for key, (_, finished_at) in list(self._recent.items()):
                if now - finished_at > _RECENT_FOR:
                    del self._recent[key]
            self._failures.summarize(clock)

    def _saved(self, rows: list[SegmentRow]) -> None:
        """A checkpoint recorded ``rows``: the follows it saw finish have settled."""
        settled = False
        for row in rows:
            recent = self._recent.get(row.key)
            # Unless it was listed again, or finished again since these rows were taken (the newer
            # row is in the next checkpoint), the store now says how it finished.
            if row.state != FOLLOWING and row.key not in self._held and (recent is None or recent[0].row() == row):
                settled = settled or row.key in self._finishing
                self._finishing.discard(row.key)
        if settled:
            self._settled()

    async def _shutdown(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for follow in list(self._held.values()):
            if follow.timer is not None:
                follow.timer.cancel()
                follow.timer = None
            if follow.stream is not None:
                follow.stream.abort()
            self.store.release(follow.segment)
        if rows := await self._checkpoints.once():
            self._saved(rows)
        await self._checkpoints.in_background(self.store.settle_seals)
