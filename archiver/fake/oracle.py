"""The fake service's ground truth for chaos runs: every session it ended and the sha256 of every log and
artifact body it served, recorded at the moment it happened (independent of anything the archiver wrote)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

#: ``Served.what`` of a log body (``GET /query/log`` or ``GET /logs``); artifacts use their path.
LOGS = "logs"


@dataclass(frozen=True, slots=True)
class ServedAs:
    """What a response body is: which organisation's session, and ``LOGS`` or the artifact path."""

    org: str
    session_id: str
    what: str


@dataclass(frozen=True, slots=True)
class Served:
    """One body served: sha256 and size of the bytes produced, and whether all of them went out
    (False: truncated by a fault, the connection broke, or the service stopped)."""

    org: str
    session_id: str
    what: str
    sha256: str
    size: int
    complete: bool


@dataclass(frozen=True, slots=True)
class Ended:
    """A session the service ended (its container exited or died), with when."""

    org: str
    session_id: str
    created: float
    ended_at: float
    status: str


class Oracle:
    """Append-only records of ends and served bodies. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: list[Ended] = []
        self._served: list[Served] = []

    def session_ended(self, org: str, session_id: str, created: float, ended_at: float, status: str) -> None:
        with self._lock:
            self._ended.append(Ended(org, session_id, created, ended_at, status))

    def body_served(self, served_as: ServedAs, sha256: str, size: int, *, complete: bool) -> None:
        with self._lock:
            self._served.append(Served(served_as.org, served_as.session_id, served_as.what, sha256, size, complete))

    def ended(self) -> list[Ended]:
        """Every session ended so far, in order."""
        with self._lock:
            return list(self._ended)

    def served(self) -> list[Served]:
        """Every body served so far (complete or not), in order."""
        with self._lock:
            return list(self._served)

    def complete_digests(self, org: str, session_id: str, what: str) -> set[str]:
        """sha256 of every complete body served for this session and ``what`` (LOGS or a path)."""
        with self._lock:
            return {
                s.sha256
                for s in self._served
                if s.complete and s.org == org and s.session_id == session_id and s.what == what
            }


class Tally:
    """sha256 and size of a body as the server produces it (see `counted`)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.size = 0

    def add(self, data: bytes) -> None:
        self._digest.update(data)
        self.size += len(data)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


def counted(chunks: Iterator[bytes], tally: Tally) -> Iterator[bytes]:
    """``chunks`` unchanged, each added to ``tally`` as the writer takes it."""
    for chunk in chunks:
        tally.add(chunk)
        yield chunk
