"""The end of a session: list polls applied to the state DB, candidates confirmed, ends given their deadline and items.

The poller's thread hands each list poll to `observe_poll`: the pure detector (`detector.observe`)
decides, one transaction records what changed, and known-active sessions missing from the list
become candidates. The confirm workers (`run`) describe the candidates and end one only on positive
evidence: a terminal status from the upstream, or the API's own JSON 404 seen twice
`not_found_confirm` apart (an HTML 404 from a proxy is a transient error). An ended session gets its
fetch deadline (`deadline.deadline_for`) and its items (the logs, each configured artifact path) in
the commit that ends it, and the fetch workers are woken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence, Set
from pathlib import Path

from archiver.archive.deadline import deadline_for
from archiver.archive.detector import key_id, observe
from archiver.archive.fetcher import artifact_source, logs_source
from archiver.archive.spool import Spool
from archiver.archive.stage import CONFIRM, FETCH, UPLOAD, Stage, StageParts
from archiver.archive.state import NewItem, SessionRow, session_key_of
from archiver.config.settings import Settings
from archiver.errors import ApiError, NotFoundError
from archiver.live.engine import LiveCapture
from archiver.retry import RetryPolicy
from archiver.upstream.api import SessionHostClient
from archiver.upstream.models import UNKNOWN_STATUS, Session
from archiver.vocabulary import DETECTING_STATES

log = logging.getLogger("archiver.pipeline")  # one logger for the whole pipeline, as before the split


class EndingStage(Stage):
    """Detection's writes (one list poll at a time) and the confirm workers: from a poll to ended
    sessions with their items."""

    def __init__(
        self,
        settings: Settings,
        client: SessionHostClient,
        parts: StageParts,
        *,
        policy: RetryPolicy,
        spool: Spool,
        on_poll_gap: Callable[[], None],
        live: LiveCapture | None = None,
    ) -> None:
        super().__init__(parts)
        self.settings = settings
        self.shard = settings.shard
        self.client = client
        # Describes of candidates are short and repeated later anyway: a few quick tries only.
        self._confirm_policy = policy.bounded_by(max_elapsed=min(10.0, policy.max_elapsed))
        #: Spool files of re-opened sessions go (their work is dropped).
        self._spool = spool
        #: Reconcile after a gap in successful polls: sessions may have started and ended meanwhile.
        self._on_poll_gap = on_poll_gap
        #: Live capture follows the shard's listed sessions.
        self._live = live
        # Detection (touched by the poller thread only, in observe_poll), keyed by instance key.
        self._known: dict[str, Session | None] = {}
        self._last_seen: dict[str, float] = {}
        self._last_seen_persisted = float("-inf")
        self._poll_gap = False

    def recover(self) -> int:
        """Start-up: the sessions the DB knows as active are known again (those another shard owns
        now are handed over); they become candidates if the first successful poll does not list
        them. Returns how many are known."""
        active = self.state.active_session_keys()
        foreign = [key for key in active if not self.shard.owns(key_id(key))]
        if foreign:
            # The shard count changed: another shard archives these when they end. Work already
            # under way here (ended sessions) is finished here.
            handed = self.state.hand_over(foreign)
            log.info("%d active sessions belong to other shards now (shard %d of %d); handed over",
                     handed, self.shard.index, self.shard.total)  # fmt: skip
        self._known = dict.fromkeys(key for key in active if self.shard.owns(key_id(key)))
        self._last_seen.clear()
        return len(self._known)

    def observe_poll(
        self, sessions: Sequence[Session] | None, now: float, *, present_ids: Set[str] = frozenset()
    ) -> None:
        """Record one list poll (None = failed: nothing ends on a failed poll).

        Only new or changed sessions are written; the last-seen time of the rest is persisted as
        one list mark (one row, whatever the fleet) at most every `last_seen_persist_interval`
        seconds. Known-active sessions missing from the list become candidates, confirmed by the
        confirm threads. A listed entry with a terminal status counts as missing (the describe
        confirms it). `present_ids`: ids of entries left out of this poll by the range checks
        (quarantined): still there, so none of their known instances is taken for ended.
        """
        if sessions is None:
            self._poll_gap = True
            return
        if self._poll_gap:
            # Sessions may have started and ended while the list was failing: reconcile.
            self._poll_gap = False
            self._on_poll_gap()
        decisions = observe(
            sessions,
            self._known,
            now,
            last_seen=self._last_seen,
            last_persisted=self._last_seen_persisted,
            persist_interval=self.tuning.last_seen_persist_interval,
            present_ids=present_ids,
        )
        known = decisions.known
        if self._live is not None:  # the shard's active sessions (only ours), quarantined ones too: still running
            self._live.update(known)
        gone = decisions.gone
        reopened = self.state.record_poll(decisions.upserts, gone, now, touch_active=decisions.touch_active)
        if decisions.touch_active:
            self._last_seen_persisted = now
        self._known = known
        last_seen = self._last_seen
        for key, _ in gone:
            last_seen.pop(key, None)
        for key in self._known:
            last_seen[key] = now
        if reopened.keys:
            for path in reopened.spool_paths:
                self._spool.remove(Path(path))
            self.metrics.session_reopened(len(reopened.keys))
            log.warning("%d sessions were listed again after they were taken for ended; re-opened: %s",
                        len(reopened.keys), ", ".join(repr(key_id(k)) for k in reopened.keys[:5]))  # fmt: skip
        if gone:
            log.info("%d sessions left the list; confirming their end", len(gone))
            self.wake.notify(CONFIRM)
        self._refresh_gauges()

    def run(self) -> None:
        """One confirm worker: leased candidates described, each batch's ends committed at once,
        until the pipeline stops."""
        while not self.wake.stop.is_set():
            generation = self.wake.snapshot(CONFIRM)
            try:
                rows = self.state.claim_candidates(self._mono(), self.tuning.confirm_lease, self.tuning.confirm_batch)
                ends: list[tuple[str, Session | None]] = []
                try:
                    for row in rows:
                        if self.wake.stop.is_set():
                            break
                        self._confirm(row, ends)
                finally:
                    # Even when a describe raised: the ends confirmed before it are not redone.
                    self._end_confirmed(ends)
                if not rows:
                    self.wake.wait(generation, self.wake.until(self.state.next_candidate_wake(self._mono())), CONFIRM)
            except Exception:  # loop edge: a bug must not silently end confirmations
                log.exception("confirm loop failed; continuing")
                self.metrics.error("confirm")
                self.wake.stop.wait(1.0)

    def _confirm(self, row: SessionRow, ends: list[tuple[str, Session | None]]) -> None:
        """Describe a candidate; end it only on positive evidence (see the module docstring): an
        end is added to `ends`, which the caller commits for the whole batch at once."""
        try:
            described = self.client.describe_session(row.id, policy=self._confirm_policy)
        except NotFoundError as exc:
            if not exc.code:
                # No error body of the API's own (an HTML or plain 404 from a proxy): transient.
                log.warning("describing candidate %r: a 404 without the API's error body; retrying", row.id)
                self.state.candidate_retry(row.key, self._mono() + self.tuning.confirm_retry, str(exc))
                return
            now = self.clock()
            first = self.state.candidate_not_found(row.key, now, self._mono() + self.tuning.not_found_confirm)
            if now - first >= self.tuning.not_found_confirm:
                # Removed (we were down, or the window is over): ended; its fetches will tell.
                ends.append((row.key, None))
            return
        except ApiError as exc:
            log.warning("describing candidate %r failed (retrying): %s", row.id, exc)
            self.state.candidate_retry(row.key, self._mono() + self.tuning.confirm_retry, str(exc))
            return
        if session_key_of(described) != row.key:
            # The id now names another instance (reused after this one ended): this one is over.
            log.info("session %r was reused by a newer instance; its earlier instance has ended", row.id)
            ends.append((row.key, None))
            return
        absent_for = self.clock() - (row.first_seen_ended or self.clock())
        if described.terminal or (
            described.status == UNKNOWN_STATUS and absent_for >= self.tuning.unknown_status_grace
        ):
            ends.append((row.key, described))
        else:
            self.state.candidate_alive(row.key, self.clock(), self._mono() + self.tuning.confirm_recheck)

    def _end_confirmed(self, ends: Sequence[tuple[str, Session | None]]) -> None:
        """End a batch's confirmed candidates in one commit (a flood of endings: one commit per batch)."""
        rows = self.state.end_sessions(
            ends, deadline_for=self._deadline_for, items_for=self._items_for, now=self.clock()
        )
        for row in rows:
            self.metrics.sessions_ended()
            log.info("session %r ended (%s); fetch deadline %.0f", row.id, row.status, row.fetch_deadline or 0)
        if rows:
            self.wake.notify(FETCH, UPLOAD)

    def backfill(self, session_ids: Sequence[str]) -> list[str]:
        """Archive these sessions now if the upstream still holds them ended; returns the ids queued.

        Already ended/archived sessions, running ones (archived when they end) and unknown or
        removed ones are skipped with a log line saying why.
        """
        queued = []
        for sid in session_ids:
            try:
                described = self.client.describe_session(sid, policy=self._confirm_policy)
            except NotFoundError:
                log.warning("session %r is unknown or past its retention window: nothing to fetch", sid)
                continue
            if not described.terminal:
                log.warning("session %r is still %s: it is archived when it ends", sid, described.status)
                continue
            row = self.state.session(session_key_of(described))
            if row is not None and row.state not in DETECTING_STATES:
                log.info("session %r is already %s", sid, row.state)
                continue
            if self._end(session_key_of(described), described, backfill=True):
                queued.append(sid)
        return queued

    def _end(self, key: str, described: Session | None, *, backfill: bool = False) -> bool:
        row = self.state.end_session(
            key,
            described=described,
            deadline_for=self._deadline_for,
            items_for=self._items_for,
            now=self.clock(),
            backfill=backfill,
        )
        if row is None:
            return False
        self.metrics.sessions_ended()
        log.info("session %r ended (%s); fetch deadline %.0f", row.id, row.status, row.fetch_deadline or 0)
        # Its items are the fetch workers' now; one without items is complete (finalization).
        self.wake.notify(FETCH, UPLOAD)
        return True

    def _deadline_for(self, row: SessionRow) -> float:
        s = self.settings
        return deadline_for(row, retention=s.retention, margin=s.deadline_margin, now=self.clock())

    def _items_for(self, row: SessionRow) -> list[NewItem]:
        items = [NewItem("logs", "", logs_source(row.id))]
        items += [
            NewItem("artifact", path, artifact_source(row.id, path))
            for path in self.settings.artifact_paths_for(row.image)
        ]
        return items
