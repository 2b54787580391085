"""The daemon's compaction loop: every replica of shard 0 compacts the last days' closed hours
at an interval (create-once parts named by what they cover make the replicas' repeats harmless)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from archiver.store.base import ObjectStore

log = logging.getLogger(__name__)

#: How far back each run looks: the open day, the day before (closed in the morning) and one more
#: for an outage of a day; older late entries wait for `archiver compact`.
LOOK_BACK = 2 * 86400.0


class IndexCompactor:
    """Runs :func:`~archiver.index.compact.compact` over ``LOOK_BACK`` every ``interval`` until stopped."""

    def __init__(
        self,
        opener: Callable[[], ObjectStore],
        *,
        interval: float,
        clock: Callable[[], float],
        on_error: Callable[[], None],
        first_delay: float = 0.0,
    ) -> None:
        self._opener = opener
        self._interval = interval
        self._clock = clock
        self._on_error = on_error
        self._first_delay = first_delay
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="index-compactor", daemon=True)
        #: Completed runs (tests wait on it).
        self.runs = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def run_once(self) -> None:
        """One compaction of the look-back window (errors propagate)."""
        # Imported here, on the compactor's thread: DuckDB's import must not slow the daemon's start.
        from archiver.index.compact import compact

        now = self._clock()
        store = self._opener()
        try:
            report = compact(store, since=now - LOOK_BACK, until=now, now=now, warn=log.warning)
        finally:
            store.close()
        if report.parts_written:
            log.info("index compacted", extra={"parts": len(report.parts_written), "entries": report.entries})
        self.runs += 1

    def _loop(self) -> None:
        if self._stop.wait(self._first_delay):
            return
        while True:
            try:
                self.run_once()
            except Exception:  # the thread's edge: counted, tried again next interval
                self._on_error()
                log.exception("index compaction failed")
            if self._stop.wait(self._interval):
                return
