"""What live capture tells the operator: a snapshot of its state, and one log line per kind of stream failure."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from archiver.live.policy import Ending
from archiver.textsafe import printable

log = logging.getLogger("archiver.live")

#: Upper bounds (seconds) of the buckets of the time from a session's first listing to its first
#: captured line (`archiver_live_first_byte_seconds`): a healthy service is well under a second.
FIRST_BYTE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 300.0)

#: Endings that are no failure: the stream ended with the container, or the follow was let go.
_NORMAL = frozenset({Ending.ENDED, Ending.UNWANTED})


@dataclass(frozen=True, slots=True)
class LiveStats:
    """One look at live capture (any thread may take it)."""

    #: Active sessions with a follow (streaming, connecting, or waiting to reopen).
    followed: int
    #: Follows of sessions no longer listed, waiting for their stream's end.
    draining: int
    #: Active sessions of the shard the cap left without a follow.
    unfollowed: int
    lines: int
    bytes: int
    #: Streams ended, by `policy.Ending`.
    ends: dict[str, int]
    #: Streams reopened, by how the one before ended (`policy.Ending`).
    reconnects: dict[str, int]
    #: Captures finished, by `policy.Finish`.
    finished: dict[str, int]
    #: Unexpected errors caught at the loop's edges.
    errors: int = 0
    #: Sessions by the time from their first listing to their first captured line: a count per
    #: bucket of `FIRST_BYTE_BUCKETS` and one past the last (not cumulative), and their sum.
    first_byte_counts: tuple[int, ...] = ()
    first_byte_sum: float = 0.0
    #: Bytes of running captures in the scratch (`archiver.live.scratch`), and spills out of it.
    scratch_bytes: int = 0
    scratch_spills: int = 0
    #: Seals named but not synced yet (`seal.Unsynced`).
    seals_unsynced: int = 0


def bucket_of(seconds: float) -> int:
    """The index of the `FIRST_BYTE_BUCKETS` bucket ``seconds`` falls in (len: past the last)."""
    return next((i for i, bound in enumerate(FIRST_BYTE_BUCKETS) if seconds <= bound), len(FIRST_BYTE_BUCKETS))


class FailureLog:
    """The first failure of each kind is logged when it happens; later ones of that kind are summed
    up at most every ``every`` seconds, so thousands of streams never log a line each. Only the
    session id and the HTTP status are shown: never a header, a body or the token."""

    def __init__(self, every: float = 60.0) -> None:
        self._every = every
        self._seen: set[Ending] = set()
        self._since: Counter[Ending] = Counter()
        self._last_summary: float | None = None

    def failed(self, ending: Ending, session_id: str, status: int | None, now: float) -> None:
        if ending in _NORMAL:
            return
        if ending not in self._seen:
            self._seen.add(ending)
            status_text = f", HTTP {status}" if status is not None and status != 200 else ""
            log.warning(
                "live capture: a follow stream ended: %s%s (session %s); it is reopened with backoff, "
                "and further %s endings are summed up every %.0fs",
                ending.value, status_text, printable(session_id[:80]), ending.value, self._every,
            )  # fmt: skip
            self._last_summary = self._last_summary if self._last_summary is not None else now
            return
        self._since[ending] += 1

    def summarize(self, now: float) -> None:
        """Log the failures counted since the last summary, if ``every`` seconds have passed."""
        if not self._since or (self._last_summary is not None and now - self._last_summary < self._every):
            return
        text = ", ".join(f"{count} {ending.value}" for ending, count in sorted(self._since.items()))
        log.warning("live capture: follow streams ended in the last %.0fs: %s", self._every, text)
        self._since.clear()
        self._last_summary = now
