"""How a benchmark learns that the pipeline archived its sessions without polling the state DB.

A poll loop in the measured process slows what it measures: a 5 ms poll of the state DB held the
GIL about 15 % as long as all upload workers together (sampled with py-spy --gil), and waiting on
every pipeline wake-up to recount the backlog cost the many-sessions case a query per item event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable


class ArchivedSignal(logging.Handler):
    """Set once the pipeline has logged every session of `ids` as archived (its INFO line)."""

    def __init__(self, ids: Iterable[str]) -> None:
        super().__init__(logging.INFO)
        self._waiting = set(ids)
        self._mutex = threading.Lock()
        self._done = threading.Event()
        if not self._waiting:
            self._done.set()
        self._logger = logging.getLogger("archiver.pipeline")
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if not (str(record.msg).startswith("session %r archived") and record.args):
            return
        with self._mutex:
            self._waiting.discard(str(record.args[0]))  # type: ignore[index]
            if not self._waiting:
                self._done.set()

    def wait(self, timeout: float) -> bool:
        """True once every session is archived; False when `timeout` seconds passed first."""
        return self._done.wait(timeout)

    def close(self) -> None:
        self._logger.removeHandler(self)
        super().close()
