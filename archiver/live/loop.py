"""The event loop's plumbing for live capture: a selector the poll can pause, and the room the
open-file limit leaves for follows.

The loop runs on its own thread beside the poller; Python's GIL means every stream it handles
while a poll runs lengthens the poll. `GatedSelector` lets the poller close a gate around its
cycle (`LiveCapture.paused`): the loop parks before its next look at the streams, whose bytes
wait in the kernel meanwhile, and catches up after (`benchmarks/follow.py` measures the poll
cycle both ways).
"""

from __future__ import annotations

import resource
import selectors
import threading
from collections.abc import Mapping
from typing import Any

#: Longest pause of the loop for one `paused()` block (a poll stuck longer lets followers run).
MAX_PAUSE = 5.0
#: Longest wait of `paused()` for the loop to park.
PARK_WAIT = 0.05
#: Ready streams handed to the loop per look (see `GatedSelector`).
EVENTS_PER_LOOK = 64
#: Open files the rest of the daemon may need besides the follows (state DB, spool, HTTP, S3).
OTHER_FILES = 512
#: Seals held open for their upload without an open-file limit (`seals_room`).
UNBOUNDED_SEALS = 1 << 20


def files_for(streams: int) -> int:
    """Open files a daemon following ``streams`` sessions needs: a socket and a capture file each,
    and OTHER_FILES for the rest (`files_to_raise` adds the seals)."""
    return 2 * streams + OTHER_FILES


def streams_room(streams: int, soft_limit: int) -> int:
    """How many of ``streams`` follows an open-file soft limit of ``soft_limit`` leaves room for
    (`files_for` each, and OTHER_FILES besides); all of them when there is no limit."""
    if soft_limit == resource.RLIM_INFINITY:
        return streams
    return max(0, min(streams, (soft_limit - OTHER_FILES) // 2))


def files_to_raise(streams: int) -> int:
    """What the entry point raises the open-file limit to for ``streams`` follows: their files
    (`files_for`), and one more each for a seal held for its upload (`seals_room`)."""
    return files_for(streams) + streams


def seals_room(streams: int, soft_limit: int) -> int:
    """How many seals a capture store may hold open for their upload (`seal.Unsynced`) beside
    ``streams`` follows under ``soft_limit``: what the follows (`files_for`) leave; one more is
    synced at once."""
    if soft_limit == resource.RLIM_INFINITY:
        return UNBOUNDED_SEALS
    return max(0, soft_limit - files_for(streams))


def open_file_limit() -> int:
    """This process's open-file soft limit, read only (raising it is the entry point's, never live
    capture's: it reaches every thread of the process)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class GatedSelector(selectors.BaseSelector):
    """The loop's selector (the platform's default inside): waits while the gate is closed (and
    says when it waits: `idle`), and hands the loop at most `EVENTS_PER_LOOK` ready streams at a
    time (the rest stay ready, level triggered, for the next look), so a closing gate is seen
    within a few milliseconds even when thousands of streams have bytes waiting after a pause."""

    def __init__(self, gate: threading.Event) -> None:
        self._inner = selectors.DefaultSelector()
        self._gate = gate
        #: Set while the loop runs no Python code (it waits here), for `LiveCapture.paused`.
        self.idle = threading.Event()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.idle.set()
        try:
            ready = self._inner.select(timeout)
        except BaseException:
            self.idle.clear()
            raise
        # Parked means parked: a gate closed at any moment up to here is honoured before any of
        # these streams is handled (they stay ready, level triggered, until the loop looks). A
        # gate closed longer than MAX_PAUSE (a stuck poll) is let go.
        while True:
            opened = self._gate.wait(MAX_PAUSE)
            self.idle.clear()
            if not opened or self._gate.is_set():
                break
            self.idle.set()
        return ready if len(ready) <= EVENTS_PER_LOOK else ready[:EVENTS_PER_LOOK]
