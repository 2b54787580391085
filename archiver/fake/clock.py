"""The fake service's virtual clock: epoch seconds that run at a chosen speed and can jump forward."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class FakeClock:
    """Virtual wall clock: ``now()`` advances ``time_scale`` virtual seconds per real second.

    ``advance(seconds)`` jumps forward at once, so a test can step over the 4-hour retention
    window instantly; ``time_scale=0`` freezes the clock (only ``advance`` moves it), and e.g.
    240 makes 4 virtual hours pass in one real minute. Thread-safe.
    """

    def __init__(
        self,
        start: float | None = None,
        *,
        time_scale: float = 1.0,
        real_time: Callable[[], float] = time.monotonic,
    ) -> None:
        if time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self._real_time = real_time
        self._lock = threading.Lock()
        self._scale = float(time_scale)
        # Virtual time is anchored to one (virtual, real) pair; rebased whenever the scale changes.
        self._anchor_virtual = time.time() if start is None else float(start)
        self._anchor_real = real_time()

    def now(self) -> float:
        """Current virtual time, epoch seconds."""
        with self._lock:
            return self._now_locked()

    def _now_locked(self) -> float:
        return self._anchor_virtual + (self._real_time() - self._anchor_real) * self._scale

    def advance(self, seconds: float) -> float:
        """Jump ``seconds`` (>= 0) forward; returns the new virtual time."""
        if seconds < 0:
            raise ValueError(f"the clock only moves forward, got {seconds}")
        with self._lock:
            self._anchor_virtual += seconds
            return self._now_locked()

    @property
    def time_scale(self) -> float:
        """Virtual seconds per real second (0 = frozen)."""
        return self._scale

    @time_scale.setter
    def time_scale(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"time_scale must be >= 0, got {value}")
        with self._lock:
            self._anchor_virtual = self._now_locked()
            self._anchor_real = self._real_time()
            self._scale = float(value)
