"""Group commit of the upload stage's outcomes: workers hand a stored object over and go on; one
transaction (one fsync) records every outcome handed over meanwhile, and only then do their spool
files go.

Why: an upload worker used to wait for its own outcome's commit (the state DB's write lock, shared
by every worker, and a synchronous fsync) before its next PUT, a sizeable share of a small object's
time (`benchmarks/upload.py` guards it). Crash safety is unchanged: until the commit, the item's
row says `spooled` (its claim is in memory) and its spool file stays, so a crash leaves exactly
what a crash after the PUT always left; after a restart its create-once PUT finds the object
already there, a HEAD proves it is ours, and the outcome is recorded then (once: only an item
still in flight takes an outcome).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from archiver.archive.crashpoints import crashpoint
from archiver.archive.spool import Spool
from archiver.archive.stage import UPLOAD, Clock, Wakeups
from archiver.archive.state import ItemRow, StateDB, StoredOutcome
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.vocabulary import Outcome

log = logging.getLogger("archiver.pipeline")  # one logger for the whole pipeline

#: Outcomes committed in one transaction at most, and handed over but not yet committed before a
#: worker waits to hand over another: memory stays flat however far the commits fall behind.
MAX_PENDING = 256


class OutcomeCommitter:
    """Records `archived` outcomes of uploaded items in batches, then deletes their spool files.

    While `run()` (the committer thread) runs, `hand_over` only queues the outcome: the worker goes
    on to its next item, and the thread commits everything queued in one transaction as soon as its
    previous commit is done, so outcomes arriving during a commit share the next one. Without the
    thread (a stage driven one `work_once()` at a time, or once the thread has stopped) the handing
    thread commits at once: the outcome is durable when `hand_over` returns.
    """

    def __init__(
        self,
        state: StateDB,
        spool: Spool,
        metrics: SelfMetrics,
        wake: Wakeups,
        clock: Clock,
        *,
        idle_wait: float = 5.0,
        retry_wait: float = 1.0,
        gather: float = 0.0,
    ) -> None:
        self._state = state
        self._spool = spool
        self._metrics = metrics
        self._wake = wake
        self._clock = clock
        self._idle_wait = idle_wait
        self._retry_wait = retry_wait
        self._gather = gather
        self._cv = threading.Condition()
        self._pending: list[tuple[ItemRow, StoredOutcome]] = []
        #: True while the committer thread runs: hand-overs are queued for it.
        self._queueing = False
        #: One batch at a time, so a hand-over committed inline returns only after its commit.
        self._commit_lock = threading.Lock()
        #: Uploads begun and not yet handed over or given up (`uploading`): whose outcomes a commit waits for.
        self._in_flight = 0

    @contextlib.contextmanager
    def uploading(self) -> Iterator[None]:
        """Around one upload and its hand-over: while none is in flight, the committer gathers no
        longer (a lone upload's outcome is committed at once, not `gather` seconds later)."""
        with self._cv:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cv:
                self._in_flight -= 1
                if not self._in_flight:
                    self._cv.notify_all()

    def hand_over(self, item: ItemRow, spool_path: Path) -> None:
        """`item`'s object is stored at its key: record `archived`, then delete its spool file."""
        entry = (item, StoredOutcome(item.id, item.instance, str(spool_path)))
        with self._cv:
            while self._queueing and len(self._pending) >= MAX_PENDING:
                self._cv.wait(self._idle_wait)
            self._pending.append(entry)
            if self._queueing:
                if len(self._pending) in (1, MAX_PENDING):
                    # The committer waits for a first outcome, or gathers until a batch is full:
                    # waking it for every other hand-over would only cost a GIL turn.
                    self._cv.notify_all()
                return
        self.commit_pending()

    def defer(self) -> None:
        """Queue hand-overs until `commit_pending()` commits them: what the committer thread does (a
        stage driven one step at a time, as the state-machine test does, calls it itself)."""
        with self._cv:
            self._queueing = True

    def pending(self) -> int:
        """Outcomes handed over and not yet committed."""
        with self._cv:
            return len(self._pending)

    def commit_pending(self) -> int:
        """Commit the outcomes handed over so far (up to MAX_PENDING) in one transaction, then delete
        the spool files no row needs any more; returns how many outcomes the batch held.

        A failed commit puts the batch back in front of the queue and raises: nothing was recorded,
        so every spool file stays and the next commit tries again.
        """
        with self._commit_lock:
            with self._cv:
                batch, self._pending = self._pending[:MAX_PENDING], self._pending[MAX_PENDING:]
                self._cv.notify_all()  # room for workers waiting to hand over
            if not batch:
                return 0
            try:
                applied, removable = self._state.finish_uploads([stored for _, stored in batch], self._clock())
            except BaseException:
                with self._cv:
                    self._pending[:0] = batch
                raise
            # Durable now (synchronous=FULL): only from here on may the spool files go.
            crashpoint("after_outcome_commit")
            for path in removable:
                self._spool.remove(Path(path))
            for item, _ in batch:
                if item.id in applied:
                    applied.discard(item.id)  # counted once, even if it was handed over twice
                    self._metrics.item_done(item.kind, Outcome.ARCHIVED)
        # The batch may have completed sessions: finalization is the upload workers' job.
        self._wake.notify(UPLOAD)
        return len(batch)

    def run(self, stop: threading.Event) -> None:
        """The committer thread: commit whatever is handed over until `stop`, then what is left; from
        then on the workers commit their own outcomes again."""
        self.defer()
        try:
            while True:
                with self._cv:
                    while not self._pending and not stop.is_set():
                        self._cv.wait(self._idle_wait)
                    if not self._pending:
                        self._queueing = False  # in the same hold of the lock: no hand-over is stranded
                        return
                    # Let the outcomes of the other workers' PUTs in flight join this commit: fewer
                    # transactions, so the workers' claims wait less often behind one; none in
                    # flight, nothing to wait for.
                    until = time.monotonic() + self._gather
                    while len(self._pending) < MAX_PENDING and self._in_flight and not stop.is_set():
                        left = until - time.monotonic()
                        if left <= 0:
                            break
                        self._cv.wait(left)
                try:
                    self.commit_pending()
                except Exception:  # the loop's edge: the outcomes stay queued and are tried again
                    log.exception("committing upload outcomes failed (retrying; their spool files stay)")
                    self._metrics.error("upload")
                    if stop.wait(self._retry_wait):
                        return  # stopping: the next start uploads them again and finds them stored
        finally:
            with self._cv:
                self._queueing = False
                self._cv.notify_all()

    def wake(self) -> None:
        """Let a waiting committer thread see the stop signal now."""
        with self._cv:
            self._cv.notify_all()
