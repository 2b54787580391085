"""Recognising what a capture already holds when a follow stream replays a log from its first line.

A capture is identified by a chain digest over its lines: ``chain(n) = BLAKE2b-128(chain(n-1) ||
line n)``, starting from 16 zero bytes. The checkpoint keeps (lines, bytes, chain); a replay is
hashed the same way, and once it has given as many lines as the capture holds, its chain must
equal the kept one: then every further line is new. A replay whose first lines chain differently,
or that ends before reaching the kept count, is a different log (the service rotated or truncated
it): the caller keeps both, never merges them. The chain extends line by line, so a capture
resumed after a crash continues its chain from the checkpoint alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

CHAIN_START = bytes(16)
_DIGEST_SIZE = 16


def extend(chain: bytes, lines: Iterable[bytes]) -> bytes:
    """The chain after ``lines`` (each without its newline) follow the lines ``chain`` covers."""
    blake2b = hashlib.blake2b
    for line in lines:
        chain = blake2b(chain + line, digest_size=_DIGEST_SIZE).digest()
    return chain


@dataclass(frozen=True, slots=True)
class Kept:
    """What a capture holds: its line count, its size in bytes (lines plus newlines), its chain."""

    lines: int = 0
    size: int = 0
    chain: bytes = CHAIN_START

    def after(self, lines: Sequence[bytes]) -> Kept:
        """This capture with ``lines`` appended."""
        if not lines:
            return self
        size = sum(map(len, lines)) + len(lines)
        return Kept(self.lines + len(lines), self.size + size, extend(self.chain, lines))


class Verdict(StrEnum):
    """Where a replay stands against the kept capture."""

    CHECKING = "checking"  # still inside the kept prefix: nothing to append yet
    APPENDING = "appending"  # the kept prefix matched: every further line is new
    DIVERGED = "diverged"  # the replay is not the kept log: keep both


@dataclass(frozen=True, slots=True)
class Progress:
    """A replay's progress through the kept prefix: lines seen and their chain."""

    seen: int = 0
    chain: bytes = CHAIN_START
    verdict: Verdict = Verdict.CHECKING


def start(kept: Kept) -> Progress:
    """A fresh connection's progress: with nothing kept, every line is new from the start."""
    return Progress(verdict=Verdict.APPENDING if kept.lines == 0 else Verdict.CHECKING)


def replay(kept: Kept, progress: Progress, lines: Sequence[bytes]) -> tuple[Progress, Sequence[bytes]]:
    """Take the next ``lines`` of a replay: the new progress and the lines to append (none while
    the kept prefix is still being replayed, none once it diverged)."""
    if progress.verdict is Verdict.APPENDING:
        return progress, lines
    if progress.verdict is Verdict.DIVERGED or not lines:
        return progress, ()
    need = kept.lines - progress.seen
    head = lines[:need]
    chain = extend(progress.chain, head)
    seen = progress.seen + len(head)
    if seen < kept.lines:
        return Progress(seen, chain, Verdict.CHECKING), ()
    if chain != kept.chain:
        return Progress(seen, chain, Verdict.DIVERGED), ()
    return Progress(seen, chain, Verdict.APPENDING), lines[need:]


def ended(kept: Kept, progress: Progress) -> Progress:
    """The body ended properly: a replay still short of the kept prefix is a shorter, different log."""
    if progress.verdict is Verdict.CHECKING and progress.seen < kept.lines:
        return Progress(progress.seen, progress.chain, Verdict.DIVERGED)
    return progress
