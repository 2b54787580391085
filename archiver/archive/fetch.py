"""The fetch stage: an ended session's items leave the upstream for the spool, earliest deadline first, before removal.

A fetch worker (`FetchStage`) claims the pending items with the earliest deadlines, passing over
logs whose live capture still follows its stream (`waits_for_capture`). Each item gets one attempt
(`Fetcher.fetch`: its body streamed from the upstream into the spool, `archive.spool`, gzipped if
it is logs) whose result the stage records: `Spooled` joins the batch's one `spooled` commit (made
after each spool file's fsync), `Finished` is a final outcome without an object (source_gone,
too_large, expired), `Retry` a retry gate before the deadline, or the end after it (logs then take
their live capture instead, `Fetcher.capture_instead`). The attempt (`archive.fetcher`) never
touches the state DB; the stage records its results.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from archiver.archive.fetcher import LIVE_WAIT_MARGIN, Fetcher, Finished, Retry, Spooled, waits_for_capture
from archiver.archive.stage import FETCH, UPLOAD, Stage, StageParts, backoff
from archiver.archive.state import ItemRow, SpooledMark
from archiver.vocabulary import ItemStatus, Outcome

# The name it had before the rooms: log filters keep working.
log = logging.getLogger("archiver.pipeline")  # the stage's lines: one logger for the whole pipeline


class FetchStage(Stage):
    """Fetch workers: claim the pending item with the earliest deadline, stream it into the spool,
    and give it an outcome (spooled, too_large, source_gone, expired) or a retry gate."""

    def __init__(
        self, fetcher: Fetcher, parts: StageParts, *, skip_fetch: Callable[[ItemRow], bool] | None = None
    ) -> None:
        super().__init__(parts)
        self.fetcher = fetcher
        #: Several daemons may archive this session (replicas, resharding): asked before each fetch
        #: (`replicas.ArchiveCheck`); True means it took care of the item (archived by another
        #: daemon, or put back for this replica's head start): nothing is fetched now.
        self._skip_fetch = skip_fetch

    def run(self) -> None:
        """One fetch worker: earliest deadline first, until the pipeline stops."""
        while not self.wake.stop.is_set():
            generation = self.wake.snapshot(FETCH)
            idle = self.work_once()
            if idle is not None:
                self.wake.wait(generation, idle, FETCH)

    def work_once(self) -> float | None:
        """Fetch a batch of due items, earliest deadline first; None when some were taken, else how
        long to wait. Every exception is handled here, the worker's edge.

        The spooled marks of a batch share one commit (each spool file was fsynced before it is
        handed over, so the order fsync → commit holds), made at the latest `spooled_commit_after`
        after the first of them; nothing acts on an item before its commit.
        """
        items: list[ItemRow] = []
        spooled: list[tuple[ItemRow, Spooled, float]] = []
        taken = 0  # items of the batch handed to _fetch so far
        try:
            now, now_mono = self.clock(), self._mono()
            live = self.fetcher.live
            # Logs items waiting for their live capture are passed over, never claimed: no commit,
            # no attempt. The capture settling wakes this worker (`LiveCapture.on_settled`); the
            # nearest margin moment, or the idle wait, bounds the sleep.
            margins: list[float] = []

            def waiting(candidate: ItemRow) -> bool:
                if not waits_for_capture(candidate, live, candidate.deadline - now):
                    return False
                margins.append(candidate.deadline - LIVE_WAIT_MARGIN - now)
                return True

            items = self.state.claim_fetches(
                now_mono, self.tuning.fetch_batch, skip=waiting if live is not None else None
            )
            if not items:
                if not margins:
                    return self.wake.until(self.state.next_gate(ItemStatus.PENDING_FETCH))
                gate = self.wake.until(self.state.next_gate(ItemStatus.PENDING_FETCH, after=now_mono))
                return max(0.0, min(gate, *margins))
            first_spooled = 0.0
            for item in items:
                if self.wake.stop.is_set():
                    break
                taken += 1
                self._fetch(item, spooled)
                if spooled and not first_spooled:
                    first_spooled = self._mono()
                if spooled and self._mono() - first_spooled >= self.tuning.spooled_commit_after:
                    self._commit_spooled(spooled)
                    spooled, first_spooled = [], 0.0
        except Exception as exc:  # loop edge: count it, put the item back, keep the worker alive
            log.exception("fetch worker failed")
            self.metrics.error("fetch")
            if taken and not any(s[0].id == items[taken - 1].id for s in spooled):
                self._release(items[taken - 1], f"internal error: {type(exc).__name__}: {exc}")
            self.wake.stop.wait(1.0)
        finally:
            for item in items[taken:]:  # claimed, not attempted (stopping, or an error): pending again
                with contextlib.suppress(Exception):
                    self.state.unclaim_item(item.id, not_before=0.0)
            self._commit_spooled(spooled)
        return None

    def _fetch(self, item: ItemRow, spooled: list[tuple[ItemRow, Spooled, float]]) -> None:
        if self._skip_fetch is not None and self._skip_fetch(item):
            self.wake.notify()
            return
        remaining = item.deadline - self.clock()
        if remaining <= 0 and item.attempts > 1:
            self._expire(item, spooled, f"fetch deadline passed; last error: {item.last_error}")
            return
        result = self.fetcher.fetch(item, remaining=remaining)
        now = self.clock()
        if isinstance(result, Spooled):
            spooled.append((item, result, now))
        elif isinstance(result, Finished):
            log.info("item %s of %r: %s (%s)", item.kind, item.session_id, result.outcome, result.error)
            self.finish(item, result.outcome, error=result.error, source=result.source)
        else:
            self._retry_fetch(item, result, now, spooled)
        self._refresh_gauges()

    def _retry_fetch(
        self, item: ItemRow, result: Retry, now: float, spooled: list[tuple[ItemRow, Spooled, float]]
    ) -> None:
        left = item.deadline - now
        if left <= 0:
            self._expire(item, spooled, result.error, result.source)
            return
        if result.wait is not None:  # waiting, not failing: its capture began following after the claim
            log.debug("%s of %r waits: %s", item.kind, item.session_id, result.error)
            self.state.unclaim_item(item.id, not_before=self._mono() + result.wait)
            return
        if result.local:
            self.metrics.error("spool")
            log.error("spool write failed for %s of %r (retrying): %s", item.kind, item.session_id, result.error)
        else:
            log.warning("fetching %s of %r failed (retrying): %s", item.kind, item.session_id, result.error)
        # Wait less as the deadline nears, so the last tries still happen inside the window.
        delay = min(
            backoff(self.tuning.fetch_backoff_initial, self.tuning.fetch_backoff_max, item.attempts),
            max(0.5, left / 2),
        )
        self.state.retry_item(
            item.id,
            status=ItemStatus.PENDING_FETCH,
            not_before=self._mono() + delay,
            error=result.error,
            instance=item.instance,
        )

    def _expire(
        self, item: ItemRow, spooled: list[tuple[ItemRow, Spooled, float]], error: str, source: str | None = None
    ) -> None:
        """The deadline passed: logs with a live capture are archived from it, as if the read after
        the end (failing until now) had found nothing; anything else expires."""
        try:
            captured = self.fetcher.capture_instead(item) if item.kind == "logs" else None
        except OSError as exc:  # the spool disk: the capture stays on disk; tried again until it works
            self.metrics.error("spool")
            log.error("spool write failed for the live capture of %r (retrying): %s", item.session_id, exc)
            self._release(item, f"spool: {exc.strerror or exc}")
            return
        if captured is None:
            self.finish(item, Outcome.EXPIRED, error=error, source=source)
            return
        log.warning("logs of %r: reading them after the end failed until the deadline (%s); archiving the live "
                    "capture", item.session_id, error)  # fmt: skip
        spooled.append((item, captured, self.clock()))

    def _commit_spooled(self, spooled: list[tuple[ItemRow, Spooled, float]]) -> None:
        """One commit marks the batch's fetched items `spooled`; only then are they the upload stage's."""
        if not spooled:
            return
        try:
            self.fetcher.sync_spool()  # their names durable, once for the batch, before the commit
            self.state.mark_spooled_many(
                [
                    SpooledMark(
                        item.id, spool_path=str(r.path), size=r.size, sha256=r.sha256, content_type=r.content_type,
                        source=r.source, key=r.key, fetched_at=now, capture=r.capture, extras=tuple(r.extras),
                    )
                    for item, r, now in spooled
                ]
            )  # fmt: skip
        except Exception as exc:  # the worker's edge: fetched again later (their spool files are rewritten)
            log.exception("could not record %d fetched items; fetching them again", len(spooled))
            self.metrics.error("fetch")
            for item, _, _ in spooled:
                self._release(item, f"internal error: {type(exc).__name__}: {exc}")
            return
        for item, result, now in spooled:
            if item.kind == "logs" and self.fetcher.live is not None:
                self.fetcher.live.forget(item.session_key)  # the spool holds what was kept of it
            self.metrics.add_bytes("fetch", item.kind, result.received)
            self.metrics.fetch_completed(item.deadline - now)
        self.wake.notify(UPLOAD)

    def _release(self, item: ItemRow, error: str) -> None:
        with contextlib.suppress(Exception):
            delay = backoff(self.tuning.fetch_backoff_initial, self.tuning.fetch_backoff_max, item.attempts)
            self.state.retry_item(
                item.id, status=ItemStatus.PENDING_FETCH, not_before=self._mono() + delay, error=error,
                instance=item.instance,
            )  # fmt: skip
