"""Reconciliation: the ended sessions the upstream still holds that the polls never saw (daemon
stopped, list outage) become candidates, as any other session that left the list; and old rows go."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from archiver.archive.stage import Clock
from archiver.archive.state import StateDB, session_key
from archiver.config.settings import Settings
from archiver.errors import ApiError
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retry import RetryPolicy
from archiver.textsafe import printable
from archiver.upstream.api import SessionHostClient
from archiver.upstream.models import InvalidEntry, Session, parse_ended

log = logging.getLogger("archiver.pipeline")  # the name it had as part of the pipeline: log filters keep working


class Reconciler:
    """Runs a reconciliation when asked (start-up, a successful poll after a gap) and every
    `reconcile_interval`; the pipeline's confirmers take it from there."""

    def __init__(
        self,
        settings: Settings,
        client: SessionHostClient,
        state: StateDB,
        metrics: SelfMetrics,
        clock: Clock = time.time,
        *,
        policy: RetryPolicy,
        on_queued: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.client = client
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self._policy = policy
        #: Called when candidates were queued (wakes the confirmers).
        self._on_queued = on_queued
        self._requested = threading.Event()
        self._first_start = state.created
        #: Set after each reconciliation attempt, successful or not.
        self.done_once = threading.Event()

    def request(self) -> None:
        """Reconcile as soon as possible (and wake the loop so it sees a stop)."""
        self._requested.set()

    def run(self, stop: threading.Event) -> None:
        """The reconcile thread: until `stop` is set (then `request()` wakes it)."""
        interval = self.settings.reconcile_interval
        while not stop.is_set():
            self._requested.wait(interval)
            if stop.is_set():
                return
            self._requested.clear()
            try:
                self.reconcile()
            except ApiError as exc:
                # The next poll after the outage asks again; meanwhile the interval does.
                log.warning("reconciliation could not list the sessions: %s", exc)
            except Exception:  # loop edge
                log.exception("reconciliation failed")
                self.metrics.error("reconcile")
            self.done_once.set()

    def reconcile(self) -> int:
        """List every session the upstream still holds (`all=true`) and queue those it calls ended
        that the state DB has never seen, however the polls missed them (daemon stopped, list
        outage). They become candidates: the confirmers describe them (the describe also gives
        their players) and end them as any other session.

        Sessions the DB knows are left to the polls and confirmers. The deadline of a session never
        seen alive comes from its creation time and the fact that the upstream lists it now
        (`deadline_for`). Also prunes old terminal rows. Returns the number of sessions queued.
        """
        shard = self.settings.shard
        scanned = self.client.list_ended_sessions(policy=self._policy)
        if not shard.whole:
            scanned = [e for e in scanned if shard.owns(e.session_id)]
        now = self.clock()
        by_key = {session_key(e.session_id, e.created_ms): e for e in scanned}
        states = self.state.states_of(by_key)
        # Only entries the DB does not know are parsed: in steady state that is none of them.
        unseen: list[Session] = []
        invalid: list[InvalidEntry] = []
        for key, entry in by_key.items():
            if key not in states:
                parsed = parse_ended(entry)
                if isinstance(parsed, Session):
                    unseen.append(parsed)
                else:
                    invalid.append(parsed)
        if invalid:
            self.metrics.upstream_invalid_entries(len(invalid))
            for bad in invalid[:5]:
                log.warning("ended list entry %d (id %s) left out of reconciliation: %s", bad.index,
                            printable(bad.session_id or "")[:80], bad.reason)  # fmt: skip
        queued = 0
        if unseen and self._first_start and self.settings.on_first_start == "skip":
            skipped = self.state.skip_sessions(unseen, now)
            log.info("first start: %d ended sessions the upstream still holds are not archived (on-first-start=skip)",
                     skipped)  # fmt: skip
        elif unseen:
            if self._first_start:
                log.info("first start: archiving the %d ended sessions the upstream still holds", len(unseen))
            queued = self.state.add_candidates(unseen, now)
            if queued:
                self.metrics.reconciled(queued)
                log.info("reconciliation found %d ended sessions the polls had missed", queued)
                self._on_queued()
        self._first_start = False
        pruned = self.state.prune(now - self.settings.prune_after)
        if pruned:
            log.info("pruned %d archived sessions older than %.0f s from the state DB", pruned,
                     self.settings.prune_after)  # fmt: skip
        return queued
