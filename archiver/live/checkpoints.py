"""The captures' checkpoint job: what the segments changed, recorded every `Tuning.checkpoint_interval`
(or soon after a finish) on a helper thread, which waits while a poll runs; a failed one is kept
for the next."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from archiver.live.follow import Counters
from archiver.live.loop import MAX_PAUSE
from archiver.live.policy import Tuning
from archiver.live.segment import SegmentRow
from archiver.live.store import CaptureStore

log = logging.getLogger("archiver.live")

T = TypeVar("T")

#: Seconds between the checkpoints that settle seals held for their upload (`seal.Unsynced`).
SEAL_LOOK = 1.0


class Checkpoints:
    """Runs on the capture's event loop (`run`, `once`); the store's writes on its own thread,
    which housekeeping (`in_background`) shares."""

    def __init__(self, store: CaptureStore, tuning: Tuning, gate: threading.Event, counters: Counters) -> None:
        self.store = store
        self.tuning = tuning
        self._gate = gate
        self._counters = counters
        self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="live-checkpoint")
        self._unsaved: dict[tuple[str, int], SegmentRow] = {}
        self._soon: asyncio.Event | None = None

    def soon(self) -> None:
        """Ask for a checkpoint soon (a capture finished): finishes close together share it."""
        if self._soon is not None:
            self._soon.set()

    async def run(self, saved: Callable[[list[SegmentRow]], None]) -> None:
        """The job: checkpoint every interval or soon after `soon`; ``saved`` gets each one's rows."""
        self._soon = asyncio.Event()
        while True:
            every = self.tuning.checkpoint_interval
            if self.store.seals_unsynced():  # each synced within a second of its due time, or let go
                every = min(every, SEAL_LOOK)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._soon.wait()
                await asyncio.sleep(min(0.2, self.tuning.checkpoint_interval))
            self._soon.clear()
            rows = await self.once()
            if rows:
                saved(rows)

    async def once(self) -> list[SegmentRow] | None:
        """One checkpoint now: the rows it recorded (None: nothing, or it failed and they wait)."""
        for row in self.store.pending(self.tuning.progress_interval):
            self._unsaved[(row.key, row.index)] = row
        if not self._unsaved and not self.store.removals_pending() and not self.store.seals_unsynced():
            return None
        rows = list(self._unsaved.values())
        self._unsaved.clear()
        try:
            await self.in_background(lambda: self._save(rows))
        except Exception:  # the checkpoint's edge: kept for the next one (disk full, I/O error); counted
            self._counters.errors += 1
            log.exception("live capture: checkpoint failed; retrying at the next one")
            for row in rows:
                self._unsaved.setdefault((row.key, row.index), row)
            return None
        return rows

    async def in_background(self, job: Callable[[], T]) -> T:
        """``job`` on the checkpoint thread (store housekeeping: one writer at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self._saver, job)

    def _save(self, rows: list[SegmentRow]) -> None:
        if not self._gate.is_set():  # like the loop, the store's writes wait while a poll runs
            self._gate.wait(MAX_PAUSE)
        self.store.checkpoint(rows)

    def shutdown(self) -> None:
        self._saver.shutdown(wait=True)
