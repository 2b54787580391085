"""A capture's segments as plain data: the checkpointed row, the segment being written, where its
files are named, and what a lines file holds after a checkpoint (`scan`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from archiver.live.resume import Kept

#: A segment still being followed (the others are `policy.Finish` values).
FOLLOWING = "following"
#: Bytes read at once from a lines file or a seal.
READ_BLOCK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sealed:
    """A finished segment's lines as the stored log object: the gzip file's size and SHA-256."""

    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One segment as checkpointed: for readers (the archive step) and for resuming a follow."""

    key: str
    index: int
    session_id: str
    created_ms: int
    shape: str | None
    kept: Kept
    state: str
    #: Its lines file: in the scratch or the captures directory (`scratch`).
    path: Path
    #: The captures directory, where its seal goes (never the scratch: a seal is the durable copy).
    home: Path
    #: The seal of a finished segment (None: still followed, not sealed yet, or nothing to seal).
    sealed: Sealed | None = None


class Segment:
    """A segment being written (owned by the event loop thread): the file's fd and what it holds."""

    __slots__ = (
        "changed", "created_ms", "dirty", "fd", "home", "index", "kept", "key", "path", "recorded", "session_id",
        "shape", "state",
    )  # fmt: skip

    def __init__(self, row: SegmentRow, fd: int | None, recorded: float | None = None) -> None:
        self.key = row.key
        self.index = row.index
        self.session_id = row.session_id
        self.created_ms = row.created_ms
        self.shape = row.shape
        self.kept = row.kept
        self.state = row.state
        self.path = row.path
        self.home = row.home
        self.fd = fd
        self.dirty = False
        #: More than new lines changed (begun, reopened, shape told, finished): in the next checkpoint.
        self.changed = False
        #: When a checkpoint last took its row (store clock; None: its row was never taken).
        self.recorded = recorded

    def row(self) -> SegmentRow:
        return SegmentRow(
            self.key, self.index, self.session_id, self.created_ms, self.shape, self.kept, self.state, self.path,
            self.home,
        )  # fmt: skip


def scan(path: Path, kept: Kept) -> Kept:
    """``kept`` extended by the complete lines the file holds after ``kept.size`` bytes; a torn last
    line (no newline) is cut off the file."""
    with open(path, "r+b") as f:
        f.seek(kept.size)
        pending = b""
        lines = kept
        while block := f.read(READ_BLOCK):
            *complete, pending = (pending + block).split(b"\n")
            lines = lines.after(complete)
        if pending:
            f.truncate(lines.size)
    return lines


def segment_file_name(key: str, index: int) -> str:
    """The name of a segment's lines file in the captures directory: fixed length whatever the id."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{digest}.{index}.log"


def sealed_path(row: SegmentRow) -> Path:
    """Where a finished segment's seal is: named by its line count too, so a name never changes
    content (a segment followed again and finished anew gets a seal of its own)."""
    return row.home / f"{row.path.name.removesuffix('.log')}.{row.kept.lines}.gz"
