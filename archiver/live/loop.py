"""The event loop's plumbing for live capture: a selector the poll can pause, and the open-file limit.

The loop runs on its own thread beside the poller; Python's GIL means every stream it handles
while a poll runs lengthens the poll. `GatedSelector` lets the poller close a gate around its
cycle (`LiveCapture.paused`): the loop parks before its next look at the streams, whose bytes
wait in the kernel meanwhile, and catches up after (`benchmarks/follow.py` measures the poll
cycle both ways).
"""

from __future__ import annotations

import contextlib
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


def ensure_file_limit(streams: int) -> int:
    """Raise this process's open-file limit for ``streams`` follows (a socket and a capture file
    each, plus room for the rest of the daemon), as far as the hard limit allows; returns how
    many streams the limit leaves room for."""
    needed = 2 * streams + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return streams
    return max(0, min(streams, (soft - OTHER_FILES) // 2))


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
