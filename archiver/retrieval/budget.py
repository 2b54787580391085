"""How long one search may run and how many bytes it may read, and the meter its threads share to stop there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: What a search says when it stopped at its budget (the CLI's stderr line, the browser's status).
STOPPED = "stopped after budget"


@dataclass(frozen=True, slots=True)
class SearchBudget:
    """A search's limits: seconds from its start and decompressed bytes read; 0 means no limit."""

    seconds: float = 0.0
    bytes: int = 0


#: No limit at all (a search runs to its end, or until its reader leaves).
UNLIMITED = SearchBudget()


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.0f} MB" if count >= 10**6 else f"{count / 1e6:.1f} MB"


def over_budget(budget: SearchBudget, elapsed: float, read: int) -> str | None:
    """What a search that stopped says (how far it went), once ``elapsed`` seconds or ``read`` bytes
    passed its budget; else None. Each front end adds how to narrow the search in its own terms."""
    if not (budget.seconds and elapsed >= budget.seconds) and not (budget.bytes and read >= budget.bytes):
        return None
    return f"{STOPPED}: {elapsed:.0f} s / {_megabytes(read)} read"


class SearchMeter:
    """Bytes read and time spent by the threads of one search, against its budget; thread-safe.

    ``spent()`` turns true, and stays so, once the budget is passed (``reason`` says how) or
    ``stop()`` was called or ``cancel`` set (the reader left, an interrupt: ``reason`` stays None).
    """

    def __init__(
        self,
        budget: SearchBudget = UNLIMITED,
        *,
        cancel: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.read = 0
        self.reason: str | None = None
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._cancel = cancel  # the caller's: read, never set here

    def add(self, count: int) -> None:
        """``count`` more bytes read."""
        with self._lock:
            self.read += count

    def stop(self) -> None:
        """Stop the search (not for its budget)."""
        self._stopped.set()

    def spent(self) -> bool:
        """Whether the search must stop now: stopped, or its budget passed (then ``reason`` is set)."""
        if self._stopped.is_set() or (self._cancel is not None and self._cancel.is_set()):
            return True
        if self.budget == UNLIMITED:
            return False
        reason = over_budget(self.budget, self._clock() - self._started, self.read)
        if reason is None:
            return False
        with self._lock:
            if not self._stopped.is_set():
                self.reason = reason
                self._stopped.set()
        return True
