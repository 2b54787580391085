"""What the pipeline's worker stages share: their timings (Tuning), how they sleep and wake, item outcomes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from archiver import retry
from archiver.archive.state import ItemRow, StateDB
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.vocabulary import Outcome

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Tuning:
    """Timings of the pipeline's own loops (defaults for production; tests shorten them)."""

    #: Threads describing candidates.
    confirm_workers: int = 2
    #: Candidates leased per claim.
    confirm_batch: int = 50
    #: A claimed candidate is not claimed again for this long (a confirmer that died mid-way).
    confirm_lease: float = 120.0
    #: Re-describe a candidate whose describe failed after this long.
    confirm_retry: float = 5.0
    #: Re-describe a candidate the upstream still calls alive (absent from the list) after this long.
    confirm_recheck: float = 15.0
    #: A candidate the describe calls `unknown` (status missing or new) is taken as ended after
    #: this long: the list dropped it, and waiting for a status that never comes would lose it.
    unknown_status_grace: float = 300.0
    #: The API's own 404 for a candidate ends it only when a describe this much later says so too.
    not_found_confirm: float = 30.0
    #: Pending items a fetch worker claims at once; their spooled marks share one commit (issue 35).
    fetch_batch: int = 32
    #: A fetch batch commits its spooled items at the latest this long after the first of them.
    spooled_commit_after: float = 0.5
    #: Complete sessions a worker leases at once; their archived marks share one commit (issue 35).
    finalize_batch: int = 64
    #: A session being finalized is not taken by another worker for this long.
    finalize_lease: float = 300.0
    #: Finalization re-attempts: exponential from initial to max.
    finalize_backoff_initial: float = 5.0
    finalize_backoff_max: float = 300.0
    #: Move the list mark (the persisted last-seen time of all listed sessions) at most this often
    #: (a stale value only makes deadlines earlier, i.e. safe; exact values are written when a
    #: session disappears).
    last_seen_persist_interval: float = 30.0
    #: Item-level fetch re-attempts: exponential from initial to max (bounded by the deadline).
    fetch_backoff_initial: float = 2.0
    fetch_backoff_max: float = 300.0
    #: Upload stage pause after StoreUnavailableError: exponential from initial to max, forever.
    upload_backoff_initial: float = 1.0
    upload_backoff_max: float = 60.0
    #: Pause after StorePermissionError (an operator must act; don't hammer the store).
    permission_backoff: float = 300.0
    #: A sweep of orphaned multipart uploads that failed (store down) is tried again after this long.
    orphan_sweep_retry: float = 300.0
    #: Replica r of a shard waits r times this before a session's first fetch, so a healthy pair
    #: fetches once (the later replica finds the first one's manifest; archive/replicas.py).
    replica_stagger: float = 60.0
    #: Upload outcomes: the committer waits up to this long after the first one for the others in
    #: flight, to record them all in one transaction (`outcomes.py`); none in flight, it waits no more.
    outcome_gather: float = 0.25
    #: Spooled items a running upload worker claims per transaction (one hold of the write lock,
    #: which the group commit's fsync also takes); those it has not attempted go back when it
    #: stops or the store fails.
    upload_claim_batch: int = 16
    #: Longest a worker sleeps before looking at the DB again even without a notification.
    idle_wait: float = 5.0
    #: Minimum interval between gauge refreshes triggered by workers.
    gauge_interval: float = 1.0


def backoff(initial: float, maximum: float, attempt: int) -> float:
    """The pipeline's loops wait as every retry does (`archiver.retry.backoff`)."""
    return retry.backoff(attempt, initial=initial, maximum=maximum)


#: The worker groups a notification can be aimed at (`Wakeups.notify`).
CONFIRM, FETCH, UPLOAD = "confirm", "fetch", "upload"
_GROUPS = (CONFIRM, FETCH, UPLOAD)
#: What `snapshot`/`wait` watch by default: every notification (`run_until_idle`, the tests).
ANY = "any"


class Wakeups:
    """Generation counters under one lock, one per worker group: a worker sleeps until another one
    made progress it can act on (`notify` aimed at its group), the stop signal, or its own next
    gate, so no thread polls the DB in a tight loop.

    Aimed, because every wake-up of a worker with nothing to do costs a state DB transaction and a
    turn of the GIL: an uploaded item used to wake the confirm and fetch workers too (three wasted
    write transactions per object, seen in `benchmarks/upload.py`).
    """

    def __init__(self, idle_wait: float, monotonic: Clock = time.monotonic) -> None:
        lock = threading.Lock()
        self._lock = lock
        self._cvs = {group: threading.Condition(lock) for group in (*_GROUPS, ANY)}
        self._generations = dict.fromkeys(self._cvs, 0)
        self._idle_wait = idle_wait
        self._mono = monotonic
        self.stop = threading.Event()

    def notify(self, *groups: str) -> None:
        """Wake the workers of `groups` (every worker when none is named); `ANY` watchers always wake."""
        with self._lock:
            for group in {*(groups or _GROUPS), ANY}:
                self._generations[group] += 1
                self._cvs[group].notify_all()

    def snapshot(self, group: str = ANY) -> int:
        with self._lock:
            return self._generations[group]

    def wait(self, generation: int, timeout: float, group: str = ANY) -> None:
        """Sleep until `group` was notified since `generation`, the stop signal, or `timeout`."""
        with self._lock:
            if self._generations[group] == generation and not self.stop.is_set():
                self._cvs[group].wait(max(0.0, min(timeout, self._idle_wait)))

    def until(self, gate: float | None) -> float:
        """Seconds to a monotonic retry gate (the idle wait when there is none)."""
        return self._idle_wait if gate is None else gate - self._mono()


@dataclass(frozen=True, slots=True)
class StageParts:
    """What every worker stage is built on: the state DB, the metrics, the timings, the wake-ups, the clocks."""

    state: StateDB
    metrics: SelfMetrics
    tuning: Tuning
    wake: Wakeups
    clock: Clock
    monotonic: Clock
    #: Refresh the backlog gauges (rate-limited by the pipeline).
    refresh_gauges: Callable[[], None]


class Stage:
    """A worker stage's shared parts (see StageParts) and how it gives an item its final outcome."""

    def __init__(self, parts: StageParts) -> None:
        self.state = parts.state
        self.metrics = parts.metrics
        self.tuning = parts.tuning
        self.wake = parts.wake
        self.clock = parts.clock
        self._mono = parts.monotonic
        self._refresh_gauges = parts.refresh_gauges

    def finish(
        self,
        item: ItemRow,
        outcome: Outcome,
        *,
        error: str | None = None,
        source: str | None = None,
        key: str | None = None,
        spool_path: str | None = None,
        stored: tuple[int, str] | None = None,
    ) -> None:
        """The item's outcome is final: committed, counted, and the others woken (finalization may be due).

        `stored`: the (size, sha256) of the object at the key when it is not our spool file's (a log
        another archiver compressed)."""
        self.state.finish_item(
            item.id,
            outcome,
            now=self.clock(),
            error=error,
            source=source,
            key=key,
            spool_path=spool_path,
            instance=item.instance,
            stored=stored,
        )
        self.metrics.item_done(item.kind, outcome)
        # An outcome may complete its session: finalization is the upload workers' job.
        self.wake.notify(UPLOAD)
